"""Every `fl-lightning reproduce <paper> --scale paper`, every row, one round, on tiny data in
each dataset's real on-disk format (`paper_fixtures.py`: foolbox's real CIFAR and ImageNet
images, the real Fashion-MNIST) with stand-in weights files at the places the scales pin
(a tiny open_clip model for CLIP, a random torchvision ResNet-18, a 1-layer BERT folder):
the scales' own overrides, presets, models, text encoders and weight-loading paths all run,
and each reproduction ends with a report. Only the size is cut, by overrides after the scale's
(rounds, clients, subsets, image size, the CLIP architecture of the stand-in file), and CReFF's
server work (its federated features: the method defaults in a copy of conf/, as any user may
set them; every row keeps its own overrides). And with
the data or a weights file absent, each scale stops before any data loads with one line
naming every missing piece and where it goes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from fl_lightning.cli.main import main
from fl_lightning.tracking.reproduce import load_spec, read_run

from .paper_fixtures import TINY_CLIP_ARCH, build_root

ROOT = Path(__file__).resolve().parents[1]

#: what makes each reproduction tiny (applied after the scale's and the rows' overrides)
COMMON = ["runtime=serial", "logger=none", "fl.rounds=1", "fl.local_epochs=1", "eval.batch_size=64"]


def small(paper: str, root: Path) -> list[str]:
    clip = f"text.arch={root / 'weights' / (TINY_CLIP_ARCH + '.json')}"  # the stand-in file's architecture
    return {
        "clip2fl": [clip, "fl.num_clients=3", "fl.clients_per_round=2", "fl.batch_size=8", "data.min_size=1"],
        "feddtr": ["fl.num_clients=3", "data.min_size=2"],
        "fedglcl": [clip, "data.train_subset=40", "data.test_subset=20", "model.hidden=64",
                    "fl.batch_size=64", "data.min_size=2"],  # one batch a client: BatchNorm sees >= 2
        "fedlgt": [clip, "data.image_size=32", "fl.num_clients=3", "fl.clients_per_round=null",
                   "fl.batch_size=8"],
        "fedtsp": ["fl.num_clients=3", "data.min_size=2", "data.train_subset=45"],
        "adapters": ["fl.batch_size=16", "model.max_length=32"],
        # 3 clients, 2 a round: δ below 1/3, Poisson cohorts of 2 expected
        "dp_fedavg": ["fl.num_clients=3", "fl.clients_per_round=2", "data.min_size=2", "privacy.delta=0.01"],
        # the real Fashion-MNIST cut to 40 images over 3 clients, Poisson cohorts of 2 expected
        "dp_fedavg_frozen": ["fl.num_clients=3", "fl.clients_per_round=2", "data.train_subset=40",
                             "data.test_subset=20", "privacy.delta=0.01"],
        **dict.fromkeys(("fedotp", "fedpgp"), [f"model.arch={root / 'weights' / (TINY_CLIP_ARCH + '.json')}",
                                               "fl.num_clients=3", "data.min_size=2"]),
        # 48 images (8 shots of 6 classes) over the scale's 10 clients (Dirichlet 0.1)
        "promptfl": [f"model.arch={root / 'weights' / (TINY_CLIP_ARCH + '.json')}", "data.min_size=1",
                     "data.image_size=32"],
        # 3 clients, 2 in flight and a step on each arrival; FedAsync's every-100th-step evaluation
        # at its one step
        "fedbuff": ["fl.num_clients=3", "fl.clients_per_round=2", "system.concurrency=2", "system.buffer=1",
                    "data.min_size=2", "eval.every=1"],
        # the nine datasets in one run: Caltech101's 3 base classes in blocks of 2 (round(3/2) = 2
        # clients) and the other eight's 2 in one block each: 10 clients
        "fedtpg": [f"model.arch={root / 'weights' / (TINY_CLIP_ARCH + '.json')}", "data.classes_per_client=2",
                   "data.image_size=32", "fl.num_clients=10"],
    }[paper]  # fmt: skip


#: per-row image sizes of the scales cut: AlexNet-BN's 256 px to the smallest it takes, the
#: CIFAR-100 ResNet-50 rows' 32 px (a CIFAR stem: no downsampling before its stages) to 16
SMALL_IMAGES = {
    "reproduce/fedglcl.yaml": [("data.image_size=256", "data.image_size=64"),
                               ("data.alpha=0.5,", "data.alpha=0.5, data.image_size=16,")],
    "data/office_caltech.yaml": [("image_size: 256", "image_size: 64")],
}  # fmt: skip
#: CReFF's (and so CLIP2FL's) server-side feature matching and re-training, made small
CREFF_SMALL = "num_features: 4\nmatch_steps: 2\nretrain_epochs: 2\ngrad_repeats: 1\ngrad_batch: 8\n"


@pytest.fixture(scope="module")
def paper_root(tmp_path_factory, data_root) -> Path:
    return build_root(tmp_path_factory.mktemp("paper") / "data", data_root)


@pytest.fixture
def small_conf(tmp_path, monkeypatch) -> Path:
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    for method in ("creff", "clip2fl"):
        path = conf / "method" / f"{method}.yaml"
        path.write_text(path.read_text().replace(f"name: {method}\n", f"name: {method}\n{CREFF_SMALL}", 1))
    for name, edits in SMALL_IMAGES.items():
        text = (conf / name).read_text()
        for old, new in edits:
            assert old in text, (name, old)
            text = text.replace(old, new)
        (conf / name).write_text(text)
    monkeypatch.setenv("FL_LIGHTNING_CONF", str(conf))
    return conf


#: The rows each suite run trains for its round: every method, model, dataset and text encoder
#: of the scale at least once, and a claim between two of them (kept so by
#: `test_the_rows_run_cover_every_setting` when a row is added). The other rows differ from these
#: in method keys only (a switch, a weight); each is composed and its files checked by
#: `test_paper_scales_name_what_is_missing`. FL_LIGHTNING_PAPER_ROWS=all runs every row (47 runs,
#: ~9 min on 2 busy cores).
SUITE_ROWS = {
    "clip2fl": ["fedavg", "creff", "clip2fl"],
    "feddtr": ["feddtr", "no_text", "fedper", "fedrep", "fedala"],
    # fedglcl's DomainNet pair: a claim on domain_avg_accuracy, checked measured
    "fedglcl": [
        "fedavg_c2",
        "text_c2",
        "text_d03",
        "text_c100",
        "text_office",
        "fedavg_domainnet",
        "text_domainnet",
    ],
    "fedlgt": ["fedavg", "fedctran", "centralized", "fedlgt", "fedavg_voc", "fedlgt_coco"],
    "fedtsp": ["local", "fedtsp", "fedproto", "fedtgp"],
    "fedotp": ["zeroshot", "promptfl", "fedotp"],
    "fedpgp": ["zeroshot", "promptfl", "fedotp", "fedpgp"],
    "fedtpg": ["zeroshot", "fedcoop", "fedtpg"],
    "promptfl": ["zeroshot", "promptfl", "central"],
    "dp_fedavg": ["eps2", "eps2_adaptive", "no_dp"],
    "fedbuff": ["fedavg", "fedbuff", "fedasync"],
    "adapters": ["fedit", "ffa_lora", "flora"],
    "dp_fedavg_frozen": ["eps4", "eps4_adaptive"],
}
#: what makes two rows different settings rather than one setting with other method keys
SETTING_KEYS = ("method", "model", "data", "+experiment", "text", "text.arch", "data.partition")


def _setting(row, scale) -> set[tuple[str, str | None]]:
    given = dict(a.partition("=")[::2] for a in row.args(scale))
    return {(k, given.get(k)) for k in SETTING_KEYS}


def test_the_rows_run_cover_every_setting():
    for paper, rows in SUITE_ROWS.items():
        spec = load_spec(ROOT / "conf" / "reproduce" / f"{paper}.yaml")
        scale = spec.scales["paper"]
        every = set().union(*(_setting(r, scale) for r in spec.run_rows("paper")))
        run = set().union(*(_setting(spec.rows[r], scale) for r in rows))
        assert every == run, (paper, every - run)
        assert any(c.row in rows and c.baseline in rows for c in spec.claims_for("paper")), paper


def test_every_paper_row_places_its_clients_on_one_gpu():
    """A paper scale's row on a workstation with one GPU (16 CPUs): its clients find workers
    (`runtime=gpu` pinned `placement: per_client` until the H100 check of 2026-11-27, and
    FedDTR's 20 and FedLGT's 1,000 clients asked for one GPU each); the suite trains the rows
    serially, so only this sees their placement."""
    from fl_lightning.config import compose
    from fl_lightning.runtime.placement import placement_for

    placed = 0
    for path in sorted((ROOT / "conf" / "reproduce").glob("*.yaml")):
        spec = load_spec(path)
        if "paper" not in spec.scales:
            continue
        for row in spec.run_rows("paper"):
            args = row.args(spec.scales["paper"], "/tmp/out")
            if not any(a.startswith("runtime=") for a in args):
                continue  # the default runtime=ray places with `auto`, as runtime=gpu does now
            cfg = compose(args)
            if cfg.runtime.executor == "ray":
                p = placement_for(cfg, 16.0, 1.0)
                assert 1 <= p.num_actors <= 16 and len(p.assignment) == cfg.fl.num_clients, (path.stem, row)
                placed += 1
    assert placed >= 20  # FedDTR's and FedLGT's rows at least


def _trim(conf: Path, paper: str) -> None:
    """The claims file in the test's copy of conf/ with only the suite's rows (and the claims
    between them), unless FL_LIGHTNING_PAPER_ROWS=all."""
    if os.environ.get("FL_LIGHTNING_PAPER_ROWS") == "all":
        return
    path = conf / "reproduce" / f"{paper}.yaml"
    doc = yaml.safe_load(path.read_text())
    keep = set(SUITE_ROWS[paper]) | {
        r for r, v in doc["rows"].items() if "paper" not in v.get("scales", ["paper"])
    }
    doc["rows"] = {r: v for r, v in doc["rows"].items() if r in keep}
    doc["claims"] = [c for c in doc["claims"] if c["row"] in keep and c["baseline"] in keep]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _reproduce(paper: str, root: Path, out: Path, conf: Path) -> dict:
    _trim(conf, paper)
    args = ["reproduce", paper, "--scale", "paper", "--seeds", "0", "--out", str(out), f"data.root={root}"]
    assert main([*args, *COMMON, *small(paper, root)]) == 0
    spec = load_spec(conf / "reproduce" / f"{paper}.yaml")
    runs = out / f"{paper}_paper"
    for row in spec.run_rows("paper"):  # every row finished its round, on the pinned files
        state = read_run(runs / f"{row.id}_s0")
        assert state.status == "completed", (row.id, state.status)
        cfg = yaml.safe_load((runs / f"{row.id}_s0" / "config.yaml").read_text())
        for key in spec.scales["paper"].requires:
            section, name = key.split(".", 1)
            assert str(cfg[section][name]).startswith(str(root / "weights")), (row.id, key)
    report = (out / "report.md").read_text()
    numbers = json.loads((out / "results.json").read_text())
    for row in spec.rows_for("paper"):
        assert row.label in report
        metric = spec.table_metrics("paper")[0]
        assert set(numbers["rows"][row.id][metric]["final"]) == {"0"}, row.id  # a value from its run
    assert {c["id"] for c in numbers["claims"]} == {c.id for c in spec.claims_for("paper")}
    # each claim's metric measured by both its rows' runs (a long-tail group's, few_/many_/...,
    # only where the fixture's label counts put a class in that group)
    for c in spec.claims_for("paper"):
        if c.metric.split("_", 1)[0] in ("many", "medium", "few"):
            continue
        for row in (c.row, c.baseline):
            assert set(numbers["rows"][row][c.metric]["final"]) == {"0"}, (c.id, row, c.metric)
    return numbers


@pytest.mark.slow
@pytest.mark.parametrize("paper", list(SUITE_ROWS))
def test_paper_scale_runs_its_rows(paper, paper_root, small_conf, tmp_path):
    _reproduce(paper, paper_root, tmp_path / "rep", small_conf)


#: what each scale's datasets are called when missing
DATASETS = {
    "clip2fl": ["CIFAR-10 not found"],
    "feddtr": ["CIFAR-10 not found"],
    "fedglcl": [
        "Fashion-MNIST not found",
        "CIFAR-100 not found",
        "Office-Caltech-10 not found",
        "DomainNet (10-class subset) not found",
    ],
    "fedlgt": ["FLAIR not found", "PASCAL VOC 2007 not found", "MS-COCO not found"],
    "fedtsp": ["CIFAR-100 not found"],
    "fedotp": ["CIFAR-100 not found"],
    "fedpgp": ["CIFAR-100 not found"],
    "fedtpg": [
        "Caltech101 not found",
        "Flowers102 not found",
        "FGVCAircraft not found",
        "UCF101 not found",
        "OxfordPets not found",
        "Food101 not found",
        "DTD not found",
        "StanfordCars not found",
        "SUN397 not found",
    ],
    "promptfl": ["Caltech101 not found"],
    "dp_fedavg": ["CIFAR-10 not found"],
    "fedbuff": ["CIFAR-10 not found"],
    "adapters": ["SST-2 (GLUE) not found"],
    "dp_fedavg_frozen": ["Fashion-MNIST not found"],
}


@pytest.mark.slow
def test_paper_scales_name_what_is_missing(paper_root, tmp_path, capsys):
    """No data at all: every dataset and weights file of the scale, each once, in one line.
    Data but no weights (CLIP2FL): only the weights."""
    empty = tmp_path / "empty"
    empty.mkdir()
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    for entry in paper_root.iterdir():
        if entry.name != "weights":
            os.symlink(entry, no_weights / entry.name)
    for paper, root in [(p, empty) for p in DATASETS] + [("clip2fl", no_weights)]:
        spec = load_spec(ROOT / "conf" / "reproduce" / f"{paper}.yaml")
        out = tmp_path / paper
        # one seed: what a run needs is its row's (a seed changes no dataset or weights file), and
        # each of the scale's seeds would compose every row again
        rc = main(
            ["reproduce", paper, "--scale", "paper", "--seeds", "0", "--out", str(out), f"data.root={root}"]
        )
        err = capsys.readouterr().err.strip()
        assert rc != 0 and "\n" not in err, err
        assert err.startswith(f"fl-lightning: error: {paper} --scale paper cannot start: "), err
        for what in spec.scales["paper"].requires.values():  # each weights file, where it goes
            assert err.count(what) == 1 and str(root / "weights") in err, (paper, err)
        for name in DATASETS[paper]:
            assert err.count(name) == (root == empty), (paper, name, err)  # only when absent
        assert not out.exists()  # nothing written, nothing loaded


def test_size_sampling_draws_clients_in_proportion_to_their_data():
    """fl.sampling=size (FedLGT's FLAIR protocol): one client a round, drawn 4,000 times, comes
    up in proportion to its share of the data (within 5 binomial standard deviations); with
    no weights the draw is the uniform one it always was."""
    import numpy as np

    from fl_lightning.methods import METHODS

    cls = METHODS.get("fedavg")
    strategy = cls(cls.config_cls(), 4, 1, 0)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    strategy.sample_weights = p
    rng = np.random.default_rng(0)
    n = 4_000
    counts = np.bincount([strategy.sample_clients(r, rng)[0] for r in range(n)], minlength=4)
    assert np.all(np.abs(counts - n * p) < 5 * np.sqrt(n * p * (1 - p))), counts
    strategy.sample_weights = None
    uniform = sorted(int(c) for c in np.random.default_rng(1).choice(4, size=1, replace=False))
    assert strategy.sample_clients(0, np.random.default_rng(1)) == uniform
