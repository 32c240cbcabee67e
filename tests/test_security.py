"""An untrusted run directory or data root cannot run code or touch files outside it, and
every bad value is one line (exit 2) before any work starts."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_lightning.cli.main import main
from fl_lightning.config import load_run_config
from fl_lightning.core.errors import CheckpointError, ConfigError
from fl_lightning.core.messages import Broadcast, ServerState
from fl_lightning.core.strategy import MethodConfig, Strategy
from fl_lightning.data.registry import DATASETS

from .conftest import WIDE, small, stderr_lines

# tiny, so that code which wrongly accepts a value (the old code) ends soon
QUICK = [
    "runtime=serial", "logger=none", "data.train_subset=200", "data.test_subset=100",
    "fl.num_clients=2", "fl.rounds=1",
]  # fmt: skip
#: tiny and quick for a test that must train to reach what it tests (a checkpoint): 2 clients
#: of 200 images; a checkpoint's size is the model's, not the data's
TINY = ["data.train_subset=400", "data.test_subset=100", "fl.num_clients=2"]


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = stderr_lines(err)
    assert len(lines) == 1 and lines[0].startswith("fl-lightning: error: "), err
    assert "Traceback" not in err
    return lines[0] + "\n"


def _written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# --- 1. pickles in a data root run no code ----------------------------------------------
class _Hostile:
    """Unpickled by plain `pickle.load`, this opens (creates) the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.marker), "w")


def _cifar10_root(root: Path, per_batch: int = 4) -> Path:
    """A tiny CIFAR-10 in the official layout: pickled dicts of uint8 `data` rows (N x 3072)
    and `labels` lists, five training batches, a test batch and batches.meta."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, per_batch)],
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"filenames": [f"img_{i}.png".encode() for i in range(per_batch)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {b"label_names": [b"airplane"] * 10, b"num_cases_per_batch": per_batch, b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return folder


def test_cifar_batches_load_and_a_hostile_pickle_runs_nothing(tmp_path, capsys):
    folder = _cifar10_root(tmp_path / "data")
    ds = DATASETS.get("cifar10").load(str(tmp_path / "data"))
    assert ds.train_x.shape == (20, 3, 32, 32) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (4, 3, 32, 32) and len(ds.train_y) == 20

    marker = tmp_path / "pwned"
    (folder / "data_batch_3").write_bytes(pickle.dumps(_Hostile(marker), protocol=2))
    with pytest.raises(ConfigError) as e:
        DATASETS.get("cifar10").load(str(tmp_path / "data"))
    assert "data_batch_3" in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()

    out = tmp_path / "out"
    args = ["run", "data=cifar10", f"data.root={tmp_path / 'data'}", *QUICK, f"output_dir={out}"]
    assert main(args) == 2
    assert "data_batch_3" in _one_line_error(capsys)
    assert not marker.exists() and not out.exists()


def test_a_truncated_cifar_batch_is_one_line(tmp_path):
    folder = _cifar10_root(tmp_path / "data")
    (folder / "test_batch").write_bytes((folder / "test_batch").read_bytes()[:100])
    with pytest.raises(ConfigError, match="test_batch is corrupt"):
        DATASETS.get("cifar10").load(str(tmp_path / "data"))


def test_a_hostile_fedbn_split_file_runs_nothing(tmp_path):
    from fl_lightning.data.folders import _read_split

    good = tmp_path / "amazon_train.pkl"
    good.write_bytes(pickle.dumps((np.array(["amazon/bike/1.jpg"]), np.array(["bike"])), protocol=2))
    assert _read_split(good) == (["amazon/bike/1.jpg"], ["bike"])
    marker = tmp_path / "pwned"
    bad = tmp_path / "amazon_test.pkl"
    bad.write_bytes(pickle.dumps(_Hostile(marker), protocol=2))
    with pytest.raises(ConfigError, match="amazon_test.pkl refused"):
        _read_split(bad)
    assert not marker.exists()


# --- 2. run_id and experiment stay inside output_dir -------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        "run_id=../../X",
        "experiment=../../../X",
        "run_id={tmp}/absolute",
        "run_id=a/b",
        "run_id=${{oc.env:FL_TEST_ESCAPE}}",
        "experiment=${{oc.env:FL_TEST_ESCAPE}}",
        "run_id=.hidden",
        "run_id=" + "x" * 300,
        "+experiment=../../../X",
    ],
)
def test_run_id_and_experiment_are_one_safe_folder_name(tmp_path, capsys, monkeypatch, bad):
    monkeypatch.setenv("FL_TEST_ESCAPE", str(tmp_path / "escaped"))  # where an interpolation would lead
    out = tmp_path / "a" / "b" / "c"  # deep enough that `..` escapes stay inside tmp_path
    assert main(["run", bad.format(tmp=tmp_path), *QUICK, f"output_dir={out}"]) == 2
    err = _one_line_error(capsys)
    assert "File name too long" not in err and len(err) < 1000
    assert _written(tmp_path) == []


def test_a_resumed_config_with_an_interpolated_run_id_is_refused(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "run_id: ${oc.env:HOME}\nmethod: {name: fedavg}\ndata: {name: fmnist}\nmodel: {name: cnn}\nfl: {}\n"
    )
    with pytest.raises(ConfigError, match="run_id="):
        load_run_config(tmp_path, [])


# --- 4. bad numbers and loose booleans ----------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        "seed=-1",
        "optim.momentum=-1",
        "optim.weight_decay=-1",
        "eval.overlap=2",
        "runtime.early_start=2",
        "data.download=1",
        # a traceback from the CNN's build, and a MemoryError (terabytes asked for) before
        "data.image_size=3",
        "data.image_size=100000",
        "data.augment_padding=100000",
    ],
)
def test_bad_values_are_one_line(tmp_path, capsys, bad):
    assert main(["run", bad, *QUICK, f"output_dir={tmp_path}"]) == 2
    assert bad.split("=")[0] in _one_line_error(capsys)
    assert _written(tmp_path) == []


@pytest.mark.parametrize(
    "section, key", [("data", "data.old_removed_key"), ("method", "method.old_method_key")]
)
def test_a_run_with_a_key_another_version_wrote_says_how_to_go_on(tmp_path, section, key):
    """A run whose config.yaml holds a key this version does not know: "unknown config key",
    and nothing said it was the file's (an older version's) or how to resume it."""
    doc = {"method": {"name": "fedavg"}, "data": {"name": "fmnist"}, "model": {"name": "cnn"}, "fl": {}}
    doc[section][key.split(".", 1)[1]] = 3
    (tmp_path / "config.yaml").write_text(json.dumps(doc))  # JSON is YAML
    with pytest.raises(ConfigError, match=f"holds {key!r}, a key this version of fl-lightning does not know"):
        load_run_config(tmp_path, [])
    assert main(["resume", str(tmp_path)]) == 2


def test_a_resumed_config_with_a_loose_boolean_is_refused(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "method: {name: fedavg}\ndata: {name: fmnist}\nmodel: {name: cnn}\nfl: {}\neval: {overlap: 2}\n"
    )
    with pytest.raises(ConfigError, match="eval.overlap must be true or false"):
        load_run_config(tmp_path, [])


# --- 5. absurd method values --------------------------------------------------------------
@pytest.mark.parametrize(
    "method, bad",
    [
        ("fedglcl", "method.tau=-1"),
        ("fedglcl", "method.moon_temperature=-1"),
        ("feddtr", "method.tau=-0.5"),
        ("feddtr", "method.text=2"),
        ("fedtsp", "method.lam=-7"),
        ("fedtsp", "method.server_epochs=-5"),
        ("fedtsp", "method.n_ctx=-1"),
        ("fedtsp", "method.n_ctx=5000"),
        ("fedlgt", "method.epsilon=1.5"),
        ("fedlgt", "method.threshold=2"),
        ("clip2fl", "method.kd_temperature=-3"),
        ("clip2fl", "method.pcl_temperature=0"),
    ],
)
def test_absurd_method_values_are_one_line(tmp_path, capsys, method, bad):
    assert main(["run", f"method={method}", bad, *QUICK, f"output_dir={tmp_path}"]) == 2
    assert bad.split("=")[0] in _one_line_error(capsys)
    assert _written(tmp_path) == []


@pytest.mark.parametrize("bad", ["model.n_ctx=0", "model.n_ctx=100000", "model.class_token_position=bogus"])
def test_absurd_prompt_learner_values_are_one_line(tmp_path, capsys, bad):
    """The prompt learner's own values: `n_ctx=0` and `class_token_position=bogus` were a
    ValueError traceback at the model's build, `n_ctx=100000` was taken."""
    prompt = ["method=promptfl", "model=clip_prompt", "model.arch=clip-tiny-random", "data.image_size=32"]
    assert main(["run", *prompt, bad, *QUICK, f"output_dir={tmp_path}"]) == 2
    assert bad.split("=")[0] in _one_line_error(capsys)
    assert _written(tmp_path) == []


@pytest.mark.parametrize("method", ["fedtsp", "fedproto", "fedtgp", "feddistill"])
def test_a_single_label_method_refuses_multi_label_data_before_it_loads(tmp_path, capsys, method):
    """`method=fedtsp data=fmnist_multilabel` was an IndexError after 95 s of data and training."""
    args = [f"method={method}", "data=fmnist_multilabel", "data.client_test_fraction=0.25", *QUICK]
    assert main(["run", *args, f"output_dir={tmp_path}"]) == 2
    err = _one_line_error(capsys)
    assert f"{method} needs single-label data" in err and "data=fmnist_multilabel is multi-label" in err
    assert _written(tmp_path) == []


# --- 3. links planted in a run directory --------------------------------------------------
@pytest.fixture(scope="module")
def one_round_run(tmp_path_factory, data_root) -> Path:
    """A real tiny run stopped after round 1 of 2 (fl.rounds=1; resumed with fl.rounds=2)."""
    out = tmp_path_factory.mktemp("runs")
    args = ["run", *small(out, "runtime=serial", "fl.rounds=1", "run_id=base"), "--quiet"]
    assert main(args) == 0
    return out / "default" / "base"


def _snapshot(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _plant(run_dir: Path, outside: Path, name: str) -> Path:
    """Replace (or add) `name` in the run directory by a link to a file or folder in `outside`."""
    link = run_dir / name
    if name in ("checkpoints", "checkpoints/clients"):
        target = outside / "folder"
        if name == "checkpoints":
            shutil.copytree(link, target)  # what a resume would otherwise write into
        else:
            target.mkdir()
        (target / "c0000001-r000001.pt").write_bytes(b"someone else's client state")
        (target / "c0000002-r000009.pt").write_bytes(b"another one")
        if link.is_dir():
            shutil.rmtree(link)
    else:
        target = outside / "precious.txt"
        target.write_text("precious data\n")
        link.unlink(missing_ok=True)
    link.symlink_to(target, target_is_directory=target.is_dir())
    return target


@pytest.mark.parametrize(
    "name", [".lock", "metrics.tmp", ".summary.json.tmp", "checkpoints", "checkpoints/clients"]
)
def test_resume_writes_through_no_planted_link(tmp_path, capsys, one_round_run, name):
    run_dir = tmp_path / "run"
    shutil.copytree(one_round_run, run_dir)
    outside = tmp_path / "outside"
    outside.mkdir()
    target = _plant(run_dir, outside, name)
    before = _snapshot(target)
    capsys.readouterr()
    code = main(["resume", str(run_dir), "fl.rounds=2", "--quiet"])
    assert _snapshot(target) == before, f"resume wrote through {name}"
    assert code == 2
    err = _one_line_error(capsys)
    assert name in err and "symbolic link" in err


def test_resume_of_a_clean_copy_runs(tmp_path, capsys, one_round_run):
    """The refusals above are the links': the same run directory without one resumes."""
    run_dir = tmp_path / "run"
    shutil.copytree(one_round_run, run_dir)
    assert main(["resume", str(run_dir), "fl.rounds=2", "--quiet"]) == 0
    assert (run_dir / "checkpoints" / "round-000002.json").is_file()


def test_a_run_of_an_earlier_version_whose_run_id_holds_a_space_resumes(tmp_path, capsys, one_round_run):
    """Earlier versions took `run_id='old run'`; names are one safe folder name now, and its
    resume was refused with no way out. Its own folder's name, as config.yaml records it, is
    taken (checked as a stand-in), and stays what it was."""
    run_dir = tmp_path / "old run"
    shutil.copytree(one_round_run, run_dir)
    (run_dir / ".lock").unlink(missing_ok=True)
    text = (run_dir / "config.yaml").read_text()
    assert "run_id: base\n" in text
    (run_dir / "config.yaml").write_text(text.replace("run_id: base\n", "run_id: old run\n"))
    assert main(["resume", str(run_dir), "fl.rounds=2", "--quiet"]) == 0, capsys.readouterr().err
    assert json.loads((run_dir / "summary.json").read_text())["rounds_completed"] == 2
    assert "run_id: old run\n" in (run_dir / "config.yaml").read_text()
    # a name that is not its folder's is still refused (one line)
    (run_dir / "config.yaml").write_text(text.replace("run_id: base\n", "run_id: other run\n"))
    assert main(["resume", str(run_dir), "fl.rounds=3", "--quiet"]) == 2
    assert "run_id='other run' must be one folder name" in _one_line_error(capsys)


def test_a_renamed_run_folder_of_an_earlier_version_resumes(tmp_path, capsys, one_round_run):
    """The folder `oldid`, its config.yaml saying `run_id: my run ünï` (an earlier version's
    name, then the folder renamed): its resume was one line with no way out. The folder's own
    (safe) name is the run id now."""
    run_dir = tmp_path / "oldid"
    shutil.copytree(one_round_run, run_dir)
    (run_dir / ".lock").unlink(missing_ok=True)
    text = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(text.replace("run_id: base\n", "run_id: my run ünï\n"))
    assert main(["resume", str(run_dir), "fl.rounds=2", "--quiet"]) == 0, capsys.readouterr().err
    assert json.loads((run_dir / "summary.json").read_text())["rounds_completed"] == 2
    assert "run_id: oldid\n" in (run_dir / "config.yaml").read_text()


# --- 6. checkpoints name no code: state classes of registered methods only, bounded depth --
EXE = [sys.executable, "-m", "fl_lightning"]


@pytest.fixture(scope="module")
def three_rounds(tmp_path_factory, data_root) -> Path:
    """A real tiny FedAvgM run (a state class of its own) of three rounds, with all three
    checkpoints: a run keeps its newest two, so round 1's is put back as it was at round 2."""
    out = tmp_path_factory.mktemp("three")
    args = small(out, *TINY, "runtime=serial", "method=fedavgm", "fl.rounds=2", "run_id=three")
    assert main(["run", *args, "--quiet"]) == 0
    run_dir = out / "default" / "three"
    first = {p: p.read_bytes() for p in (run_dir / "checkpoints").glob("round-000001.*")}
    assert len(first) == 2  # its .json and .pt
    assert main(["resume", str(run_dir), "fl.rounds=3", "--quiet"]) == 0
    for path, data in first.items():
        path.write_bytes(data)
    return run_dir


def _copy_run(run_dir: Path, dest: Path) -> Path:
    shutil.copytree(run_dir, dest)
    (dest / ".lock").unlink(missing_ok=True)
    return dest


def _rounds(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_hostile_checkpoint_runs_nothing_and_resume_falls_back(tmp_path, three_rounds):
    """The newest checkpoint nests 100,000 levels deep (a RecursionError), the one before names
    `fl_lightning.__main__` (importing it re-entered the CLI): each is set aside and the run
    resumes from round 1, ending where the untouched run ended. In a subprocess (one for both):
    the old code's re-entered CLI ended the process it ran in."""
    run_dir = _copy_run(three_rounds, tmp_path / "run")
    for rnd, tamper in ((2, "names_main_module"), (3, "deeply_nested")):
        js = run_dir / "checkpoints" / f"round-00000{rnd}.json"
        doc = json.loads(js.read_text())
        assert doc["state"]["__dataclass__"] == "fl_lightning.methods.fedavgm:FedAvgMState"
        if tamper == "names_main_module":
            doc["state"]["__dataclass__"] = "fl_lightning.__main__:FedAvgMState"
        else:
            doc["state"]["fields"]["round"] = "DEEP"
        js.write_text(json.dumps(doc).replace('"DEEP"', "[" * 100_000 + "]" * 100_000))
    r = subprocess.run([*EXE, "resume", str(run_dir), "fl.rounds=3", "--quiet"], capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    for rnd in (3, 2):  # the newest first, each on its own line
        warned = [ln for ln in r.stderr.splitlines() if f"skipped checkpoint round-00000{rnd}" in ln]
        assert len(warned) == 1 and "resuming from round 1" in warned[0], r.stderr[-3000:]
        assert (run_dir / "checkpoints" / "skipped" / f"round-00000{rnd}.json").is_file()  # set aside
    assert [x["accuracy"] for x in _rounds(run_dir)] == [x["accuracy"] for x in _rounds(three_rounds)]


@pytest.mark.parametrize("wandb_id", ["a/b", "x" * 65, 7, "../../etc"], ids=["slash", "long", "int", "path"])
def test_a_checkpoint_naming_a_wandb_id_wandb_refuses_is_set_aside(tmp_path, caplog, three_rounds, wandb_id):
    """A checkpoint's W&B run id is what the resumed run continues: `a/b` was W&B's UsageError,
    a traceback, once the resume reached W&B. Such a checkpoint is not intact: set aside with a
    warning, and the run resumes from the one before (as for any broken checkpoint above)."""
    from fl_lightning.runtime import checkpoint

    run_dir = _copy_run(three_rounds, tmp_path / "run")
    for rnd, wid in ((2, "0a1b2c3d"), (3, wandb_id)):
        js = run_dir / "checkpoints" / f"round-00000{rnd}.json"
        doc = json.loads(js.read_text())
        doc["meta"]["wandb_id"] = wid
        js.write_text(json.dumps(doc))
    assert checkpoint.recover(run_dir) == 2
    assert "skipped checkpoint round-000003" in caplog.text and "W&B run id" in caplog.text
    assert checkpoint.load(checkpoint.latest(run_dir))[1]["wandb_id"] == "0a1b2c3d"


@dataclasses.dataclass
class _Inner:
    scale: torch.Tensor


@dataclasses.dataclass
class _OutsideState(ServerState):
    inner: _Inner | None = None


class _Outside(Strategy[MethodConfig, _OutsideState, Broadcast]):
    """A method of another package (here: this test module); its state class comes from its
    generic arguments, as every method's does."""


def test_a_method_registered_outside_the_package_registers_its_state_class():
    """What `METHODS.register` does for a method defined anywhere: its state class, and the
    dataclasses its fields name, become loadable from a checkpoint; before, neither is."""
    from fl_lightning.core.registry import Registry
    from fl_lightning.core.state_classes import register_state_classes, state_class
    from fl_lightning.runtime import checkpoint

    state = _OutsideState(round=3, global_params=None, inner=_Inner(torch.ones(2)))
    tensors: dict = {}
    tree = json.loads(json.dumps(checkpoint._encode(state, tensors)))
    with pytest.raises(CheckpointError, match="not a state class of a registered method"):
        checkpoint._decode(tree, tensors)  # not registered yet
    assert state_class(f"{__name__}:_OutsideState") is None
    Registry("method", on_register=register_state_classes).register("outside")(_Outside)
    assert state_class(f"{__name__}:_OutsideState") is _OutsideState
    assert state_class(f"{__name__}:_Inner") is _Inner
    back = checkpoint._decode(tree, tensors)
    assert back.round == 3 and torch.equal(back.inner.scale, torch.ones(2))


_EXT_METHOD = """
import dataclasses
from dataclasses import dataclass

import torch

from fl_lightning.core.messages import Broadcast, ServerState
from fl_lightning.core.strategy import MethodConfig, Strategy
from fl_lightning.methods import METHODS


@dataclass
class Tally:
    reports: torch.Tensor


@dataclass
class TallyState(ServerState):
    tally: Tally | None = None


@METHODS.register("fedtally")
@dataclass
class FedTallyConfig(MethodConfig):
    pass


class FedTally(Strategy[FedTallyConfig, TallyState, Broadcast]):
    def aggregate(self, state, updates):
        before = state.tally.reports if state.tally is not None else torch.zeros(1)
        return dataclasses.replace(super().aggregate(state, updates), tally=Tally(before + len(updates)))
"""


@pytest.mark.slow
def test_a_run_of_a_method_from_another_package_resumes_from_its_checkpoint(tmp_path, data_root):
    """`methods=extpkg.fedtally`: a method outside the package, with a state class (and a nested
    one) of its own module. Its checkpoint rebuilds both on resume (registered with the method,
    never imported from the checkpoint's name), and the resumed run counts on from there."""
    site = tmp_path / "site"
    (site / "extpkg").mkdir(parents=True)
    (site / "extpkg" / "__init__.py").write_text("")
    (site / "extpkg" / "fedtally.py").write_text(_EXT_METHOD)
    env = {**os.environ, "PYTHONPATH": str(site)}
    args = small(tmp_path / "out", *TINY, "runtime=serial", "method=fedtally", "methods=extpkg.fedtally",
                 "run_id=ext", "fl.clients_per_round=2")  # fmt: skip
    r = subprocess.run([*EXE, "run", *args, "fl.rounds=1", "--quiet"], env=env, capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "out" / "default" / "ext"
    doc = json.loads((run_dir / "checkpoints" / "round-000001.json").read_text())
    assert doc["state"]["__dataclass__"] == "extpkg.fedtally:TallyState"
    assert doc["state"]["fields"]["tally"]["__dataclass__"] == "extpkg.fedtally:Tally"
    r = subprocess.run([*EXE, "resume", str(run_dir), "fl.rounds=2", "methods=extpkg.fedtally", "--quiet"],
                       env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "skipped checkpoint" not in r.stderr, r.stderr[-3000:]  # round 1's was read, not set aside
    tensors = torch.load(run_dir / "checkpoints" / "round-000002.pt", weights_only=True)
    doc = json.loads((run_dir / "checkpoints" / "round-000002.json").read_text())
    reports = tensors[doc["state"]["fields"]["tally"]["fields"]["reports"]["__tensor__"]]
    assert reports.tolist() == [4.0]  # 2 clients in round 1, read back, + 2 in round 2


# --- 7. failures of the machine, not the user: one line, nothing lost ----------------------
def _error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("fl-lightning: error: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def _no_temporaries(run_dir: Path) -> None:
    left = [p.name for p in run_dir.rglob("*") if ".tmp" in p.name or p.name.endswith(".part")]
    assert left == [], f"temporary files left behind: {left}"


@contextlib.contextmanager
def _file_size_limit(limit: int):
    """Every file this process writes stops at `limit` bytes (EFBIG) while inside; the soft limit
    only, so it can be lifted again (Python ignores SIGXFSZ: the write fails, nothing is killed)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.mark.slow
def test_a_file_size_limit_during_a_checkpoint_is_one_line_and_resumable(tmp_path, data_root, capsys):
    """RLIMIT_FSIZE below a checkpoint's size (a quota): the checkpoint write fails with EFBIG.
    One line, exit 1, no temporary file, summary.json saying why; resumed without the limit,
    the run finishes. In this process (the limit set and lifted around the run): no CLI start."""
    args = small(tmp_path, *TINY, "runtime=serial", "run_id=r", *WIDE)  # a checkpoint over 1 MiB (6.4 MiB)
    capsys.readouterr()
    with _file_size_limit(1 << 20):
        code = main(["run", *args, "--quiet"])
    run_dir = tmp_path / "default" / "r"
    assert code == 1
    line = _error_line(capsys.readouterr().err)
    assert "round-000001.pt" in line and "File too large" in line and "resume" in line
    _no_temporaries(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "File too large" in summary["error"]
    assert main(["resume", str(run_dir), "--quiet"]) == 0
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


@pytest.fixture
def tiny_disk(tmp_path):
    """A real small file system (tmpfs), mounted for the test; skipped where mounting is not
    allowed (not root)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()

    def mount(size: int) -> Path:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                           capture_output=True, text=True)  # fmt: skip
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        return mnt

    yield mount
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_is_one_line_and_loses_nothing(
    tmp_path, data_root, tiny_disk, capsys
):
    """A disk with room for round 1's checkpoint but not round 2's: one line, exit 1, no
    temporary file left (it would fill the disk), summary.json written and saying why, round 1's
    checkpoint intact; on a larger disk, `resume` finishes the run."""
    probe = tmp_path / "probe"
    # at full width: a checkpoint (6.4 MiB) larger than the run's other files
    probe_args = small(probe, *TINY, "runtime=serial", "fl.rounds=1", "run_id=p", *WIDE)
    assert main(["run", *probe_args, "--quiet"]) == 0
    ckpt = (probe / "default" / "p" / "checkpoints" / "round-000001.pt").stat().st_size
    disk = tiny_disk(ckpt + ckpt // 2 + (1 << 20))  # round 1's checkpoint, the run's small files
    args = small(disk, *TINY, "runtime=serial", "run_id=r", *WIDE)
    capsys.readouterr()
    code = main(["run", *args, "--quiet"])  # in this process: the disk, not the CLI's start, is tested
    run_dir = disk / "default" / "r"
    assert code == 1
    line = _error_line(capsys.readouterr().err)
    assert "round-000002.pt" in line and "No space left on device" in line
    _no_temporaries(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "No space left on device" in summary["error"]
    moved = tmp_path / "moved"
    shutil.copytree(run_dir, moved)
    (moved / ".lock").unlink()
    assert main(["resume", str(moved), "--quiet"]) == 0
    assert [x["round"] for x in _rounds(moved)] == [1, 2]


@pytest.mark.slow
def test_a_run_directory_removed_mid_run_is_one_line(tmp_path, data_root, capsys):
    """`rm -rf` of the run directory while it trains: one line, exit 1, and the run does not
    create it again (nothing half-made appears where it was). The run in this process, the
    removal from a thread (as from another shell): no CLI start."""
    args = small(tmp_path, "runtime=serial", "fl.rounds=30", "run_id=r")
    run_dir = tmp_path / "default" / "r"
    stop = threading.Event()

    def remove() -> None:  # once the first round is written, while the run goes on
        while not (run_dir / "metrics.jsonl").exists() and not stop.wait(0.05):
            pass
        while run_dir.exists() and not stop.is_set():  # the run may add a file while the tree is removed
            shutil.rmtree(run_dir, ignore_errors=True)

    remover = threading.Thread(target=remove, daemon=True)
    remover.start()
    capsys.readouterr()
    try:
        code = main(["run", *args, "--quiet"])
    finally:
        stop.set()
        remover.join(timeout=60)
    assert code == 1
    assert "removed" in _error_line(capsys.readouterr().err)
    assert not run_dir.exists()


@pytest.mark.slow
def test_ray_that_does_not_start_is_one_line(tmp_path, data_root):
    """Ray's start-up timing out under load ("The current node timed out during startup"),
    made real by stopping the new Ray's raylet (SIGSTOP) before it registers: one line, exit 1.
    ~30 s: Ray's own wait."""
    out = tmp_path / "out"
    args = small(out, *TINY, "runtime=ray", "runtime.early_start=false", "fl.rounds=1")
    proc = subprocess.Popen([*EXE, "run", *args, "--quiet"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    mark = f"FL_LIGHTNING_RAY_OWNER={proc.pid}-".encode()
    stopped: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while not stopped and proc.poll() is None and time.monotonic() < deadline:
            for pid in _pids():
                if _is_raylet_of(pid, mark):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                    break
            time.sleep(0.01)
        assert stopped, "no raylet seen"
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in stopped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 1
    line = _error_line(err)
    assert "Ray did not start" in line and "timed out during startup" in line
    (summary,) = out.glob("default/*/summary.json")
    assert "Ray did not start" in json.loads(summary.read_text())["error"]


def _pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def _is_raylet_of(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if not f.read().split(b"\0")[0].endswith(b"raylet"):
                return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(e.startswith(mark) for e in f.read().split(b"\0"))
    except OSError:
        return False


def test_a_hostile_pickle_as_text_pretrained_is_one_line(tmp_path, capsys):
    marker = tmp_path / "pwned"
    weights = tmp_path / "weights.pt"
    weights.write_bytes(pickle.dumps(_Hostile(marker), protocol=2))
    out = tmp_path / "out"
    args = ["run", "method=fedglcl", "text=clip", f"text.pretrained={weights}", *QUICK, f"output_dir={out}"]
    assert main(args) == 2
    err = _one_line_error(capsys)
    assert "text.pretrained=" in err and "refused" in err
    assert not marker.exists() and not out.exists()


# --- 8. compare over a hostile runs folder ------------------------------------------------
def _hostile_runs(root: Path, good: Path, outside: Path, marker: Path) -> None:
    """A runs folder as someone hostile could hand it over: one real run, and beside it runs
    whose files are pickles, links, FIFOs, huge or deeply nested JSON, garbage lines and YAML
    tags, names with terminal escapes."""
    shutil.copytree(good, root / "real")
    (root / "real" / "checkpoints" / "round-000001.pt").write_bytes(pickle.dumps(_Hostile(marker)))
    payload = pickle.dumps(_Hostile(marker), protocol=2)
    runs = {
        "pickled": {"summary.json": payload, "metrics.jsonl": payload},
        "deep": {"summary.json": b"[" * 100_000 + b"]" * 100_000},
        "huge": {"summary.json": b'{"method": "huge"' + b" " * (4 << 20) + b"}"},
        "list": {"summary.json": b"[1, 2, 3]"},
        "typed": {
            "summary.json": json.dumps({"method": ["a", "b"], "seed": "zero", "primary_metric": 7,
                                        "rounds_completed": "x", "wall_time_s": [1]}).encode(),
            "config.yaml": f"optim: !!python/object/apply:os.system ['touch {marker}']\n".encode(),
        },
        "garbage": {
            "summary.json": json.dumps({"method": "garbage\x1b]0;pwned\x07", "seed": 0,
                                        "status": "completed", "primary_metric": "accuracy"}).encode(),
            "metrics.jsonl": b"\n".join([
                b"\x00\xff binary", b"[1, 2]", b'"text"', b'{"round": "x", "accuracy": 0.9}',
                b'{"round": 1, "accuracy": "high"}', b'{"round": 2, "accuracy": 0.5, "train_loss": 1.0}',
                b'{"round": 3, "accuracy": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", b'{"round": 4, "acc',
            ]),
            "config.yaml": b"a: " + b"[" * 50_000 + b"]" * 50_000 + b"\n",
        },
    }  # fmt: skip
    for name, files in runs.items():
        (root / name).mkdir()
        for fname, data in files.items():
            (root / name / fname).write_bytes(data)
    (outside / "summary.json").write_text(json.dumps({"method": "stolen", "seed": 0}))
    (root / "linked").mkdir()
    (root / "linked" / "summary.json").symlink_to(outside / "summary.json")
    (root / "fifo").mkdir()
    (root / "fifo" / "summary.json").write_text(json.dumps({"method": "fifo", "seed": 0}))
    os.mkfifo(root / "fifo" / "metrics.jsonl")  # reading it would block for ever
    (root / "elsewhere").symlink_to(outside, target_is_directory=True)


def test_compare_over_a_folder_1500_levels_deep_is_no_traceback(tmp_path, capsys, caplog, one_round_run):
    """`rglob` recursed once per level: a RecursionError. Now the run is found, the folder is
    searched 16 levels down (a warning says where it stopped), and nothing else happens."""
    root = tmp_path / "runs"
    shutil.copytree(one_round_run, root / "real")
    levels = [root / "deep"]
    levels[0].mkdir()
    for _ in range(1500):  # (os.makedirs recurses too)
        levels.append(levels[-1] / "d")
        levels[-1].mkdir()
    (levels[-1] / "summary.json").write_text(json.dumps({"method": "buried", "seed": 0}))
    try:
        assert main(["compare", str(root), "--no-plots"]) == 0
        printed = capsys.readouterr()
        assert "Traceback" not in printed.err and "fedavg" in printed.out and "buried" not in printed.out
        assert "more than 16 levels deep" in caplog.text
    finally:
        (levels[-1] / "summary.json").unlink()
        for folder in reversed(levels):  # (shutil.rmtree recurses too)
            folder.rmdir()


def test_compare_over_a_hostile_runs_folder_changes_nothing_outside_and_runs_nothing(
    tmp_path, capsys, one_round_run
):
    root, outside, marker = tmp_path / "runs", tmp_path / "outside", tmp_path / "pwned"
    root.mkdir()
    outside.mkdir()
    _hostile_runs(root, one_round_run, outside, marker)
    (outside / "precious.png").write_bytes(b"not yours")
    (outside / "precious.json").write_text("{}")
    (root / "compare").symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)

    assert main(["compare", str(root)]) == 2  # its output folder is a link: refused
    assert "compare" in _one_line_error(capsys)
    (root / "compare").unlink()
    (root / "compare").mkdir()  # links planted where the plots and compare.json go
    for name in (
        "accuracy_vs_round.png",
        "accuracy_vs_round_fedavg.png",
        "compare.json",
        ".compare.json.tmp",
    ):
        (root / "compare" / name).symlink_to(
            outside / ("precious.png" if name.endswith("png") else "precious.json")
        )
    assert main(["compare", str(root), "--by", "method"]) == 0
    printed = capsys.readouterr()
    assert "Traceback" not in printed.err
    assert _snapshot(outside) == before and not marker.exists()
    assert "fedavg" in printed.out and "garbage?]0;pwned?" in printed.out and "stolen" not in printed.out
    assert "huge" not in printed.out and "fifo" not in printed.out
    groups = {g["group"]: g for g in json.loads((root / "compare" / "compare.json").read_text())["groups"]}
    assert groups["garbage?]0;pwned?"]["final"]["mean"] == 0.5  # its one good line
    assert not any(p.is_symlink() for p in (root / "compare").iterdir())
