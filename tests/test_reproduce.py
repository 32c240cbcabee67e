"""`fl-lightning reproduce`: claims files, the grid run end to end, verdicts checked against
paired intervals computed here by hand, a killed reproduction that continues, W&B grouping."""

from __future__ import annotations

import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fl_lightning.cli.estimate import train_images
from fl_lightning.cli.main import main
from fl_lightning.cli.reproduce import plan, provenance
from fl_lightning.cli.sweep import own_wandb_service
from fl_lightning.config import compose, conf_dir, validate_registered
from fl_lightning.core.errors import ConfigError
from fl_lightning.runtime.summary import code_version
from fl_lightning.tracking.reproduce import at_chance, load_spec, machines, paired, read_run, run_value

from .wandb_files import read_finished_run

TINY = """
title: tiny
citation: a test
scales:
  mini:
    overrides: [data=fmnist, data.train_subset=600, data.test_subset=200, fl.num_clients=3, fl.rounds=1,
                fl.batch_size=32, runtime=serial, data.partition=iid]
    seeds: [0, 1]
    needs: Fashion-MNIST
rows:
  fast: {label: lr 0.05, overrides: [method=fedavg, optim.lr=0.05], paper: 60.0}
  slow: {label: lr 0.001, overrides: [method=fedavg, optim.lr=0.001], paper: 50.0}
claims:
  - {id: faster, text: a larger step learns more in one round, row: fast, baseline: slow, metric: accuracy}
  - {id: loss, text: and has a lower loss, row: fast, baseline: slow, metric: loss, direction: lower,
     stat: best}
"""


@pytest.fixture
def conf(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "conf"
    shutil.copytree(conf_dir(), root)
    (root / "reproduce" / "tiny.yaml").write_text(TINY)
    monkeypatch.setenv("FL_LIGHTNING_CONF", str(root))
    return root


def final(run_dir: Path, key: str, best: bool = False) -> float:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    xs = [r[key] for r in lines if r.get(key) is not None]
    return min(xs) if best else xs[-1]


def test_reproduce_end_to_end_verdicts_by_hand_and_a_kill(conf, tmp_path, data_root, capsys):
    out = tmp_path / "rep"
    # as from another shell: not this process's W&B service (an earlier test may have started one)
    env = {**own_wandb_service(), "FL_LIGHTNING_CONF": str(conf), "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "fl_lightning", "reproduce", "tiny", "--out", str(out),
           "logger=wandb", "logger.mode=offline"]  # fmt: skip
    runs = out / "tiny_mini"
    # Start it, kill -9 once the first run has finished.
    log = tmp_path / "first.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    first = runs / "fast_s0" / "summary.json"
    deadline = time.monotonic() + 300
    while not first.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first.is_file(), log.read_text()[-2000:]
    kept = first.read_text()
    finished_before = sorted(p.parent.name for p in runs.glob("*/summary.json"))
    assert len(finished_before) < 4
    # Again: only what was missing runs.
    rc = main(["reproduce", "tiny", "--out", str(out), "logger=wandb", "logger.mode=offline"])
    assert rc == 0
    assert first.read_text() == kept  # not run again
    assert sorted(p.parent.name for p in runs.glob("*/summary.json")) == [
        "fast_s0", "fast_s1", "slow_s0", "slow_s1"
    ]  # fmt: skip
    # A third time: nothing to run, the same report.
    report = (out / "report.md").read_text()
    capsys.readouterr()
    assert main(["reproduce", "tiny", "--out", str(out), "--dry-run"]) == 0
    shown = capsys.readouterr().out  # what the scale needs, and whether it is here
    assert "needs: Fashion-MNIST" in shown
    assert f"dataset fmnist under {Path(data_root).expanduser()}: present" in shown
    # Two seeds give no verdict, and say why; the numbers are still the paired differences,
    # on each claim's own statistic (final accuracy; best, i.e. lowest, loss)
    numbers = json.loads((out / "results.json").read_text())
    claims = {c["id"]: c for c in numbers["claims"]}
    for cid, key, best in (("faster", "accuracy", False), ("loss", "loss", True)):
        d = [final(runs / f"fast_s{s}", key, best) - final(runs / f"slow_s{s}", key, best) for s in (0, 1)]
        c = claims[cid]
        assert c["seeds"] == [0, 1] and c["diffs"] == pytest.approx(d, abs=1e-12)
        assert c["mean"] == pytest.approx((d[0] + d[1]) / 2, abs=1e-12)
        assert c["verdict"] == "no verdict" and c["low"] is None and c["why"] == "fewer than 3 seed pairs"
    assert report.count("**no verdict** (fewer than 3 seed pairs)") == 2
    assert "| best loss |" in report and "| final accuracy |" in report
    assert f"fl-lightning reproduce tiny --scale mini --seeds 0,1 --out {out}" in report
    assert (out / "curves.png").stat().st_size > 5000
    # One W&B group for the reproduction, tags naming paper, scale, row and claims.
    (path,) = glob.glob(str(runs / "slow_s1" / "wandb" / "offline-run-*" / "run-*.wandb"))
    logged = read_finished_run(path)
    assert logged["run"].run_group == "reproduce-tiny-mini"
    assert {"reproduce", "tiny", "mini", "row-slow", "faster", "loss"} <= set(logged["run"].tags)
    # ... each run named by its row (two rows of one method would otherwise share a name)
    assert logged["run"].display_name == "slow-s1" and logged["config"]["row"] == "slow"
    assert json.loads((runs / "slow_s1" / "summary.json").read_text())["row"] == "slow"
    # A longer schedule continues the finished runs from their checkpoints, round 1 untouched.
    round1 = (runs / "fast_s1" / "metrics.jsonl").read_text()
    assert main(["reproduce", "tiny", "--out", str(out), "fl.rounds=2", "logger=none"]) == 0
    lines = (runs / "fast_s1" / "metrics.jsonl").read_text()
    assert lines.startswith(round1) and len(lines.splitlines()) == 2
    assert json.loads((runs / "fast_s1" / "summary.json").read_text())["rounds_completed"] == 2
    # every row: final, best and the mean of its last rounds (here 2 < 5: both), by hand
    rows = json.loads((out / "results.json").read_text())["rows"]
    acc = [json.loads(x)["accuracy"] for x in lines.splitlines()]
    assert rows["fast"]["accuracy"]["final"]["1"] == acc[-1] and rows["fast"]["accuracy"]["best"]["1"] == max(
        acc
    )
    assert rows["fast"]["accuracy"]["last_k"]["1"] == pytest.approx(sum(acc) / 2, abs=1e-15)
    # `compare --by row` tells the rows apart
    assert main(["compare", str(runs), "--by", "row", "--no-plots"]) == 0
    table = capsys.readouterr().out
    groups = {
        line.split()[0]: line.split()[1] for line in table.splitlines() if line.startswith(("fast ", "slow "))
    }
    assert groups == {"fast": "2", "slow": "2"}  # two seeds each
    # Continued with other settings: refused in one line, nothing touched...
    assert main(["reproduce", "tiny", "--out", str(out), "fl.batch_size=16", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "made with other settings (fl.batch_size: 32 -> 16)" in err[0], err
    # ... or, on request, those runs moved aside (not deleted) and run again
    kept = (runs / "fast_s0" / "summary.json").read_text()
    argv = ["reproduce", "tiny", "--out", str(out), "--seeds", "0", "fl.batch_size=16", "logger=none"]
    assert main([*argv, "--restart"]) == 0
    (aside,) = (out / "set_aside").iterdir()
    assert (aside / "fast_s0" / "summary.json").read_text() == kept
    assert sorted(p.name for p in aside.iterdir()) == ["fast_s0", "slow_s0"]
    assert "batch_size: 16" in (runs / "fast_s0" / "config.yaml").read_text()
    # the report and results.json name every override: the scale's and the command line's
    numbers = json.loads((out / "results.json").read_text())
    assert numbers["overrides"]["command_line"] == ["fl.batch_size=16", "logger=none"]
    assert "fl.rounds=1" in numbers["overrides"]["scale"]
    assert (
        "runtime=serial data.partition=iid fl.batch_size=16 logger=none`" in (out / "report.md").read_text()
    )
    assert main(argv) == 0  # continued with the same settings: nothing to run
    # --out a run directory (or inside one): refused, nothing written there
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (runs / "fast_s0").iterdir())
    for inside in (runs / "fast_s0", runs / "fast_s0" / "sub"):
        assert main(["reproduce", "tiny", "--out", str(inside), "--report-only"]) == 2
        assert "the run directory" in capsys.readouterr().err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (runs / "fast_s0").iterdir()) == before


PREP = """
title: prep
citation: a test of prepare steps and rows read from another row's runs
scales:
  mini:
    prepare:
      - creates: w/cnn.pt
        command: [pretrain, data=fmnist, model=cnn, data.test_subset=200, --holdout-size, "300",
                  --epochs, "1", --out, "{out}/w/cnn.pt"]
    overrides: [data=fmnist, data.train_subset=600, data.test_subset=200, fl.num_clients=3, fl.rounds=1,
                fl.batch_size=32, runtime=serial, data.partition=iid, "model.weights={out}/w/cnn.pt"]
    seeds: [0]
    needs: Fashion-MNIST
rows:
  a: {label: FedAvg, overrides: [method=fedavg]}
  b: {label: FedAvg's client-side view, runs_of: a, metric_prefix: client/}
metrics: [train_loss]
claims:
  - {id: same, text: the same runs, row: a, baseline: b, metric: accuracy}
"""


def test_prepare_steps_and_rows_read_from_another_rows_runs(conf, tmp_path, data_root, monkeypatch):
    (conf / "reproduce" / "prep.yaml").write_text(PREP)
    out = tmp_path / "rep"
    # a yaml.py where the user runs the command: the prepare step's child (python -P) ignores it
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "yaml.py").write_text(
        f"open({str(tmp_path / 'planted_ran')!r}, 'w').close()\nraise SystemExit(3)\n"
    )
    monkeypatch.chdir(cwd)
    assert main(["reproduce", "prep", "--out", str(out), "logger=none"]) == 0
    assert not (tmp_path / "planted_ran").exists()
    weights = out / "w" / "cnn.pt"
    made = weights.stat().st_mtime_ns
    assert (out / "logs" / "prepare-0.log").is_file()
    runs = sorted(p.name for p in (out / "prep_mini").iterdir())
    assert runs == ["a_s0"]  # row b has no runs of its own
    summary = json.loads((out / "prep_mini" / "a_s0" / "summary.json").read_text())
    assert summary["model_weights"]["path"] == str(weights)  # the prepared trunk, with {out} filled in
    numbers = json.loads((out / "results.json").read_text())
    metrics = (out / "prep_mini" / "a_s0" / "metrics.jsonl").read_text()
    lines = [json.loads(x) for x in metrics.splitlines()]
    assert numbers["rows"]["a"]["train_loss"]["final"] == {"0": lines[-1]["train_loss"]}
    assert numbers["rows"]["b"]["train_loss"]["final"] == {"0": lines[-1]["client/train_loss"]}
    report = (out / "report.md").read_text()
    assert "## Rows: `train_loss`" in report and "FedAvg's runs, `client/*`" in report
    acc = summary["model_weights"]["info"]["held_out_accuracy"]
    assert f"- FedAvg: pretrained cnn trunk {acc * 100:.2f}%" in report
    # again: the prepared file exists, the step does not run; the finished run is kept
    assert main(["reproduce", "prep", "--out", str(out), "logger=none"]) == 0
    assert weights.stat().st_mtime_ns == made


def test_reproduce_writes_nothing_through_links_planted_in_its_folder(conf, tmp_path, capsys):
    """`reproduce` wrote `report.md` and `results.json` through links planted in its `--out`
    folder (two victims overwritten) and a prepare step's `logs/prepare-0.log` through a link
    (the victim truncated). Now the report and results are written to a new file and renamed
    (a link is replaced), the log is a new file of its own, and a linked `logs/` is one line."""
    out = tmp_path / "rep"
    out.mkdir()
    victims = {name: tmp_path / f"victim_{name}" for name in ("report.md", "results.json", "prepare-0.log")}
    for name, victim in victims.items():
        victim.write_text(f"the user's own {name}\n")
    (out / "report.md").symlink_to(victims["report.md"])
    (out / "results.json").symlink_to(victims["results.json"])
    assert main(["reproduce", "tiny", "--out", str(out), "--report-only"]) == 0
    assert not (out / "report.md").is_symlink() and "tiny" in (out / "report.md").read_text()
    assert json.loads((out / "results.json").read_text())["command"]
    (conf / "reproduce" / "tiny.yaml").write_text(_step('[pretrain, data=nosuch, --out, "{out}/w.pt"]'))
    (out / "logs").mkdir()
    (out / "logs" / "prepare-0.log").symlink_to(victims["prepare-0.log"])
    capsys.readouterr()
    assert main(["reproduce", "tiny", "--out", str(out), "logger=none"]) == 2  # the step fails: one line
    assert "prepare step" in capsys.readouterr().err
    assert not (out / "logs" / "prepare-0.log").is_symlink()
    assert all(v.read_text() == f"the user's own {n}\n" for n, v in victims.items())
    shutil.rmtree(out / "logs")
    (tmp_path / "elsewhere").mkdir()
    (out / "logs").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert main(["reproduce", "tiny", "--out", str(out), "logger=none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "logs is a symbolic link" in err[0], err
    assert not any((tmp_path / "elsewhere").iterdir())


def test_a_file_size_limit_leaves_the_last_report_whole(conf, tmp_path):
    """`ulimit -f 2` and `reproduce --report-only` over a folder holding a good report: the
    report was cut mid-line, and the line gave a run's advice (resume). Now the report is
    written to a new file and renamed: the old one is whole, and the line names report.md."""
    import resource

    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "fl_lightning", "reproduce", "tiny", "--out", str(out), "--report-only"]
    env = {**os.environ, "FL_LIGHTNING_CONF": str(conf), "PYTHONDONTWRITEBYTECODE": "1"}
    assert subprocess.run(cmd, env=env, capture_output=True, timeout=300).returncode == 0
    before = (out / "report.md").read_bytes()
    (out / "report.md").write_bytes(before + b"\n(the user's note, so the report is over 1 KiB)\n" * 40)
    before = (out / "report.md").read_bytes()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, preexec_fn=limit)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert "report.md" in lines[0] and "File too large" in lines[0] and "resume" not in lines[0], lines[0]
    assert (out / "report.md").read_bytes() == before


def test_paired_verdicts_by_hand():
    # diffs 0.02, 0.04, 0.03: mean 0.03, sd 0.01, t(0.975, 2) = 4.302652729911275
    p = paired({0: 0.52, 1: 0.54, 2: 0.53}, {0: 0.50, 1: 0.50, 2: 0.50, 3: 0.1}, "higher")
    half = 4.302652729911275 * 0.01 / math.sqrt(3)
    assert p.seeds == [0, 1, 2] and p.mean == pytest.approx(0.03)
    assert p.low == pytest.approx(0.03 - half) and p.high == pytest.approx(0.03 + half)
    assert p.verdict == "supported"
    assert paired({0: 0.52, 1: 0.54, 2: 0.53}, {0: 0.5, 1: 0.5, 2: 0.5}, "lower").verdict == "contradicted"
    assert paired({0: 0.5, 1: 0.6, 2: 0.7}, {0: 0.55, 1: 0.5, 2: 0.6}, "higher").verdict == "inconclusive"
    # two pairs that differ by exactly one point each: no interval, no verdict (was "contradicted")
    two = paired({0: 0.50, 1: 0.60}, {0: 0.51, 1: 0.61}, "higher")
    assert two.low is None and two.verdict == "no verdict" and two.why == "fewer than 3 seed pairs"
    # three equal differences (float noise apart): a zero-width interval says nothing
    flat = paired({0: 0.6, 1: 0.7, 2: 0.8}, {0: 0.5, 1: 0.6, 2: 0.7}, "higher")
    assert flat.verdict == "no verdict" and flat.why == "the differences do not vary over seeds"
    one = paired({0: 0.9}, {0: 0.1}, "higher")  # one pair: no interval
    assert one.low is None and one.verdict == "no verdict"


def test_statistics_and_chance_recomputed_from_committed_runs():
    """From the committed FedGLCL runs: a FedAvg run at 10.00% in every round, whose summary
    predates the chance check (no warning in it), is at chance when read now; a trained run
    is not; final, best and last-5 are the last value, the maximum and the mean of the last 5."""
    runs = Path(__file__).parent.parent / "docs" / "reproduce" / "fedglcl" / "fedglcl_mini"
    flat, trained = read_run(runs / "fedavg_d03_s0"), read_run(runs / "text_d03_s0")
    assert "warning" not in flat.summary and {r["accuracy"] for r in flat.records} == {0.1}
    assert at_chance(flat) and not at_chance(trained)
    acc = [
        json.loads(x)["accuracy"] for x in (runs / "text_d03_s0" / "metrics.jsonl").read_text().splitlines()
    ]
    assert run_value(trained.records, "accuracy", "final") == acc[-1]
    assert run_value(trained.records, "accuracy", "best") == max(acc)
    assert run_value(trained.records, "accuracy", "last_k") == pytest.approx(sum(acc[-5:]) / 5, abs=1e-15)
    assert machines([flat.summary]) == "not recorded in the runs' summaries"
    assert machines([{"machine": "A"}, {"machine": "B"}, {"machine": "A"}, {}]) == (
        "the runs differ: A (2 runs), B (1 runs); 1 runs do not record it"
    )


#: claims files without a paper scale yet, each with its reason where it is asserted
MINI_ONLY: set[str] = set()


@pytest.mark.parametrize("paper", sorted(p.stem for p in (conf_dir() / "reproduce").glob("*.yaml")))
def test_every_claims_file_composes_at_every_scale(paper, tmp_path):
    spec = load_spec(conf_dir() / "reproduce" / f"{paper}.yaml")
    assert set(spec.scales) == ({"mini"} if paper in MINI_ONLY else {"mini", "paper"})
    for name, scale in spec.scales.items():
        assert scale.needs, f"{paper} {name}: say what data or weights it needs"
        assert spec.claims_for(name)
        out = tmp_path / name
        for step in scale.prepare:  # what a step creates, made for real but small (a runs' input)
            if step.creates is not None and step.command[0] == "pretrain":
                args = [a.replace("{out}", str(out)) for a in step.command]
                assert main([*args, "--epochs", "1", "--holdout-size", "64", "data.test_subset=100"]) == 0
        clip = tmp_path / "ViT-B-32.pt"  # CLIP weights, which a paper scale's `needs` asks the user for
        clip.touch()
        for row in spec.run_rows(name):
            args = [*row.args(scale, out), f"output_dir={tmp_path}", "logger=none"]
            cfg = compose(args)
            given = []  # what the user gives on top; composed again only where there is some
            if cfg.text["name"] == "clip":
                given.append(f"text.pretrained={clip}")
            weights = cfg.model.get("weights")
            if weights and not Path(str(weights)).exists():  # the ImageNet trunk a paper scale pins
                trunk = tmp_path / "resnet18.pth"
                if not trunk.exists():
                    import torch
                    from torchvision.models import resnet18

                    torch.save(resnet18(weights=None).state_dict(), trunk)
                given.append(f"model.weights={trunk}")
            validate_registered(compose([*args, *given]) if given else cfg)
            # the shape of every dataset it reads known (a composite's members': data=coop_multi)
            assert train_images(cfg) is not None, f"{paper}: --estimate cannot time {cfg.data.name}"


def test_runs_go_seed_by_seed_so_a_cut_reproduction_holds_whole_seeds(conf, tmp_path):
    """Every row of seed 0 before any of seed 1: each seed that finishes pairs across the rows
    (row by row, a cut reproduction would hold whole rows and no pair)."""
    spec = load_spec(conf / "reproduce" / "tiny.yaml")
    todo, done, _, _ = plan(spec, "mini", [0, 1, 2], tmp_path / "rep", [])
    order = ["fast_s0", "slow_s0", "fast_s1", "slow_s1", "fast_s2", "slow_s2"]
    assert [r.run_dir.name for r in todo] == order and done == []
    assert [r.index for r in todo] == list(range(6))


def test_an_estimate_total_says_which_rows_it_holds():
    """Rows the estimate cannot time (a dataset of unknown shape) stay out of the total, and
    the total says so; with none timed it prints no 0.00, which would read as free."""
    from fl_lightning.cli.estimate import estimate_lines

    lines = estimate_lines([("digits", ["data=digits"]), ("pacs", ["data=pacs"])], 2)
    assert lines[3].startswith("pacs") and "not timed: no shape known for dataset 'pacs'" in lines[3]
    assert lines[4].startswith("total (projected)") and lines[5].strip() == (
        "(1 of 2 rows projected; the rest are not in the total)"
    )
    alone = estimate_lines([("pacs", ["data=pacs"])], 2)
    assert alone[-1].split() == "total none: no row could be projected (above, why)".split()


def test_an_estimate_times_a_prompt_learner_and_projects_its_scale(capsys):
    """The prompt papers' rows are projected, not skipped: FedTPG's mini scale, 32 shots of the
    5 base classes (160 images) over 2 clients, batch 16, one epoch: 2 x ceil(80 / 16) = 10
    steps a round, 100 rounds, plus the 160 images once through the image tower; its clients
    score their own block of 2 classes, PromptFL's every trained one; zero-shot fits nothing."""
    from fl_lightning.cli.estimate import estimate_lines, scored_classes

    assert main(["reproduce", "fedtpg", "--estimate"]) == 0
    text = capsys.readouterr().out
    zero_shot = next(ln for ln in text.splitlines() if "Zero-shot" in ln)
    assert "(its clients fit nothing: evaluation only)" in zero_shot
    total = 0.0
    for label in ("FedCoOp", "FedTPG"):
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(label)).strip()
        seconds, steps, rounds, hours, seeds, device_hours = line[28:].split()[:6]  # the label's 28
        assert (steps, rounds, seeds) == ("10", "100", "3")
        images, per_image = re.search(r"\(with (\d+) images once, ([\d.]+) s each\)", line).groups()
        assert images == "160" and float(per_image) > 0 and float(seconds) > 0  # timed, not skipped
        expect = (10 * 100 * float(seconds) + 160 * float(per_image)) / 3600
        assert float(hours) == pytest.approx(expect, abs=0.006 + 160 * 0.00005 / 3600)
        assert float(device_hours) == pytest.approx(3 * float(hours), abs=0.016)
        total += float(device_hours)
    last = [ln.split() for ln in text.splitlines() if ln.strip().startswith("total (projected)")]
    assert float(last[0][-1]) == pytest.approx(total, abs=0.011)
    # many images, one step: the image tower's once-an-image term is what the hours hold
    many = ["data=fmnist", "model=clip_prompt", "model.arch=clip-tiny-random", "method=promptfl",
            "data.train_subset=20000", "fl.num_clients=1", "fl.batch_size=20000", "fl.rounds=1",
            "fl.local_epochs=1"]  # fmt: skip
    line = estimate_lines([("many", many)], 1)[2]
    seconds, steps, rounds, hours = line[28:].split()[:4]
    per_image = float(re.search(r"\(with 20000 images once, ([\d.]+) s each\)", line).group(1))
    assert (steps, rounds) == ("1", "1") and per_image > 0
    # printed to 0.01 h, and 4 decimals of a second an image (20000 x 0.00005 s)
    assert float(hours) == pytest.approx((float(seconds) + 20000 * per_image) / 3600, abs=0.006 + 1 / 3600)
    mini = ["data=fmnist", "model=clip_prompt", "data.shots=32", "data.base_new=true", "fl.num_clients=2",
            "data.partition=class_blocks", "data.classes_per_client=2"]  # fmt: skip
    assert scored_classes(compose([*mini, "method=fedtpg"])) == 2  # its own block
    assert scored_classes(compose([*mini, "method=promptfl"])) == 5  # the base half
    assert scored_classes(compose([*mini[:-3], "method=promptfl", "data.base_new=false"])) == 10
    assert train_images(compose([*mini, "method=fedtpg"])) == 32 * 5
    assert train_images(compose(["data=caltech101", "data.shots=8", "method=promptfl"])) == 8 * 100
    # FedTPG's nine in one run: 8 shots of each one's base half, 50 + 51 + 50 + 51 + 19 + 51 +
    # 24 + 98 + 199 = 593 classes
    assert train_images(compose(["data=coop_multi", "method=fedtpg"])) == 8 * 593


#: a billion laughs: `i` stands for 9**9 strings (expanded, 112 s and a MemoryError)
BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def _step(command: str) -> str:
    """TINY with one prepare step running `command` (a YAML list)."""
    return TINY.replace("    seeds: [0, 1]", f"    prepare: [{{command: {command}}}]\n    seeds: [0]")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("title: x\n", "needs scales, rows and claims"),
        (TINY.replace("baseline: slow, metric: accuracy", "baseline: nope, metric: accuracy"), "row 'nope'"),
        (TINY.replace("  fast:", "  Fast-1:"), "lower-case name"),
        (TINY.replace("direction: lower", "direction: down"), "direction higher|lower"),
        (TINY.replace("seeds: [0, 1]", "seeds: [-1]"), "non-negative"),
        (
            TINY.replace("    seeds: [0, 1]", "    prepare: [{creates: /x, command: [ls]}]\n    seeds: [0]"),
            "must stay inside the folder",
        ),
        (TINY.replace("  slow: {", "  alias: {runs_of: nope}\n  slow: {"), "runs_of must name a row"),
        (TINY.replace("  slow: {", "  al: {runs_of: fast, overrides: [x]}\n  slow: {"), "no overrides"),
        # malformed files someone else wrote (issue 38): one line each, nothing parsed further
        (TINY.replace("seeds: [0, 1]", "seeds: 5"), "seeds must be a list"),
        ("scales: [mini]\nrows:" + TINY.split("rows:", 1)[1], "scales must be a mapping"),
        (TINY.replace("    needs:", "    reach: abc\n    needs:"), "reach must be a number (got 'abc')"),
        (TINY.split("claims:", 1)[0] + "claims: 7\n", "claims must be a list"),
        (TINY.replace("title: tiny", "title: " + "[" * 20000 + "]" * 20000), "nested deeper than 8 levels"),
        (TINY.replace("title: tiny", "title: caf\xe9").encode("latin-1"), "not UTF-8 text"),
        (
            BOMB + TINY.replace("title: tiny", "title: *i"),
            "anchors and aliases (&, *) are not allowed",
        ),
        (TINY.replace("title: tiny", "title: {a: 1}"), "title must be text"),
        (TINY.replace("title: tiny", "title: tiny\nstat: median"), "stat must be one of final|best|last_k"),
        (TINY.replace("title: tiny", "title: tiny\nmultiplicity: bonf"), "multiplicity must be one of holm"),
        # prepare steps run only pretrain into the folder or teacher build
        (_step("[run, method=fedavg]"), "may run only `pretrain` or `teacher build`"),
        (_step("[pretrain, --out, /tmp/x.pt]"), "writes only inside the folder"),
        (_step('[pretrain, --out, "{out}/../x.pt"]'), "writes only inside the folder"),
        (_step('[pretrain, output_dir=/tmp, --out, "{out}/x.pt"]'), "may not set 'output_dir'"),
        (_step("[teacher, build, --rebuild]"), "may not pass '--rebuild'"),
        # the cluster a run joins is the command line's (a claims file's sent the runs there)
        (TINY.replace("[method=fedavg, optim.lr=0.05]", "[method=fedavg, runtime.address=127.0.0.1:45679]"),
         "may not set 'runtime.address'"),
    ],
)  # fmt: skip
def test_bad_claims_file_is_one_line(conf, text, says, capsys):
    (conf / "reproduce" / "tiny.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match="tiny.yaml"):
        load_spec(conf / "reproduce" / "tiny.yaml")
    assert main(["reproduce", "tiny", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


def test_bad_reproduce_input_is_one_line(conf, capsys):
    for argv, says in (
        (["reproduce", "nosuch"], "unknown paper 'nosuch'; valid:"),
        (["reproduce", "tiny", "--scale", "paper"], "has no 'paper' scale"),
        (["reproduce", "tiny", "--seeds", "0,x"], "--seeds"),
        (["reproduce", "tiny", "--seeds", "0", "1"], "--seeds takes one comma-separated list"),
        (["reproduce", "tiny", "method.nokey=1", "--dry-run"], "tiny row 'fast'"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert main(["reproduce", "--list"]) == 0
    assert "tiny" in capsys.readouterr().out


def test_a_claims_file_imports_no_module_without_consent(conf, tmp_path, monkeypatch, capsys):
    """A row naming `methods=` (a module to import) runs only when the command line names it
    too: without, one line, and the module (planted where it would be found) never runs."""
    (tmp_path / "planted_mod.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = TINY.replace(
        "overrides: [method=fedavg, optim.lr=0.05]", "overrides: [method=fedavg, methods=planted_mod]"
    )
    (conf / "reproduce" / "tiny.yaml").write_text(text)
    assert main(["reproduce", "tiny", "--out", str(tmp_path / "rep"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "rows.fast imports its method from planted_mod: run it with methods=planted_mod" in err[0]
    )
    assert not (tmp_path / "ran").exists() and not (tmp_path / "rep").exists()


def test_estimate_projects_from_timed_steps_and_writes_nothing(conf, tmp_path, capsys):
    """--estimate times the row's backbone on synthetic tensors (no data read) and projects
    steps a round x rounds x seconds a step: TINY's 600 images over 3 clients, batch 32, one
    epoch, is 3 x ceil(200 / 32) = 21 steps a round, one round."""
    out = tmp_path / "rep"
    assert main(["reproduce", "tiny", "--out", str(out), "--estimate"]) == 0
    text = capsys.readouterr().out
    assert "synthetic tensors" in text and "projected" in text
    rows = [ln.split() for ln in text.splitlines() if ln.strip().startswith("lr 0.")]
    assert len(rows) == 2  # fast and slow
    for cells in rows:
        seconds, steps, rounds, hours, seeds, device_hours = cells[2:8]
        assert (steps, rounds, seeds) == ("21", "1", "2")
        assert float(hours) == pytest.approx(21 * float(seconds) / 3600, abs=0.006)
        assert float(device_hours) == pytest.approx(2 * float(hours), abs=0.011)
    assert not out.exists()


def test_an_estimate_with_a_bad_value_is_one_line(conf, tmp_path, capsys):
    """`--estimate fl.rounds=-1` printed "not timed: ..." for each row and exited 0."""
    assert main(["reproduce", "tiny", "--out", str(tmp_path / "rep"), "--estimate", "fl.rounds=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fl.rounds must be > 0 (got -1)" in err[0], err


def git_repo(path: Path) -> tuple[Any, Any]:
    """`git(*args)` (its stdout) and `commit(message)` (everything, its hash) in a real
    repository at `path`."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip

    def commit(message: str) -> str:
        git("add", "-A")
        git("commit", "-qm", message)
        return git("rev-parse", "HEAD")

    return git, commit


def test_provenance_commits_and_pre_registration_in_a_real_git_repo(tmp_path):
    """A tiny real repository: a run's code version is its commit and whether fl_lightning/,
    conf/ or pyproject.toml differ from it (a report written beside them does not count); a
    report is pre-registered only when every run ran at a clean commit that contains its
    claims file's last commit."""

    git, commit = git_repo(tmp_path)

    def run(name: str, code: dict[str, object] | None) -> Path:
        d = tmp_path / "out" / name
        d.mkdir(parents=True)
        summary = {"status": "completed", **({"code": code} if code else {})}
        (d / "summary.json").write_text(json.dumps(summary))
        return d

    git("init", "-q")
    claims = tmp_path / "conf" / "reproduce" / "x.yaml"
    claims.parent.mkdir(parents=True)
    claims.write_text("claims: []\n")
    (tmp_path / "fl_lightning").mkdir()
    (tmp_path / "fl_lightning" / "m.py").write_text("A = 1\n")
    c1 = commit("claims")
    assert code_version(tmp_path) == {"commit": c1, "dirty": False}
    assert code_version(tmp_path / "fl_lightning") is None  # not the top of a checkout
    (tmp_path / "report.md").write_text("results\n")  # what a reproduction writes: not code
    assert code_version(tmp_path) == {"commit": c1, "dirty": False}
    (tmp_path / "fl_lightning" / "m.py").write_text("A = 2\n")
    assert code_version(tmp_path) == {"commit": c1, "dirty": True}
    c2 = commit("code")

    at_c1, at_c2 = run("a_s0", {"commit": c1, "dirty": False}), run("b_s0", {"commit": c2, "dirty": False})
    lines, nums = provenance(claims, [at_c1, at_c2])
    assert nums["claims_commit"] == c1 and nums["runs_at"] == {c1: ["a_s0"], c2: ["b_s0"]}
    assert nums["pre_registered"] and "Pre-registered: **yes**" in "\n".join(lines)
    dirty, bare = run("c_s0", {"commit": c2, "dirty": True}), run("d_s0", None)
    for more in ([dirty], [bare], [tmp_path / "out" / "never_ran"]):
        lines, nums = provenance(claims, [at_c1, *more])
        assert not nums["pre_registered"] and "Pre-registered: **no**" in "\n".join(lines)
    assert provenance(claims, [bare])[1]["runs_at"] == {"not recorded": ["d_s0"]}
    claims.write_text("claims: [amended]\n")
    assert not provenance(claims, [at_c2])[1]["pre_registered"]  # changed, not committed
    c3 = commit("claims amended after the runs")
    _, nums = provenance(claims, [at_c1, at_c2])
    assert nums["claims_commit"] == c3 and not nums["pre_registered"]
    assert provenance(claims, [run("e_s0", {"commit": c3, "dirty": False})])[1]["pre_registered"]


def test_provenance_runs_no_command_of_a_claims_checkout(conf, tmp_path):
    """A claims folder (`FL_LIGHTNING_CONF`) that is a git checkout someone else made: its
    `.git/config` sets `core.fsmonitor` to a command, which `git status` (provenance) ran. Now
    git runs with fsmonitor and hooks off: the report still names the claims' commit."""
    marker = tmp_path / "fsmonitor_ran"

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(conf), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "claims")
    git("config", "core.fsmonitor", f"touch {marker}; false")
    git("config", "core.hooksPath", str(tmp_path / "hooks"))
    assert main(["reproduce", "tiny", "--out", str(tmp_path / "rep"), "--report-only"]) == 0
    assert not marker.exists(), "git ran the claims checkout's core.fsmonitor command"
    assert json.loads((tmp_path / "rep" / "results.json").read_text())["provenance"]["claims_commit"] == git(
        "rev-parse", "HEAD"
    )


def test_a_model_key_the_method_set_is_no_other_setting(tmp_path):
    """config.yaml records the model's arguments as built: a key the run leaves at the model
    file's default and its method sets (FedTSP's feature_dim, to the text's) is not "made with
    other settings" when the reproduction continues; a model key the run's overrides give is
    compared as every other key."""
    import yaml

    from fl_lightning.cli.reproduce import config_changes
    from fl_lightning.cli.sweep import SweepRun
    from fl_lightning.config import to_yaml

    def changes(args: list[str], built: dict) -> list[str]:
        cfg = compose(["data=digits", f"output_dir={tmp_path}", *args])
        run_dir = tmp_path / "r"
        run_dir.mkdir(exist_ok=True)
        stored = yaml.safe_load(to_yaml(cfg))
        stored["model"].update(built)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(stored))
        return config_changes(SweepRun(0, args, cfg, run_dir), tmp_path)

    assert changes([], {"hidden": 99}) == []  # left to the model file: recorded as built
    assert changes(["model.hidden=64"], {"hidden": 99}) == ["model.hidden: 99 -> 64"]
    assert changes(["optim.lr=0.5"], {}) == []
    assert changes([], {"name": "mlp"}) == ["model.name: mlp -> cnn"]


HOLM = """
title: holm
citation: a test of the multiplicity line, the majority reference and exploratory claims
stat: final
stat_note: the paper's protocol
multiplicity: holm
decision: read the first claim
scales:
  mini:
    overrides: [data=fmnist]
    seeds: [0, 1, 2, 3]
    needs: nothing
rows:
  a: {label: A, overrides: [method=fedavg]}
  b: {label: B, overrides: [method=fedavg]}
  c: {label: C, overrides: [method=fedavg]}
  low: {label: below its majority, overrides: [method=fedavg]}
claims:
  - {id: a_b, text: A beats B, row: a, baseline: b, metric: client_accuracy}
  - {id: a_c, text: A beats C, row: a, baseline: c, metric: client_accuracy}
  - {id: b_c, text: B beats C, row: b, baseline: c, metric: client_accuracy, stat: best}
  - {id: a_low, text: A beats a degenerate baseline, row: a, baseline: low, metric: client_accuracy}
  - {id: c_b, text: seen after the runs, row: c, baseline: b, metric: client_accuracy,
     exploratory: added later}
"""


def test_holm_majority_reference_and_exploratory_claims_by_hand(tmp_path):
    """Three claims in the family: Holm's adjusted p-values computed here by hand from scipy's
    paired t-tests; a baseline below its clients' majority reference gives no verdict (and is
    out of the family); an exploratory claim is marked and out of the family; the declared
    statistic, its note, the multiplicity rule and the decision rule are printed."""
    from scipy.stats import ttest_rel

    from fl_lightning.tracking.reproduce import build_report

    finals = {"a": [0.80, 0.83, 0.85, 0.81], "b": [0.78, 0.805, 0.83, 0.79], "c": [0.70, 0.75, 0.83, 0.74],
              "low": [0.30, 0.35, 0.32, 0.31]}  # fmt: skip
    runs = tmp_path / "runs"
    for row, values in finals.items():
        for seed, v in enumerate(values):
            d = runs / f"{row}_s{seed}"
            d.mkdir(parents=True)
            lines = [{"round": 1, "client_accuracy": v + 0.01, "client_majority_accuracy": 0.6},
                     {"round": 2, "client_accuracy": v, "client_majority_accuracy": 0.6}]  # fmt: skip
            (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
            (d / "summary.json").write_text(json.dumps({"status": "completed", "rounds_completed": 2}))
    (tmp_path / "holm.yaml").write_text(HOLM)
    spec = load_spec(tmp_path / "holm.yaml")
    report, numbers = build_report(spec, "mini", runs, [0, 1, 2, 3], "cmd")
    got = {c["id"]: c for c in numbers["claims"]}
    best = {k: [x + 0.01 for x in v] for k, v in finals.items()}  # round 1 is each run's best
    p = {"a_b": ttest_rel(finals["a"], finals["b"]).pvalue, "a_c": ttest_rel(finals["a"], finals["c"]).pvalue,
         "b_c": ttest_rel(best["b"], best["c"]).pvalue}  # fmt: skip
    for k, v in p.items():
        assert got[k]["p"] == pytest.approx(v, rel=1e-9)
    (i1, p1), (i2, p2), (i3, p3) = sorted(p.items(), key=lambda kv: kv[1])
    adj1 = min(1.0, 3 * p1)
    adj2 = max(adj1, min(1.0, 2 * p2))
    adj3 = max(adj2, min(1.0, p3))
    for k, v in ((i1, adj1), (i2, adj2), (i3, adj3)):
        assert got[k]["holm_p"] == pytest.approx(v, rel=1e-9)
        assert got[k]["holm_verdict"] == ("supported" if v < 0.05 else "inconclusive")
    assert got["a_b"]["verdict"] == "supported" and got["a_b"]["holm_p"] < 0.05  # survives Holm
    assert got["a_c"]["verdict"] == "supported" and got["a_c"]["holm_verdict"] == "inconclusive"  # does not
    assert got["a_low"]["verdict"] == "no verdict" and got["a_low"]["p"] is None
    assert got["a_low"]["why"] == "baseline below the majority reference: 32.00 vs 60.00"
    assert got["c_b"]["holm_p"] is None and got["c_b"]["holm_verdict"] == "– (exploratory)"
    assert "*(exploratory: added later)*" in report
    assert (
        "- **Statistic**: declared in the claims file: `final`; the claims use `best`, `final`. the paper's"
        in report
    )
    assert (
        "- **Multiplicity**: Holm, declared in the claims file" in report and "Family: the 3 claims" in report
    )
    assert "(exploratory, outside it: c_b)" in report
    assert "- **Decision rule** (written in the claims file before the runs): read the first claim" in report
    # a row at or above its reference keeps its verdict; undeclared files say so
    undeclared = HOLM.replace("stat: final\n", "").replace("multiplicity: holm\n", "")
    (tmp_path / "holm.yaml").write_text(undeclared)
    report, _ = build_report(load_spec(tmp_path / "holm.yaml"), "mini", runs, [0, 1, 2, 3], "cmd")
    assert "not declared in the claims file (each claim's own, default `final`)" in report
    assert "- **Multiplicity**: not declared in the claims file" in report


TIMED = """
title: timed
citation: a claim of speed on the virtual clock
stat: time_to_reach
multiplicity: none
scales:
  mini:
    overrides: [data=fmnist]
    seeds: [0, 1, 2, 3]
    reach: 0.6
    needs: nothing
rows:
  fast: {label: fast, overrides: [method=fedavg]}
  slow: {label: slow, overrides: [method=fedavg]}
claims:
  - {id: fast_slow, text: fast reaches 60% first, row: fast, baseline: slow, metric: accuracy,
     direction: lower}
  - {id: fast_slow_final, text: fast ends higher, row: fast, baseline: slow, metric: accuracy, stat: final}
"""


def test_time_to_reach_is_the_virtual_time_of_the_first_step_at_the_level_by_hand(tmp_path):
    """`stat: time_to_reach`: each run's value is the `virtual_time` of its first evaluated
    step at the scale's `reach` (a step without an evaluation, or below it, does not count);
    the paired differences and the t-test are those of these times, lower is better; a run
    that never reaches the level drops out of the pairs and the report says which; a claim of
    speed without a `reach` is refused."""
    from scipy.stats import ttest_rel

    from fl_lightning.tracking.reproduce import build_report

    # per seed: (virtual_time, accuracy or None: not evaluated) of each step
    curves = {
        "fast": [[(0.5, 0.4), (1.0, None), (1.5, 0.61), (2.0, 0.65)], [(0.4, 0.62), (0.8, 0.7)],
                 [(0.7, 0.5), (1.4, 0.6)], [(0.6, 0.3), (1.2, 0.59)]],
        "slow": [[(2.0, 0.5), (4.0, 0.6)], [(2.5, 0.59), (3.5, 0.66)], [(3.0, 0.64)],
                 [(3.5, 0.55), (7.0, 0.61)]],
    }  # fmt: skip
    runs = tmp_path / "runs"
    for row, seeds in curves.items():
        for seed, steps in enumerate(seeds):
            d = runs / f"{row}_s{seed}"
            d.mkdir(parents=True)
            lines = [{"round": i + 1, "virtual_time": t, **({} if a is None else {"accuracy": a})}
                     for i, (t, a) in enumerate(steps)]  # fmt: skip
            (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
            (d / "summary.json").write_text(
                json.dumps({"status": "completed", "rounds_completed": len(lines)})
            )
    (tmp_path / "timed.yaml").write_text(TIMED)
    report, numbers = build_report(load_spec(tmp_path / "timed.yaml"), "mini", runs, [0, 1, 2, 3], "cmd")
    got = {c["id"]: c for c in numbers["claims"]}
    fast, slow = [1.5, 0.4, 1.4], [4.0, 3.5, 3.0]  # seeds 0-2; seed 3's fast run never reaches 0.6
    assert got["fast_slow"]["seeds"] == [0, 1, 2] and got["fast_slow"]["stat"] == "time_to_reach"
    assert got["fast_slow"]["diffs"] == pytest.approx([a - b for a, b in zip(fast, slow, strict=True)])
    assert got["fast_slow"]["p"] == pytest.approx(ttest_rel(fast, slow).pvalue, rel=1e-9)
    assert got["fast_slow"]["verdict"] == "supported"  # every difference negative, as claimed
    assert "fast never reached 0.6 (seed 3)" in report
    assert "| virtual time (s) to reach accuracy 0.6 | fast − slow |" in report
    assert got["fast_slow_final"]["seeds"] == [0, 1, 2, 3] and got["fast_slow_final"]["stat"] == "final"
    assert numbers["rows"]["fast"]["accuracy"]["time_to_reach"] == {0: 1.5, 1: 0.4, 2: 1.4}
    (tmp_path / "blind.yaml").write_text(TIMED.replace("    reach: 0.6\n", ""))
    with pytest.raises(ConfigError, match="stat time_to_reach needs scales.mini.reach"):
        load_spec(tmp_path / "blind.yaml")


def test_provenance_start_times_amendments_and_runs_made_twice(tmp_path):
    """In a real git repository: annotations committed after the runs (a note, a multiplicity
    rule, the statistic every claim already used) keep them pre-registered against the commit
    since which the claims' substance is unchanged; a changed claim does not; a run started
    before that commit, and a run made twice (an earlier one set aside), are named."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip

    def commit(message: str) -> tuple[str, str]:
        git("add", "-A")
        git("commit", "-qm", message)
        return git("rev-parse", "HEAD"), git("log", "-1", "--format=%cI")

    git("init", "-q")
    claims = tmp_path / "conf" / "reproduce" / "tiny.yaml"
    claims.parent.mkdir(parents=True)
    claims.write_text(TINY)
    c1, d1 = commit("claims")
    out = tmp_path / "out"

    def run(name: str, started: str | None, folder: Path = out / "tiny_mini") -> Path:
        d = folder / name
        d.mkdir(parents=True)
        summary = {"status": "completed", "code": {"commit": c1, "dirty": False},
                   **({"started_at": started} if started else {})}  # fmt: skip
        (d / "summary.json").write_text(json.dumps(summary))
        return d

    later = "2999-01-01T00:00:00+00:00"
    runs = [run("fast_s0", later), run("slow_s0", later)]
    lines, nums = provenance(claims, runs)
    assert nums["pre_registered"] and "Runs started 2999-01-01T00:00:00+00:00" in "\n".join(lines)
    claims.write_text(
        TINY.replace("title: tiny", "title: tiny\nstat: final\nmultiplicity: holm\nstat_note: x")
    )
    c2, _ = commit("annotations after the runs")
    lines, nums = provenance(claims, runs)
    assert nums["claims_commit"] == c2 and nums["claims_substance_since"] == c1 and nums["pre_registered"]
    assert f"is unchanged since `{c1[:10]}`" in "\n".join(lines)
    early = run("fast_s1", "2000-01-01T00:00:00+00:00")
    lines, nums = provenance(claims, [*runs, early])
    assert not nums["pre_registered"] and nums["started_before_claims"] == ["fast_s1"]
    assert "**Started before the claims' commit**: fast_s1." in "\n".join(lines)
    run("fast_s0", later, out / "set_aside" / "20261129-070000")
    lines, nums = provenance(claims, runs)
    assert nums["run_more_than_once"] == {"fast_s0": ["20261129-070000"]}
    assert "**Run more than once**" in "\n".join(lines)
    claims.write_text(claims.read_text().replace("metric: accuracy}", "metric: accuracy, stat: best}"))
    c3, _ = commit("a claim's statistic changed after the runs")
    _, nums = provenance(claims, runs)
    assert nums["claims_substance_since"] == c3 and not nums["pre_registered"]
    assert d1  # the claims' first commit has a date git reports


def test_provenance_survives_a_rebase_of_the_claims_commit(tmp_path):
    """Runs made at a commit that a rebase later rewrote (the claims re-committed under another
    hash): checked against their own commit's history, which holds the same claims committed
    before they started; pre-registered, and the report says how it was checked. Runs made at a
    commit whose claims differ are not."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip

    git("init", "-q")
    claims = tmp_path / "conf" / "reproduce" / "tiny.yaml"
    claims.parent.mkdir(parents=True)
    claims.write_text(TINY.replace("metric: accuracy}", "metric: accuracy, stat: best}"))
    git("add", "-A")
    git("commit", "-qm", "other claims")
    before = git("rev-parse", "HEAD")
    claims.write_text(TINY)
    git("add", "-A")
    git("commit", "-qm", "claims")
    c1 = git("rev-parse", "HEAD")

    def run(name: str, commit: str) -> Path:
        d = tmp_path / "out" / name
        d.mkdir(parents=True)
        summary = {"status": "completed", "code": {"commit": commit, "dirty": False},
                   "started_at": "2999-01-01T00:00:00+00:00"}  # fmt: skip
        (d / "summary.json").write_text(json.dumps(summary))
        return d

    runs = [run("fast_s0", c1), run("slow_s0", c1)]
    git("checkout", "-q", "--orphan", "rebased")  # the same tree, a new history without c1
    git("commit", "-qm", "claims, rebased")
    lines, nums = provenance(claims, runs)
    assert nums["claims_commit"] != c1 and nums["pre_registered"]
    assert nums["checked_in_own_history"] == ["fast_s0", "slow_s0"]
    assert "2 runs ran at a commit outside this history" in "\n".join(lines)
    _, nums = provenance(claims, [run("fast_s1", before)])  # its claims said stat: best
    assert not nums["pre_registered"] and nums["checked_in_own_history"] == []


def test_a_paper_scale_corrected_after_a_mini_scales_runs_leaves_them_pre_registered(tmp_path):
    """In a real git repository: the mini runs of a claims file with two scales stay
    pre-registered when only the paper scale changes after them (its settings, a row's paper
    arguments, a paper-only row and its claim); the paper scale's substance moves to that commit.
    A change to what the mini rows run moves the mini's too."""

    git, commit = git_repo(tmp_path)

    two = TINY.replace(
        "    needs: Fashion-MNIST\n",
        "    needs: Fashion-MNIST\n  paper:\n    overrides: [data=fmnist, fl.rounds=60]\n"
        "    seeds: [0, 1, 2]\n    needs: Fashion-MNIST\n",
        1,
    )
    git("init", "-q")
    claims = tmp_path / "conf" / "reproduce" / "tiny.yaml"
    claims.parent.mkdir(parents=True)
    claims.write_text(two)
    c1 = commit("claims")
    runs = []
    for name in ("fast_s0", "slow_s0"):
        d = tmp_path / "out" / name
        d.mkdir(parents=True)
        summary = {"status": "completed", "code": {"commit": c1, "dirty": False},
                   "started_at": "2999-01-01T00:00:00+00:00"}  # fmt: skip
        (d / "summary.json").write_text(json.dumps(summary))
        runs.append(d)
    corrected = (
        two.replace("fl.rounds=60]", "fl.rounds=300]")
        .replace("optim.lr=0.05]", "optim.lr=0.05], by_scale: {paper: [optim.momentum=0.9]}")
        .replace("claims:\n", "  big: {label: big, overrides: [method=fedavg], scales: [paper]}\nclaims:\n")
        .rstrip("\n")
        + "\n  - {id: big, text: b, row: big, baseline: slow, metric: accuracy}\n"
    )
    claims.write_text(corrected)
    c2 = commit("the paper scale corrected")
    lines, nums = provenance(claims, runs, "mini")
    assert nums["claims_commit"] == c2 and nums["claims_substance_since"] == c1 and nums["pre_registered"]
    assert f"at the mini scale (its settings, rows, claims' rows, metrics, statistics, directions) " \
        f"is unchanged since `{c1[:10]}`" in "\n".join(lines)  # fmt: skip
    assert provenance(claims, runs, "paper")[1]["claims_substance_since"] == c2
    assert provenance(claims, runs)[1]["claims_substance_since"] == c2  # every scale: as before
    claims.write_text(corrected.replace("optim.lr=0.001]", "optim.lr=0.002]"))
    c3 = commit("a mini row changed")
    _, nums = provenance(claims, runs, "mini")
    assert nums["claims_substance_since"] == c3 and not nums["pre_registered"]
