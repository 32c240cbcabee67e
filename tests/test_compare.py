"""Journey 3: `fl-lightning sweep` (a grid of real tiny runs) and `fl-lightning compare`
(table of mean ± std over seeds, accuracy-vs-round plots), and what a run sends to W&B
for comparing runs (partition statistics, seed tag)."""
from __future__ import annotations

import glob
import json
import statistics
from pathlib import Path

from fl_lightning.cli.main import main
from fl_lightning.cli.sweep import expand, split_top_level

from .wandb_files import read_finished_run

TINY = ["data=digits", "fl.num_clients=2", "fl.rounds=2", "fl.batch_size=32", "runtime=serial", "logger=none"]
PNG = b"\x89PNG\r\n\x1a\n"


def _summaries(exp_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(exp_dir.glob("*/summary.json"))]


def test_grid_expansion_keeps_bracketed_lists():
    assert split_top_level("a,b") == ["a", "b"] and split_top_level("[a,b]") == ["[a,b]"]
    grid, swept = expand(["method=fedavg", "optim.lr=0.05,0.1", "seed=0,1", "data.domains=[x,y]"])
    assert swept == ["optim.lr", "seed"] and len(grid) == 4
    assert grid[1] == ["method=fedavg", "optim.lr=0.05", "seed=1", "data.domains=[x,y]"]


def test_sweep_then_compare_two_methods_over_two_seeds(tmp_path, capsys):
    out = tmp_path / "runs"
    rc = main(["sweep", "method=fedavg,fedprox", "seed=0,1", *TINY, f"output_dir={out}", "experiment=cmp"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    exp = out / "cmp"  # one runs folder (and one W&B group) for the whole sweep
    sums = _summaries(exp)
    assert sorted((s["method"], s["seed"], s["rounds_completed"]) for s in sums) == [
        ("fedavg", 0, 2), ("fedavg", 1, 2), ("fedprox", 0, 2), ("fedprox", 1, 2)]  # fmt: skip
    assert "[4/4] method=fedprox seed=1" in printed
    # live progress: a line per round of every run, with the metric so far and the time left
    for i, label in enumerate(["method=fedavg seed=0", "method=fedavg seed=1", "method=fedprox seed=0"]):
        assert f"[{i + 1}/4] {label}: round 1/2  accuracy 0." in printed
    assert "[4/4] method=fedprox seed=1: round 2/2  accuracy 0." in printed and "s left" in printed
    png = (exp / "compare" / "accuracy_vs_round.png").read_bytes()
    assert png[:8] == PNG  # the sweep compares at the end

    rc = main(["compare", str(exp), "--out", str(tmp_path / "cmp")])
    table = capsys.readouterr().out
    assert rc == 0
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["method", "runs", "seeds", "final"]
    for method in ("fedavg", "fedprox"):
        runs = [s for s in sums if s["method"] == method]
        finals = [r["final_accuracy"] for r in runs]
        best = [r["best_accuracy"] for r in runs]
        walls = [r["wall_time_s"] for r in runs]
        row = next(ln for ln in lines if ln.startswith(method + " "))
        assert row.split()[1:3] == ["2", "0,1"]
        assert f"{statistics.mean(finals):.4f} ± {statistics.stdev(finals):.4f}" in row
        assert f"{statistics.mean(best):.4f} ± {statistics.stdev(best):.4f}" in row
        assert f"{statistics.mean(walls):.1f} ± {statistics.stdev(walls):.1f}" in row
        assert row.split()[-4] == "2"  # rounds
        assert (tmp_path / "cmp" / f"accuracy_vs_round_{method}.png").read_bytes()[:8] == PNG
    assert (tmp_path / "cmp" / "accuracy_vs_round.png").read_bytes()[:8] == PNG
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [g["group"] for g in data["groups"]] == ["fedavg", "fedprox"] and data["by"] == ["method"]
    band = [
        json.loads(line)["accuracy"]
        for p in exp.glob("fedavg_*/metrics.jsonl")
        for line in p.read_text().splitlines()
    ]
    assert len(band) == 4  # 2 seeds x 2 rounds behind the fedavg curve

    # any key of summary.json or config.yaml groups runs (here: one group of all four)
    rc = main(["compare", str(out), "--by", "optim.lr", "--no-plots"])
    table = capsys.readouterr().out
    assert rc == 0 and next(ln for ln in table.splitlines() if ln.startswith("0.05 ")).split()[1] == "4"


def test_parallel_sweep_runs_each_in_its_own_process(tmp_path, capsys):
    out = tmp_path / "runs"
    rc = main(
        ["sweep", "seed=0,1", *TINY, "fl.rounds=1", f"output_dir={out}", "--parallel", "2", "--no-plots"]
    )
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "[1/2] seed=0: round 1/1" in printed and "[2/2] seed=1: round 1/1" in printed  # progress
    (exp,) = [p for p in out.iterdir() if p.name.startswith("sweep_")]  # one experiment named for the sweep
    assert sorted(s["seed"] for s in _summaries(exp)) == [0, 1]
    logs = sorted((exp / "sweep_logs").glob("*.log"))
    assert len(logs) == 2 and all("-m fl_lightning run" in p.read_text() for p in logs)
    # two concurrent local runs share this machine's CPUs
    for cfg in exp.glob("*/config.yaml"):
        assert "num_cpus: null" not in cfg.read_text()


def test_sweep_checks_every_run_before_starting(tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["sweep", "seed=0,1", *TINY, "fl.rounds=0", f"output_dir={out}"]) == 2
    assert "fl.rounds must be > 0" in capsys.readouterr().err and not out.exists()
    assert main(["sweep", "seed=0,1", "run_id=x", *TINY, f"output_dir={out}"]) == 2
    assert main(["compare", str(tmp_path)]) == 2  # no runs there
    assert "no runs" in capsys.readouterr().err


def test_wandb_run_has_partition_statistics_and_seed_tag(tmp_path):
    from fl_lightning.config import compose
    from fl_lightning.runtime.runner import start_run

    cfg = compose(
        [
            *TINY,
            "logger=wandb",
            "logger.mode=offline",
            "seed=3",
            "experiment=wbpart",
            f"output_dir={tmp_path}",
        ]
    )
    _, run_dir = start_run(cfg, console=False)
    (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    logged = read_finished_run(path)
    assert {"fedavg", "digits", "seed:3"} <= set(logged["run"].tags) and logged["run"].run_group == "wbpart"
    step0 = next(h for h in logged["history"] if "partition/class_histogram/_type" in h)
    assert step0["_step"] == 0 and step0["partition/class_histogram/_type"] == "table-file"
    assert step0["partition/plot/_type"] == "image-file"
    (table_file,) = glob.glob(
        str(run_dir / "wandb" / "offline-run-*" / "files" / step0["partition/class_histogram/path"])
    )
    table = json.loads(Path(table_file).read_text())
    stats = json.loads((run_dir / "partition.json").read_text())
    columns = table["columns"]
    assert columns[:2] == ["client", "size"] and len(columns) == 2 + len(stats["class_names"])
    assert [row[1] for row in table["data"]] == stats["train_sizes"]
    assert [row[2:] for row in table["data"]] == stats["train_class_histogram"]
    accs = [h["accuracy"] for h in logged["history"] if "accuracy" in h]  # rounds still at steps 1..
    assert len(accs) == 2


def _live_client_actors() -> int:
    import ray

    return sum(
        a["State"] == "ALIVE" and "ClientActor" in a["ActorClassName"]
        for a in ray._private.state.actors().values()  # GCS's actor table (no dashboard needed)
    )


def test_sequential_ray_sweep_sets_up_the_same_workers_again(tmp_path, capsys, ray_session):
    """Runs one after another share one Ray and the finished run's client workers (their
    process start and imports paid once); a reused worker leaves no trace in the numbers."""
    ray_tiny = [o for o in TINY if o != "runtime=serial"] + ["runtime=ray", "fl.num_clients=4"]
    before = _live_client_actors()
    out = tmp_path / "runs"
    # seed 1 follows seed 0 on the same workers: MOON keeps per-client state there
    rc = main(["sweep", "method=moon", "seed=0,1", *ray_tiny, f"output_dir={out}",
               "experiment=warm", "--no-plots"])  # fmt: skip
    assert rc == 0, capsys.readouterr().out
    sums = {s["seed"]: s for s in _summaries(out / "warm")}
    assert [sums[k]["actors_reused"] for k in (0, 1)] == [0, 2]
    assert all(s["num_actors"] == 2 and s["startup_s"] > 0 for s in sums.values())
    assert _live_client_actors() == before  # the sweep ends its workers

    # the same run on fresh workers (no sweep): bit for bit the same numbers
    rc = main(["run", "seed=1", "method=moon", *ray_tiny, f"output_dir={out}", "experiment=fresh",
               "run_id=moon1", "--quiet"])  # fmt: skip
    assert rc == 0
    fresh = json.loads((out / "fresh" / "moon1" / "summary.json").read_text())
    assert fresh["actors_reused"] == 0
    swept = next((out / "warm").glob("moon_*s1_*/metrics.jsonl")).read_text().splitlines()
    again = (out / "fresh" / "moon1" / "metrics.jsonl").read_text().splitlines()
    keys = ("accuracy", "loss", "train_loss", "bytes_up")
    assert [{k: json.loads(r).get(k) for k in keys} for r in swept] == [
        {k: json.loads(r).get(k) for k in keys} for r in again]  # fmt: skip
    assert json.loads(swept[-1])["accuracy"] is not None


def test_compare_of_different_primary_metrics_uses_one_every_run_reports(tmp_path):
    """FedAvg's primary metric is the global `accuracy`, FedPer's `client_accuracy`: one table
    must not show FedAvg's global accuracy under FedPer's header."""
    from fl_lightning.tracking.compare import compare

    for method in ("fedavg", "fedper"):
        assert main(["run", f"method={method}", *TINY, "data.client_test_fraction=0.25",
                     f"output_dir={tmp_path}", "experiment=mixed", "--quiet"]) == 0  # fmt: skip
    _, written = compare([tmp_path / "mixed"], plots=False)
    rows = {g["group"]: g for g in json.loads(written[-1].read_text())["groups"]}
    (metric,) = {r["metric"] for r in rows.values()}  # one metric for the whole table
    for s in _summaries(tmp_path / "mixed"):
        assert rows[s["method"]]["final"]["mean"] == s[f"final_{metric}"]
