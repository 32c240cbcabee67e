"""Start-up in a sweep: N runs of the benchmark workload one after another, two ways.

  cold   N separate `fl-lightning run` processes (each starts Python, imports, starts a
         local Ray and its client workers, which import Lightning and torchmetrics)
  sweep  one `fl-lightning sweep seed=0,...,N-1` process: Ray starts once and the finished
         run's client workers are set up again for the next run (`runtime/ray_executor.py`,
         `reuse_actors`)

Workload (`bench_workload.py`): Fashion-MNIST, 10 IID clients x 600 images, FedAvg's CNN,
1 local epoch, batch 32, server evaluation on 2,000 test images, here `--rounds` rounds
(default 2: start-up is what is measured), `runtime=ray` on the CPU, seeds 0..N-1.

Per run: `startup_s` from its summary.json (from the run's start, before its data is
loaded, to its first round), `actors_reused`, `wall_time_s` (the rounds); per way: the
total wall time of all N runs, process starts included. Writes JSON; prints a table.

Run: `python benchmarks/sweep_startup.py --runs 3 --out benchmarks/results/sweep_startup.json`
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_workload import add_workload_args, overrides
from driver_memory import cli, machine

REPO = Path(__file__).resolve().parent.parent


def summaries(exp_dir: Path) -> list[dict[str, Any]]:
    runs = [json.loads(p.read_text()) for p in exp_dir.glob("*/summary.json")]
    return sorted(runs, key=lambda s: s["seed"])


def per_run(s: dict[str, Any]) -> dict[str, Any]:
    keys = ("seed", "startup_s", "actors_reused", "num_actors", "wall_time_s", "final_accuracy")
    return {k: s.get(k) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap)
    ap.set_defaults(rounds=2)
    ap.add_argument("--runs", type=int, default=3, help="runs per way (seeds 0..runs-1)")
    ap.add_argument("--out", default="benchmarks/results/sweep_startup.json")
    args = ap.parse_args()
    env = {**os.environ, "WANDB_MODE": "disabled"}
    given = {k: v for k, v in vars(args).items() if k != "seed"}  # seeds: 0..runs-1
    result: dict[str, Any] = {"machine": machine(), "args": given, "ways": {}}
    with tempfile.TemporaryDirectory() as tmp:
        seeds = list(range(args.runs))
        # cold: one process per run
        t0 = time.time()
        for seed in seeds:
            args.seed = seed
            ov = [*overrides(args, tmp), "runtime=ray", "experiment=cold", f"run_id=s{seed}", "--quiet"]
            subprocess.run([*cli(), "run", *ov], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
        cold_total = time.time() - t0
        # sweep: one process, one Ray, warm workers
        args.seed = 0
        ov = [o for o in overrides(args, tmp) if not o.startswith("seed=")]
        t0 = time.time()
        subprocess.run(
            [*cli(), "sweep", f"seed={','.join(map(str, seeds))}", *ov, "runtime=ray", "experiment=sweep",
             "--no-plots"],
            cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        sweep_total = time.time() - t0
        for way, total in (("cold", cold_total), ("sweep", sweep_total)):
            runs = [per_run(s) for s in summaries(Path(tmp) / way)]
            result["ways"][way] = {"total_s": total, "runs": runs}
    print(f"{'way':6} {'total s':>8}  start-up s per run (actors reused)")
    for way, r in result["ways"].items():
        ups = "  ".join(f"{x['startup_s']:.1f} ({x['actors_reused']})" for x in r["runs"])
        print(f"{way:6} {r['total_s']:8.1f}  {ups}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
