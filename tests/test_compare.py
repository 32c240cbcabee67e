"""Journey 3: `fl-lightning sweep` (a grid of real tiny runs) and `fl-lightning compare`
(table of mean ± std over seeds, accuracy-vs-round plots), and what a run sends to W&B
for comparing runs (partition statistics, seed tag)."""

from __future__ import annotations

import glob
import json
import statistics
from pathlib import Path

import pytest
import yaml

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
    assert lines[0].startswith("accuracy (higher is better")  # the table's title: its metric
    assert lines[1].split()[:5] == ["method", "n", "seeds", "final", "accuracy"]
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
    lrs = {yaml.safe_load(p.read_text())["optim"]["lr"] for p in exp.glob("*/config.yaml")}
    (lr,) = lrs  # the sweep's runs share the default learning rate
    assert rc == 0 and next(ln for ln in table.splitlines() if ln.startswith(f"{lr} ")).split()[1] == "4"
    _loss_rows_are_means_of_minima(exp, ("fedavg", "fedprox"), 2, capsys)


def _loss_rows_are_means_of_minima(exp: Path, methods: tuple[str, ...], rounds: int, capsys) -> None:
    """`compare --metric loss` over real runs: each method's final and best loss are the mean
    (± std over its seeds; one run: no ±) of its runs' last and lowest `loss` in metrics.jsonl."""
    assert main(["compare", str(exp), "--metric", "loss", "--no-plots"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for method in methods:
        curves = [[json.loads(ln)["loss"] for ln in p.read_text().splitlines()]
                  for p in sorted(exp.glob(f"{method}_*/metrics.jsonl"))]  # fmt: skip
        finals, mins = [c[-1] for c in curves], [min(c) for c in curves]
        row = " ".join(_cells(lines, "loss", method))
        if len(curves) == 1:
            (seed,) = [json.loads(p.read_text())["seed"] for p in exp.glob(f"{method}_*/summary.json")]
            assert f" 1 {seed} {finals[0]:.4f} {mins[0]:.4f} {rounds} " in row and "±" not in row
        else:
            assert f"{statistics.mean(mins):.4f} ± {statistics.stdev(mins):.4f}" in row
            assert f"{statistics.mean(finals):.4f} ± {statistics.stdev(finals):.4f}" in row


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
    run = logged["run"]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    partition = config["data"]["partition"]
    assert {"fedavg", "digits", "seed:3", f"partition:{partition}"} <= set(run.tags)
    # W&B groups by experiment, then by job type (the method); one name per (method, seed)
    assert (run.run_group, run.job_type, run.display_name) == ("wbpart", "fedavg", "fedavg-s3")
    assert logged["config"]["optim.lr"] == config["optim"]["lr"]  # flat keys: W&B filters name them
    assert logged["config"]["data.partition"] == partition and logged["config"]["method.name"] == "fedavg"
    assert logged["config"]["partition.train_sizes"] == json.loads((run_dir / "partition.json").read_text())[
        "train_sizes"]  # fmt: skip
    # every history row carries `round`, and every chart's x-axis is it
    assert [h["round"] for h in logged["history"]] == [h["_step"] for h in logged["history"]] == [0, 1, 2]
    sections = ("train", "eval", "server", "privacy", "system", "partition")
    # (and the evaluation over virtual time, `time/*`, for runs whose clock runs: docs/async.md)
    assert {(m.glob_name, m.step_metric) for m in logged["metrics"] if m.glob_name} == {
        *((f"{s}/*", "round") for s in sections),
        ("time/*", "system/virtual_time"),
    }
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
    accs = [h["eval/accuracy"] for h in logged["history"] if "eval/accuracy" in h]  # steps 1..
    assert len(accs) == 2


def _live_client_actors() -> int:
    import ray

    return sum(
        a["State"] == "ALIVE" and "ClientActor" in a["ActorClassName"]
        for a in ray._private.state.actors().values()  # GCS's actor table (no dashboard needed)
    )


@pytest.mark.slow
def test_sequential_ray_sweep_sets_up_the_same_workers_again(tmp_path, capsys, ray_session):
    """Runs one after another share one Ray and the finished run's client workers (their
    process start and imports paid once); a reused worker leaves no trace in the numbers: its
    run gives bit for bit those of the same run with no worker before it, run serially (the
    serial and Ray executors give identical numbers: test_engine's
    test_serial_and_ray_give_identical_metrics; a third Ray run on fresh workers cost two more
    worker starts, ~14 CPU-seconds)."""
    # one torch thread in both executors, whatever this machine's CPUs: the same kernels (and
    # no second thread spinning in the Ray run's one worker, which hosts all four clients)
    tiny = [o for o in TINY if o != "runtime=serial"] + ["fl.num_clients=4", "runtime.threads_per_client=1"]
    one = ["runtime=ray", "runtime.placement=pool", "runtime.num_actors=1"]  # each worker ~7 CPU-s
    before = _live_client_actors()
    out = tmp_path / "runs"
    # seed 1 follows seed 0 on the same workers: MOON keeps per-client state there
    rc = main(["sweep", "method=moon", "seed=0,1", *tiny, *one, f"output_dir={out}",
               "experiment=warm", "--no-plots"])  # fmt: skip
    assert rc == 0, capsys.readouterr().out
    sums = {s["seed"]: s for s in _summaries(out / "warm")}
    assert [sums[k]["actors_reused"] for k in (0, 1)] == [0, 1]
    assert all(s["num_actors"] == 1 and s["startup_s"] > 0 for s in sums.values())
    assert _live_client_actors() == before  # the sweep ends its workers

    # the same run with no worker before it: bit for bit the same numbers
    rc = main(["run", "seed=1", "method=moon", *tiny, "runtime=serial", f"output_dir={out}",
               "experiment=fresh", "run_id=moon1", "--quiet"])  # fmt: skip
    assert rc == 0
    fresh = json.loads((out / "fresh" / "moon1" / "summary.json").read_text())
    assert fresh["actors_reused"] == 0
    swept = next((out / "warm").glob("moon_*s1_*/metrics.jsonl")).read_text().splitlines()
    again = (out / "fresh" / "moon1" / "metrics.jsonl").read_text().splitlines()
    keys = ("accuracy", "loss", "train_loss", "bytes_up")
    assert [{k: json.loads(r).get(k) for k in keys} for r in swept] == [
        {k: json.loads(r).get(k) for k in keys} for r in again]  # fmt: skip
    assert json.loads(swept[-1])["accuracy"] is not None


def test_compare_of_different_primary_metrics_gives_each_its_own_table(tmp_path, capsys):
    """FedAvg's primary metric is the global `accuracy`, FedPer's `client_accuracy`: each is
    reported on its own, in a table titled with it; `--metric` puts both on one. (Its two runs
    also serve the loss table of one run and the pictures every run draws.)"""
    from fl_lightning.tracking.compare import compare

    for method in ("fedavg", "fedper"):
        assert main(["run", f"method={method}", *TINY, "data.client_test_fraction=0.25",
                     f"output_dir={tmp_path}", "experiment=mixed", "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    table, written = compare([tmp_path / "mixed"], plots=False)
    data = json.loads(written[-1].read_text())
    rows = {g["group"]: g for g in data["groups"]}
    assert data["metrics"] == ["accuracy", "client_accuracy"]
    for s in _summaries(tmp_path / "mixed"):
        metric = s["primary_metric"]
        assert rows[s["method"]]["metric"] == metric and rows[s["method"]]["n"] == 1
        assert rows[s["method"]]["final"]["mean"] == s[f"final_{metric}"]
    assert "--metric client_accuracy puts them all on one table" in table  # FedAvg logs it too
    assert main(["compare", str(tmp_path / "mixed"), "--metric", "client_accuracy", "--no-plots"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("client_accuracy (") and not any(ln.startswith("accuracy") for ln in printed)
    for s in _summaries(tmp_path / "mixed"):
        run_dir = tmp_path / "mixed" / s["run_id"]
        last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
        row = next(ln for ln in printed if ln.startswith(s["method"] + " "))
        ref = _majority_by_hand(run_dir)
        # the majority-class reference beside client_accuracy: metrics.jsonl, summary.json, compare
        assert abs(last["client_majority_accuracy"] - ref) < 1e-12
        assert s["final_client_majority_accuracy"] == last["client_majority_accuracy"]
        assert row.split()[1:5] == ["1", str(s["seed"]), f"{last['client_accuracy']:.4f}", f"{ref:.4f}"]
    assert "majority ref" in printed[1] and any(
        ln.startswith("paired: final client_accuracy minus fedavg") for ln in printed
    )
    _loss_rows_are_means_of_minima(tmp_path / "mixed", ("fedavg",), 2, capsys)  # FedPer: no global loss
    # every run draws its curves and its partition (here FedPer's, with client test splits)
    (fedper,) = [s["run_id"] for s in _summaries(tmp_path / "mixed") if s["method"] == "fedper"]
    run_dir = tmp_path / "mixed" / fedper
    for name, (min_w, min_h) in (("curves.png", (1000, 400)), ("partition.png", (600, 300))):
        png = run_dir / name
        width, height = _png_size(png)
        assert width >= min_w and height >= min_h, (name, width, height)
        assert 10_000 < png.stat().st_size < 2_000_000, name  # drawn, and not a bloated raster
    assert not list(run_dir.glob("*.part"))  # written whole, no temporary left


def _majority_by_hand(run_dir: Path) -> float:
    """Each client's majority training class scored on its own test split, weighted by the
    test splits' sizes, from the run's split (rebuilt from its config) with Counter."""
    from collections import Counter

    from fl_lightning.config import load_run_config
    from fl_lightning.data.federated import split_from_config
    from fl_lightning.data.registry import load_from_config

    cfg = load_run_config(run_dir, [])
    data = load_from_config(cfg.data)
    split = split_from_config(data, cfg)
    summary = json.loads((run_dir / "summary.json").read_text())
    hits, total, each = 0, 0, []
    for tr, te in zip(split.train, split.test, strict=True):
        counts = Counter(int(y) for y in data.train_y[tr])
        top = max(counts.values())
        majority = min(c for c, n in counts.items() if n == top)
        right = sum(int(y) == majority for y in data.train_y[te])
        each.append(right / len(te))
        hits, total = hits + right, total + len(te)
    assert summary["client_majority_accuracies"] == [round(a, 6) for a in each]
    return hits / total


def _hand_run(root: Path, name: str, method: str, seed: int, metric: str, curve: list[float],
              loss: list[float]) -> None:  # fmt: skip
    """A finished run's files, written by hand: summary.json and one metrics.jsonl line per round."""
    d = root / name
    d.mkdir(parents=True)
    summary = {"method": method, "seed": seed, "dataset": "coco", "status": "completed",
               "primary_metric": metric, "rounds_completed": len(curve),
               "wall_time_s": 10.0 + seed}  # fmt: skip
    (d / "summary.json").write_text(json.dumps(summary))
    pairs = zip(curve, loss, strict=True)
    lines = [{"round": i + 1, metric: v, "loss": lo} for i, (v, lo) in enumerate(pairs)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def _cells(lines: list[str], title: str, group: str) -> list[str]:
    """The row of `group` in the table titled `title` (up to the next blank line)."""
    start = next(i for i, ln in enumerate(lines) if ln.startswith(title + " ("))
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    return next(ln for ln in lines[start:end] if ln.startswith(group + " ")).split()


def test_compare_mixed_metrics_one_table_each_best_in_the_metrics_direction(tmp_path, capsys):
    """FedLGT (C-AP, multi-label) beside FedDTR (client accuracy): two tables, each titled and
    headed with its own metric; a loss's best is its minimum; one run shows no ±."""
    root = tmp_path / "runs"
    _hand_run(root, "fedlgt_s0", "fedlgt", 0, "c_ap", [0.30, 0.45, 0.40], [2.0, 1.2, 1.5])
    _hand_run(root, "fedlgt_s1", "fedlgt", 1, "c_ap", [0.20, 0.35, 0.50], [2.2, 1.6, 1.1])
    _hand_run(root, "feddtr_s0", "feddtr", 0, "client_accuracy", [0.60, 0.70, 0.65], [1.0, 0.8, 0.9])
    out = tmp_path / "cmp"
    assert main(["compare", str(root), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()

    # by hand: C-AP final (0.40, 0.50), best (0.45, 0.50); FedDTR final 0.65, best 0.70
    assert _cells(lines, "c_ap", "method") == ["method", "n", "seeds", "final", "c_ap", "best", "c_ap",
                                              "rounds", "wall", "time", "s"]  # fmt: skip
    assert _cells(lines, "c_ap", "fedlgt") == [
        "fedlgt", "2", "0,1", f"{0.45:.4f}", "±", f"{statistics.stdev([0.40, 0.50]):.4f}",
        f"{0.475:.4f}", "±", f"{statistics.stdev([0.45, 0.50]):.4f}",
        "3", "10.5", "±", f"{statistics.stdev([10.0, 11.0]):.1f}"]  # fmt: skip
    assert _cells(lines, "client_accuracy", "method")[3:5] == ["final", "client_accuracy"]
    assert _cells(lines, "client_accuracy", "feddtr") == ["feddtr", "1", "0", "0.6500", "0.7000", "3", "10.0"]
    c_ap_table = lines[: lines.index("")]
    assert not any(ln.startswith("feddtr") for ln in c_ap_table)  # no FedDTR number under C-AP
    data = json.loads((out / "compare.json").read_text())
    assert data["metrics"] == ["c_ap", "client_accuracy"]
    assert [(g["group"], g["metric"], g["direction"], g["n"]) for g in data["groups"]] == [
        ("fedlgt", "c_ap", "max", 2), ("feddtr", "client_accuracy", "max", 1)]  # fmt: skip
    lgt, dtr = data["groups"]
    assert abs(lgt["final"]["mean"] - 0.45) < 1e-12 and abs(lgt["best"]["mean"] - 0.475) < 1e-12
    assert abs(lgt["best"]["std"] - statistics.stdev([0.45, 0.50])) < 1e-12
    assert dtr["final"] == {"mean": 0.65, "std": None, "min": 0.65, "max": 0.65, "n": 1}
    assert dtr["best"]["mean"] == 0.70
    # a plot per metric (its y-axis is that metric), none mixing the two
    assert sorted(p.name for p in out.glob("*.png")) == [
        "c_ap_vs_round.png", "c_ap_vs_round_fedlgt.png",
        "client_accuracy_vs_round.png", "client_accuracy_vs_round_feddtr.png"]  # fmt: skip
    assert all(p.read_bytes()[:8] == PNG for p in out.glob("*.png"))

    # --metric loss: one table; best = the mean of each run's lowest loss
    assert main(["compare", str(root), "--metric", "loss", "--out", str(tmp_path / "loss")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("loss (lower is better")
    assert _cells(lines, "loss", "fedlgt")[1:9] == [
        "2", "0,1", f"{1.3:.4f}", "±", f"{statistics.stdev([1.5, 1.1]):.4f}",
        f"{1.15:.4f}", "±", f"{statistics.stdev([1.2, 1.1]):.4f}"]  # fmt: skip
    assert _cells(lines, "loss", "feddtr")[1:5] == ["1", "0", "0.9000", "0.8000"]
    data = json.loads((tmp_path / "loss" / "compare.json").read_text())
    assert data["metrics"] == ["loss"] and {g["direction"] for g in data["groups"]} == {"min"}
    assert (tmp_path / "loss" / "loss_vs_round.png").read_bytes()[:8] == PNG


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature and chunk name."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_compare_pairs_each_method_with_fedavg_by_seed(tmp_path, capsys):
    """Paired differences (final value minus FedAvg's on the same seed) with reproduce's
    95% t-interval, by hand: a seed only one method has drops out; fewer than 3 pairs, none."""
    root = tmp_path / "runs"
    finals = {"fedavg": [0.50, 0.60, 0.55, 0.40], "fedprox": [0.56, 0.63, 0.64], "moon": [0.45, 0.58]}
    for method, values in finals.items():
        for seed, v in enumerate(values):
            _hand_run(root, f"{method}_s{seed}", method, seed, "accuracy", [0.1, v], [1.0, 0.9])
    assert main(["compare", str(root), "--out", str(tmp_path / "cmp"), "--no-plots"]) == 0
    lines = capsys.readouterr().out.splitlines()
    diffs = [0.56 - 0.50, 0.63 - 0.60, 0.64 - 0.55]  # seed 3: FedAvg's only
    mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
    half = 4.302652729911275 * sd / 3**0.5  # t(0.975, 2 df), from a table
    head = lines.index("paired: final accuracy minus fedavg's on the same seeds (mean [95% t-interval])")
    prox = lines[head + 1].split()
    assert prox[:3] == ["fedprox", "seeds", "0,1,2"] and prox[3] == f"{mean:+.4f}"
    assert " ".join(prox[4:6]) == f"[{mean - half:+.4f}, {mean + half:+.4f}]"
    assert lines[head + 2].split()[:4] == ["moon", "seeds", "0,1", f"{statistics.mean([-0.05, -0.02]):+.4f}"]
    assert "fewer than 3 seed pairs" in lines[head + 2]
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    (p, m) = data["paired"]
    assert p["group"] == "fedprox" and p["baseline"] == "fedavg" and p["seeds"] == [0, 1, 2]
    assert abs(p["low"] - (mean - half)) < 1e-9 and abs(p["high"] - (mean + half)) < 1e-9
    assert m["low"] is None and m["seeds"] == [0, 1]
    # another baseline by name; one that names no row is one line
    assert (
        main(["compare", str(root), "--baseline", "moon", "--no-plots", "--out", str(tmp_path / "c2")]) == 0
    )
    assert "paired: final accuracy minus moon's" in capsys.readouterr().out
    assert main(["compare", str(root), "--baseline", "nope", "--no-plots"]) == 2
    assert "--baseline 'nope' names no row" in capsys.readouterr().err


def test_a_newline_in_a_runs_name_stays_inside_its_line(tmp_path, capsys):
    """A run's group name read from its files held a newline (`variant`, `method`): escapes
    became `?`, but the newline split `--baseline`'s one error line in two (and a table row)."""
    root = tmp_path / "runs"
    _hand_run(root, "evil", "evil\x1b[2J\nline2", 0, "accuracy", [0.1, 0.5], [1.0, 0.9])
    _hand_run(root, "plain", "fedavg", 0, "accuracy", [0.1, 0.4], [1.0, 0.9])
    assert main(["compare", str(root), "--baseline", "nope", "--no-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "evil?[2J?line2" in err[0], err
    assert main(["compare", str(root), "--no-plots", "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and not any(ln.startswith("line2") for ln in out.splitlines()), out
