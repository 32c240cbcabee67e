"""A cold `fl-lightning run` (`runtime=ray`, private local Ray; `--runtime gpu`: runtime=gpu) with
and without one start-up measure, alternating, each a fresh process.

`--toggle early_start` (default): `runtime.early_start`, i.e. Ray and the run's client workers
start while the driver imports torch and Lightning (`fl_lightning/runtime/early.py`), or one
after the other. `--toggle lean_imports`: `FL_LIGHTNING_LEAN_IMPORTS=1` or `0`, i.e. the driver
and the workers import torchmetrics without its optional backends, or as it comes
(`fl_lightning/lean_imports.py`). Workload
(`bench_workload.py`): Fashion-MNIST, 10 IID clients x 600 images, FedAvg's CNN, 1 local
epoch, batch 32, evaluation on 2,000 test images, here `--rounds` rounds (default 1: start-up
is what is measured). Per run: the process's wall time (Python start to exit), and from its
summary.json `startup_s` (from before the CLI reads the config to the first round),
`actors_prestarted`, the rounds' wall time and the final accuracy (the same either way).

Run: `python benchmarks/cold_start.py --reps 3 --out benchmarks/results/cold_start.json`
(`--toggle lean_imports --out benchmarks/results/cold_start_lean.json` for the other measure)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_workload import add_workload_args, overrides
from driver_memory import cli, machine

REPO = Path(__file__).resolve().parent.parent


def one(args: argparse.Namespace, tmp: str, on: bool, rep: int) -> dict[str, Any]:
    run_id = f"{args.toggle}_{'on' if on else 'off'}_{rep}"
    ov = [
        *overrides(args, tmp),
        f"runtime={args.runtime}",
        *args.override,
        "experiment=cold",
        f"run_id={run_id}",
        "--quiet",
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    if args.toggle == "early_start":
        ov.append(f"runtime.early_start={str(on).lower()}")
    else:
        env["FL_LIGHTNING_LEAN_IMPORTS"] = "1" if on else "0"
    t0 = time.perf_counter()
    subprocess.run([*cli(), "run", *ov], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    s = json.loads((Path(tmp) / "cold" / run_id / "summary.json").read_text())
    return {
        args.toggle: on, "rep": rep, "process_wall_s": wall, "startup_s": s["startup_s"],
        "actors_prestarted": s["actors_prestarted"], "num_actors": s["num_actors"],
        "rounds_wall_s": s["wall_time_s"], "final_accuracy": s["final_accuracy"],
        "startup_phases_s": s.get("startup_phases_s"),  # prepared, workers_ready, first_round
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap)
    ap.set_defaults(rounds=1)
    ap.add_argument("--reps", type=int, default=3, help="runs per way, alternating")
    ap.add_argument("--toggle", choices=("early_start", "lean_imports"), default="early_start")
    ap.add_argument("--runtime", choices=("ray", "gpu"), default="ray", help="runtime=ray, or runtime=gpu")
    ap.add_argument("--override", action="append", default=[], help="one more key=value (repeatable)")
    ap.add_argument("--out", default="benchmarks/results/cold_start.json")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = (True, False) if rep % 2 == 0 else (False, True)
            for on in order:
                runs.append(one(args, tmp, on, rep))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    table: dict[str, Any] = {}
    print(f"{args.toggle:12} {'process s (median, min-max)':>30} {'startup_s (median)':>20}  accuracy")
    for on in (True, False):
        rs = [r for r in runs if r[args.toggle] is on]
        walls, ups = [r["process_wall_s"] for r in rs], [r["startup_s"] for r in rs]
        table[str(on).lower()] = {
            "process_wall_s_median": statistics.median(walls), "startup_s_median": statistics.median(ups),
        }  # fmt: skip
        print(f"{str(on).lower():12} {statistics.median(walls):12.2f} ({min(walls):.2f}-{max(walls):.2f})"
              f" {statistics.median(ups):20.2f}  {sorted({r['final_accuracy'] for r in rs})}")  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "args": vars(args), "runs": runs, "medians": table},
                              indent=1) + "\n")  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
