"""Engine overhead: the same federated workload through fl_lightning and a plain loop.

Workload (default): Fashion-MNIST, 10 clients × 600 training images (IID), FedAvg's CNN,
1 local epoch, batch 32, SGD(0.05, momentum 0.9), 5 rounds, global evaluation on 2,000
test images each round. Three ways:

  plain   one process, plain PyTorch loops, same seeds and arithmetic as the engine
  serial  fl_lightning with runtime=serial (Lightning Trainer per fit, no Ray)
  ray     fl_lightning with runtime=ray (local Ray, client actors, ray.put/ray.wait)

Writes JSON with wall times, per-phase times, their ratios and peak driver memory.
Run: `python benchmarks/engine_overhead.py --out benchmarks/results/engine_overhead.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_workload import add_workload_args, overrides  # benchmarks/bench_workload.py
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning.config import compose
from fl_lightning.core.metrics import EvalSpec, TaskMetrics
from fl_lightning.core.params import to_cpu, weighted_mean
from fl_lightning.core.strategy import client_seed, round_rng
from fl_lightning.runtime.build import prepare
from fl_lightning.runtime.runner import start_run


@torch.no_grad()
def plain_accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> float:
    """The plain loop's evaluation: the same metric code as the engine's (core/metrics.py)."""
    model.eval()
    metrics = TaskMetrics(EvalSpec(num_classes=10))
    for i in range(0, len(y), batch_size):
        metrics.update(model(x[i : i + batch_size]), y[i : i + batch_size])
    model.train()
    return metrics.compute()["accuracy"]


def plain_loop(args: argparse.Namespace, out: str) -> dict:
    """FedAvg written directly in PyTorch, reusing only data loading and the model."""
    p = prepare(compose([*overrides(args, out), "runtime=serial"]))
    ds, split, spec = p.dataset, p.split, p.spec
    shards = {c: ds.tensors(ds.train_x[i], ds.train_y[i]) for c, i in enumerate(split.train)}
    test = ds.tensors(ds.test_x, ds.test_y)
    from fl_lightning.models import build_model

    model = build_model(spec.model, spec.num_classes, spec.in_channels, spec.image_size, **spec.model_kwargs)
    glob = dict(p.init_params)
    torch.set_num_threads(args.threads)
    phases = {"fit": 0.0, "server": 0.0, "eval": 0.0}
    accs = []
    start = time.perf_counter()
    for rnd in range(1, args.rounds + 1):
        t0 = time.perf_counter()
        clients = p.strategy.sample_clients(rnd, round_rng(args.seed, rnd))
        states, weights = [], []
        for c in clients:
            seed = client_seed(args.seed, rnd, c)
            torch.manual_seed(seed)
            model.load_state_dict(glob)
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            loader = DataLoader(TensorDataset(*shards[c]), batch_size=32, shuffle=True,
                                generator=torch.Generator().manual_seed(seed))  # fmt: skip
            model.train()
            for x, y in loader:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            states.append(to_cpu(model.state_dict()))
            weights.append(len(shards[c][1]))
        t1 = time.perf_counter()
        glob = weighted_mean(states, weights)
        t2 = time.perf_counter()
        model.load_state_dict(glob)
        accs.append(plain_accuracy(model, *test))
        t3 = time.perf_counter()
        phases["fit"] += t1 - t0
        phases["server"] += t2 - t1
        phases["eval"] += t3 - t2
    return {"wall_s": time.perf_counter() - start, "phases_s": phases, "accuracy": accs}


def engine(args: argparse.Namespace, out: str, runtime: str) -> dict:
    cfg = compose([*overrides(args, out), f"runtime={runtime}", f"run_id={runtime}"])
    t0 = time.perf_counter()
    summary, run_dir = start_run(cfg, console=False)
    total = time.perf_counter() - t0
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    phases = {k: sum(r[f"time_{k}_s"] for r in recs) for k in ("fit", "server", "eval")}
    rounds_s = sum(r["round_time_s"] for r in recs)
    return {
        "wall_s": rounds_s,  # the rounds themselves, comparable with `plain`
        "startup_s": total - rounds_s,  # data, partition, Ray start, actors ready, teardown
        "phases_s": phases,
        "accuracy": [r["accuracy"] for r in recs],
        "num_actors": summary["num_actors"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_overhead.json"))
    args = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    with tempfile.TemporaryDirectory() as out:
        plain = plain_loop(args, out)
        serial = engine(args, out, "serial")
        ray_ = engine(args, out, "ray")
    result = {
        "workload": vars(args) | {"out": str(args.out)},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
        "plain": plain,
        "serial": serial,
        "ray": ray_,
        "ratio_serial_vs_plain": serial["wall_s"] / plain["wall_s"],
        "ratio_ray_vs_plain": ray_["wall_s"] / plain["wall_s"],
        "same_accuracy_all_three": plain["accuracy"] == serial["accuracy"] == ray_["accuracy"],
        "peak_driver_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {k: result[k] for k in ("ratio_serial_vs_plain", "ratio_ray_vs_plain", "same_accuracy_all_three")}
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
