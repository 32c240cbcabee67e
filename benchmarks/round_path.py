"""The round's path (overlapped evaluation, resident shards), before and after, on the benchmark workload
(`bench_workload.py`):

  before  eval.overlap=false runtime.resident_shards=false: a torch DataLoader per fit, and the
          global evaluation of round r before round r + 1 starts
  after   the defaults: batches by index from the shard on the fit's device, and round r's
          global evaluation on a driver thread while round r + 1 trains

Alternating, `--reps` times each, for each runtime. Reports the rounds' wall time (start of
round 1 to the end of the last evaluation), the summed fit and evaluation times, the time
spent waiting for an overlapped evaluation, and whether every round's accuracy is the same.

Run: `python benchmarks/round_path.py --out benchmarks/results/round_path.json`
(`--runtimes serial,ray`, `--test 10000` for an evaluation-heavy round).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

import torch
from bench_workload import add_workload_args, overrides  # benchmarks/bench_workload.py

from fl_lightning.config import compose
from fl_lightning.runtime.runner import start_run

VARIANTS = {"before": ["eval.overlap=false", "runtime.resident_shards=false"], "after": []}


def once(args: argparse.Namespace, out: str, runtime: str, variant: str, rep: int) -> dict:
    cfg = compose([*overrides(args, out), f"runtime={runtime}", *VARIANTS[variant],
                   f"run_id={runtime}_{variant}_{rep}"])  # fmt: skip
    summary, run_dir = start_run(cfg, console=False)
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "rounds_wall_s": recs[-1]["wall_time_s"],
        "fit_s": sum(r["time_fit_s"] for r in recs),
        "eval_s": sum(r["time_eval_s"] for r in recs),
        "eval_wait_s": sum(r.get("time_eval_wait_s", 0.0) for r in recs),
        "startup_s": summary.get("startup_s"),
        "accuracy": [r["accuracy"] for r in recs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap)
    ap.add_argument("--runtimes", default="serial,ray")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/round_path.json"))
    args = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    result: dict = {
        "workload": vars(args) | {"out": str(args.out)},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
    }
    with tempfile.TemporaryDirectory() as out:
        for runtime in args.runtimes.split(","):
            runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
            for rep in range(args.reps):
                for variant in VARIANTS:  # alternating, so drift in the machine hits both
                    runs[variant].append(once(args, out, runtime, variant, rep))
            cols = ("rounds_wall_s", "fit_s", "eval_s", "eval_wait_s")
            median = {v: {k: statistics.median(r[k] for r in rs) for k in cols} for v, rs in runs.items()}
            accs = [r["accuracy"] for v in runs.values() for r in v]
            result[runtime] = {
                "runs": runs,
                "median": median,
                "ratio_after_vs_before": median["after"]["rounds_wall_s"] / median["before"]["rounds_wall_s"],
                "same_accuracy": all(a == accs[0] for a in accs),
            }
            keys = ("median", "ratio_after_vs_before", "same_accuracy")
            print(runtime, json.dumps({k: result[runtime][k] for k in keys}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
