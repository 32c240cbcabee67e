"""The fixed cost a client fit adds over its compute, on the CPU with tiny clients.

Workload: Fashion-MNIST, `--clients` IID clients x `--per-client` images (default 20 x 8:
the split gives them about that many), FedAvg's CNN, batch `--batch-size` (8: a step or two a
fit), SGD(0.05, momentum 0.9), one torch thread. Two ways, in one process, `--fits` fits each
(round-robin over the clients, a fresh seed each), paired: fit k of each way back to back, the
order alternating, so that load on the machine falls on both alike:

  engine  `ClientHost.fit` as every executor calls it (objective, resident shard, the
          Lightning fit, the update's CPU copy of the weights)
  engine_new_trainer  the same with a new Lightning Trainer for the fit (the host's kept ones
          dropped first), as the host did before it kept them: this commit's before/after
          in one process
  plain   the same step in plain PyTorch: load the weights, seed, a fresh SGD, the engine's
          batches by index from the shard, forward, loss, backward, step, a CPU copy of the weights

Per way: the median µs a fit, wall and CPU (the process's: one torch thread, so CPU time is
what load on the machine disturbs least); `overhead_us_per_fit` and `cpu_overhead_us_per_fit`:
the median over k of (engine's fit k - plain's fit k); `cpu_us_saved_per_fit_by_reuse`: of
(engine_new_trainer's fit k - engine's fit k). The fingerprint covers both engine ways' fits.
`fingerprint` (SHA-256 over every engine update's weights, in order) is the same on one
machine whenever the engine computes the same numbers: compare it across commits.
`load_average` is /proc/loadavg at the start and the end: numbers under load are not quiet ones.

Run: `python benchmarks/fit_overhead.py --out benchmarks/results/fit_overhead.json`
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--per-client", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--fits", type=int, default=400, help="fits of each way")
    ap.add_argument("--label", default="", help="what this run measures (e.g. the commit), kept in the JSON")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fit_overhead.json")
    args = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    load_start = load_average()

    import torch
    import torch.nn.functional as F
    from driver_memory import machine  # benchmarks/driver_memory.py

    from fl_lightning.config import compose
    from fl_lightning.core.messages import Broadcast, ClientPayload
    from fl_lightning.core.params import to_cpu
    from fl_lightning.models import build_model
    from fl_lightning.runtime.build import prepare
    from fl_lightning.runtime.host import ClientHost, drop_last

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out:
        ov = [
            "method=fedavg", "data=fmnist", "data.partition=iid", f"fl.num_clients={args.clients}",
            f"data.train_subset={args.clients * args.per_client}", "data.test_subset=100",
            f"fl.batch_size={args.batch_size}", "optim.lr=0.05", "optim.momentum=0.9", "logger=none",
            f"output_dir={out}", "runtime=serial", "runtime.threads_per_client=1",
        ]  # fmt: skip
        p = prepare(compose(ov))
    spec = p.spec
    shards = {c: p.split.train[c] for c in range(args.clients)}
    host = ClientHost(spec, p.dataset, shards)
    glob = dict(p.init_params)
    data = {c: p.dataset.tensors(p.dataset.train_x[i], p.dataset.train_y[i]) for c, i in shards.items()}
    model = build_model(spec.model, spec.num_classes, spec.in_channels, spec.image_size, **spec.model_kwargs)
    digest = hashlib.sha256()
    fit_no = {"engine": 0, "plain": 0}  # engine_new_trainer counts as engine: one stream of seeds
    pending: list[Any] = []  # the engine's updates not yet in the fingerprint

    def engine() -> None:
        k = fit_no["engine"]
        fit_no["engine"] += 1
        c = k % args.clients
        pending.append(host.fit(Broadcast(1, glob), ClientPayload(c, 1, seed=1000 + k)))

    def fingerprint() -> None:
        # outside the timed region: SHA-256 over a CNN's 1.7 M weights is ~3 ms of CPU a fit,
        # which an earlier version of this script counted as the engine's fixed cost
        for update in pending:
            for name in sorted(update.params):
                digest.update(update.params[name].numpy().tobytes())
        pending.clear()

    def engine_new_trainer() -> None:
        getattr(host, "_trainers", {}).clear()  # a host without kept Trainers (older): as it is
        engine()

    def plain() -> None:
        k = fit_no["plain"]
        fit_no["plain"] += 1
        x, y = data[k % args.clients]
        torch.manual_seed(1000 + k)
        model.load_state_dict(glob)
        opt = torch.optim.SGD(model.parameters(), lr=spec.optim.lr, momentum=spec.optim.momentum)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1000 + k))
        model.train()
        end = len(y) - 1 if drop_last(len(y), spec.batch_size) else len(y)  # the engine's batches
        for i in range(0, end, spec.batch_size):
            idx = order[i : i + spec.batch_size]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        to_cpu(model.state_dict())

    ways = {"engine": engine, "engine_new_trainer": engine_new_trainer, "plain": plain}
    for fn in ways.values():  # warm-up: first-call costs (allocator, Lightning's first fit)
        for _ in range(5):
            fn()
            fingerprint()
    wall: dict[str, list[float]] = {w: [] for w in ways}
    cpu: dict[str, list[float]] = {w: [] for w in ways}
    for k in range(args.fits):  # paired: fit k of each way back to back, in alternating order
        for w in ways if k % 2 == 0 else list(ways)[::-1]:
            t0, c0 = time.perf_counter(), time.process_time()
            ways[w]()
            wall[w].append((time.perf_counter() - t0) * 1e6)
            cpu[w].append((time.process_time() - c0) * 1e6)
            fingerprint()

    def overhead(t: dict[str, list[float]], way: str = "engine", base: str = "plain") -> float:
        return statistics.median(e - q for e, q in zip(t[way], t[base], strict=True))

    result: dict[str, Any] = {
        "benchmark": "fit_overhead",
        "label": args.label,
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": machine(),
        "load_average": {"start": load_start, "end": load_average()},
        "us_per_fit_median": {w: statistics.median(v) for w, v in wall.items()},
        "cpu_us_per_fit_median": {w: statistics.median(v) for w, v in cpu.items()},
        "overhead_us_per_fit": overhead(wall),
        "cpu_overhead_us_per_fit": overhead(cpu),
        "cpu_overhead_us_per_fit_new_trainer": overhead(cpu, "engine_new_trainer"),
        "cpu_us_saved_per_fit_by_reuse": overhead(cpu, "engine_new_trainer", "engine"),
        "fingerprint": digest.hexdigest(),
        "engine_fits": fit_no["engine"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    keys = ("cpu_us_per_fit_median", "cpu_overhead_us_per_fit", "cpu_overhead_us_per_fit_new_trainer",
            "cpu_us_saved_per_fit_by_reuse", "fingerprint")  # fmt: skip
    print(json.dumps({k: result[k] for k in keys}))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
