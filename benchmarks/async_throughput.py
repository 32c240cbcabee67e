"""Client updates a second: FedBuff against synchronous rounds with the same stragglers.

Workload (default): Fashion-MNIST, 20 clients × 100 training images, FedAvg's CNN at narrow
width, 1 local epoch, batch 32; the clients' hardware: `system.seconds_per_example=0.01`, speed
tiers 1× and 8× (half the clients are stragglers), exponential noise per update. Two server
modes over the same number of client updates:

  sync     rounds of 10 clients, each round ending at its slowest client (FedAvgM)
  fedbuff  10 clients in flight, a server step every 5 updates (FedAvgM, s(τ) = 1/sqrt(1+τ))

For each: client updates per wall-clock second of the run's loop (what the engine sustains on
this machine: Ray keeps its actors busy while the server steps) and per virtual second (what
the simulated deployment would see: FedBuff does not wait for stragglers), and the final
accuracy at that virtual time. Writes JSON.

Run: `python benchmarks/async_throughput.py --out benchmarks/results/async_throughput.json`
(`--runtime serial` for the driver alone; `--updates 60` sets the updates of each mode).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from fl_lightning.config import compose
from fl_lightning.runtime.runner import start_run

WORKLOAD = [
    "data=fmnist", "data.train_subset=2000", "data.test_subset=500", "fl.num_clients=20",
    "fl.batch_size=32", "model.channels=[8,16]", "model.hidden=64", "logger=none", "method=fedavgm",
    "method.server_momentum=0.9", "system.seconds_per_example=0.01", "system.speed=tiers",
    "system.tiers=[1,8]", "system.noise=exponential", "eval.every=1000",
]  # fmt: skip


def mode_args(mode: str, updates: int) -> list[str]:
    if mode == "sync":
        return ["fl.clients_per_round=10", f"fl.rounds={updates // 10}"]
    return ["system.mode=fedbuff", "system.concurrency=10", "system.buffer=5", f"fl.rounds={updates // 5}"]


def run_mode(mode: str, runtime: str, updates: int, out: str) -> dict:
    cfg = compose([*WORKLOAD, *mode_args(mode, updates), f"runtime={runtime}", f"output_dir={out}",
                   f"run_id={mode}"])  # fmt: skip
    t0 = time.perf_counter()
    summary, run_dir = start_run(cfg, console=False)
    wall = time.perf_counter() - t0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    done = sum(int(x["clients"]) for x in lines)
    loop = sum(float(x.get("round_time_s", 0.0)) for x in lines)
    vtime = float(lines[-1]["virtual_time"])
    return {
        "mode": mode,
        "server_steps": len(lines),
        "client_updates": done,
        "run_wall_s": round(wall, 3),
        "loop_wall_s": round(loop, 3),
        "updates_per_wall_s": round(done / loop, 3) if loop else None,
        "virtual_time_s": round(vtime, 3),
        "updates_per_virtual_s": round(done / vtime, 4) if vtime else None,
        "final_accuracy": summary.get("final_accuracy"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/async_throughput.json")
    ap.add_argument("--runtime", default="ray", choices=["ray", "serial"])
    ap.add_argument("--updates", type=int, default=60)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [run_mode(m, args.runtime, args.updates, tmp) for m in ("sync", "fedbuff")]
    doc = {
        "benchmark": "async_throughput",
        "runtime": args.runtime,
        "workload": WORKLOAD,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "results": results,
        "fedbuff_over_sync_virtual": round(
            results[1]["updates_per_virtual_s"] / results[0]["updates_per_virtual_s"], 3
        ),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
