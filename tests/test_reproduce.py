"""`fl-lightning reproduce`: claims files, the grid run end to end, verdicts checked against
paired intervals computed here by hand, a killed reproduction that continues, W&B grouping."""

from __future__ import annotations

import glob
import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fl_lightning.cli.main import main
from fl_lightning.cli.sweep import own_wandb_service
from fl_lightning.config import compose, conf_dir, validate_registered
from fl_lightning.core.errors import ConfigError
from fl_lightning.tracking.reproduce import load_spec, paired

from .wandb_files import read_finished_run

#: Student's t 0.975 quantile with 1 degree of freedom (tables; 2 seeds give one df)
T_975_DF1 = 12.706204736174705

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


def test_reproduce_end_to_end_verdicts_by_hand_and_a_kill(conf, tmp_path, data_root):
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
    assert main(["reproduce", "tiny", "--out", str(out), "--dry-run"]) == 0
    # Verdicts from paired intervals computed by hand.
    numbers = json.loads((out / "results.json").read_text())
    claims = {c["id"]: c for c in numbers["claims"]}
    for cid, key, best, lower in (("faster", "accuracy", False, False), ("loss", "loss", True, True)):
        d = [final(runs / f"fast_s{s}", key, best) - final(runs / f"slow_s{s}", key, best) for s in (0, 1)]
        mean = (d[0] + d[1]) / 2
        sd = abs(d[0] - d[1]) / math.sqrt(2)  # sample std of two values
        half = T_975_DF1 * sd / math.sqrt(2)
        lo, hi = mean - half, mean + half
        c = claims[cid]
        assert c["seeds"] == [0, 1]
        assert c["mean"] == pytest.approx(mean, abs=1e-12)
        assert c["low"] == pytest.approx(lo, abs=1e-9) and c["high"] == pytest.approx(hi, abs=1e-9)
        sign = -1 if lower else 1
        want = "supported" if sign * lo > 0 else "contradicted" if sign * hi < 0 else "inconclusive"
        assert c["verdict"] == want
        assert f"**{want}**" in report
    assert f"fl-lightning reproduce tiny --scale mini --seeds 0,1 --out {out}" in report
    assert (out / "curves.png").stat().st_size > 5000
    # One W&B group for the reproduction, tags naming paper, scale, row and claims.
    (path,) = glob.glob(str(runs / "slow_s1" / "wandb" / "offline-run-*" / "run-*.wandb"))
    logged = read_finished_run(path)
    assert logged["run"].run_group == "reproduce-tiny-mini"
    assert {"reproduce", "tiny", "mini", "row-slow", "faster", "loss"} <= set(logged["run"].tags)
    # A longer schedule continues the finished runs from their checkpoints, round 1 untouched.
    round1 = (runs / "fast_s1" / "metrics.jsonl").read_text()
    assert main(["reproduce", "tiny", "--out", str(out), "fl.rounds=2", "logger=none"]) == 0
    lines = (runs / "fast_s1" / "metrics.jsonl").read_text()
    assert lines.startswith(round1) and len(lines.splitlines()) == 2
    assert json.loads((runs / "fast_s1" / "summary.json").read_text())["rounds_completed"] == 2


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


def test_prepare_steps_and_rows_read_from_another_rows_runs(conf, tmp_path, data_root):
    (conf / "reproduce" / "prep.yaml").write_text(PREP)
    out = tmp_path / "rep"
    assert main(["reproduce", "prep", "--out", str(out), "logger=none"]) == 0
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


def test_paired_verdicts_by_hand():
    # diffs 0.02, 0.04, 0.03: mean 0.03, sd 0.01, t(0.975, 2) = 4.302652729911275
    p = paired({0: 0.52, 1: 0.54, 2: 0.53}, {0: 0.50, 1: 0.50, 2: 0.50, 3: 0.1}, "higher")
    half = 4.302652729911275 * 0.01 / math.sqrt(3)
    assert p.seeds == [0, 1, 2] and p.mean == pytest.approx(0.03)
    assert p.low == pytest.approx(0.03 - half) and p.high == pytest.approx(0.03 + half)
    assert p.verdict == "supported"
    assert paired({0: 0.52, 1: 0.54, 2: 0.53}, {0: 0.5, 1: 0.5, 2: 0.5}, "lower").verdict == "contradicted"
    assert paired({0: 0.5, 1: 0.6}, {0: 0.55, 1: 0.5}, "higher").verdict == "inconclusive"
    one = paired({0: 0.9}, {0: 0.1}, "higher")  # one pair: no interval
    assert one.low is None and one.verdict == "inconclusive"


@pytest.mark.parametrize("paper", sorted(p.stem for p in (conf_dir() / "reproduce").glob("*.yaml")))
def test_every_claims_file_composes_at_every_scale(paper, tmp_path):
    spec = load_spec(conf_dir() / "reproduce" / f"{paper}.yaml")
    assert set(spec.scales) == {"mini", "paper"}
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
            if compose(args).text.name == "clip":
                args.append(f"text.pretrained={clip}")
            validate_registered(compose(args))


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
    ],
)
def test_bad_claims_file_is_one_line(conf, text, says, capsys):
    (conf / "reproduce" / "tiny.yaml").write_text(text)
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
        (["reproduce", "tiny", "method.nokey=1", "--dry-run"], "tiny row 'fast'"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert main(["reproduce", "--list"]) == 0
    assert "tiny" in capsys.readouterr().out
