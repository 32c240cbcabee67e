"""What secure aggregation costs per round, against the plain aggregation it replaces: bytes and
time for cohorts of 10 to 1,000 clients, with and without dropouts (`core/secagg.py`,
`docs/secagg.md`).

Each cohort sends updates of `--dim` float32 coordinates (default 10,000: a prompt or adapter;
FedAvg's CNN at full width is larger) from random deltas. Per cohort and dropout fraction:

  plain    the chain without steps (`Aggregator`): the example-weighted mean of the updates
  secagg   `aggregator.steps=[secagg_plus]` at Flower's numbers (clip ±8, 2^22 levels, 2^32),
           SecAgg+'s graph of k = 2·⌈log2 n⌉ neighbours (every other client when n ≤ k + 1),
           threshold a majority of the k + 1 holders

Time: `client_s`, one client's work (keys, shares, quantising, masking, answering the unmask
request: the clients are run one after another in this process, so it is their total / n);
`server_s`, the server's (routing, summing, unmasking, rebuilding the dropped clients' masks);
`plain_s`, the plain mean. Bytes: `up_bytes`, every client's upload summed (secagg: log2 M bits
a coordinate, two public keys, the encrypted shares, the dropped clients' shares included, and
the shares the survivors reveal to unmask); `plain_up_bytes`, the surviving clients' updates at
4 bytes a coordinate; `down_bytes`, what the secure server sends beyond the model (rosters,
routed shares, unmask requests). The model's broadcast is the same either way and not counted.
One process, one thread; times are this machine's, the median of `--reps`.

Run: `python benchmarks/secagg.py --out benchmarks/results/secagg.json`
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time

import torch
from bench_workload import emit  # benchmarks/bench_workload.py

from fl_lightning.core.aggregation import Aggregator, aggregate_chain
from fl_lightning.core.messages import ClientUpdate, ServerState
from fl_lightning.core.secagg import MaskedUpdate, SecAggParams, SecAggPlus, SecureAggregator
from fl_lightning.core.strategy import ServerContext, TaskInfo, server_rng
from fl_lightning.testing import Toy


def cohort(n: int, dim: int, seed: int) -> tuple[ServerState, list[ClientUpdate]]:
    g = torch.Generator().manual_seed(seed)
    base = {"w": torch.zeros(dim)}
    ups = [ClientUpdate(c, 100 + c % 50, {"w": 0.01 * torch.randn(dim, generator=g)}) for c in range(n)]
    return ServerState(round=0, global_params=base), ups


def neighbours(n: int) -> int:
    return 2 * math.ceil(math.log2(n))


def once(n: int, dim: int, dropout: float, seed: int) -> dict:
    state, ups = cohort(n, dim, seed)
    ctx = ServerContext(1, torch.device("cpu"), server_rng(seed, 1), TaskInfo(num_classes=10), Toy, seed=seed)
    t0 = time.perf_counter()
    plain = aggregate_chain(Aggregator(), state, ups, None).global_params
    plain_s = time.perf_counter() - t0
    p = SecAggParams(neighbours=neighbours(n), dropout=dropout, max_weight=150.0)
    agg = SecureAggregator([SecAggPlus(p)])
    t0 = time.perf_counter()
    masked = agg.upload(state, ups, ctx)
    t1 = time.perf_counter()
    server = agg._sessions[1]
    acc = agg.start(state, ctx)
    for u in masked:
        acc = agg.add(acc, u, ctx)
    params, _, metrics = agg.result(acc, state, ctx)
    t2 = time.perf_counter()
    assert params is not None and plain is not None
    survivors = [u for u in ups if u.client_id in server.survivors]
    w = sum(u.num_examples for u in survivors)
    exact = sum(u.num_examples * u.params["w"].double() for u in survivors if u.params) / w
    err = float((params["w"].double() - exact).abs().max())
    return {
        "clients": n,
        "dropout": dropout,
        "dropped": int(metrics["secagg_plus/dropped"]),
        "neighbours": server.p.degree(n),
        "threshold": server.t,
        "plain_s": plain_s,
        "client_s": (t1 - t0 + server.clients_s) / n,
        "server_s": t2 - t1 - server.clients_s,
        "plain_up_bytes": 4 * dim * len(survivors),  # the same clients' updates, unmasked
        "up_bytes": sum(u.upload_nbytes() for u in masked if isinstance(u, MaskedUpdate)) + server.bytes_up,
        "down_bytes": server.bytes_down,
        "max_error": err,
        "error_bound": len(survivors) * p.step * 150.0 / w,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cohorts", default="10,30,100,300,1000")
    ap.add_argument("--dropouts", default="0,0.1")
    ap.add_argument("--dim", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for n in (int(x) for x in args.cohorts.split(",")):
        for dropout in (float(x) for x in args.dropouts.split(",")):
            reps = [once(n, args.dim, dropout, args.seed + r) for r in range(args.reps)]
            row = dict(reps[0])
            for k in ("plain_s", "client_s", "server_s"):
                row[k] = statistics.median(r[k] for r in reps)
            row["bytes_ratio"] = row["up_bytes"] / row["plain_up_bytes"]
            rows.append(row)
            print(
                f"n={n:5d} dropout={dropout:.2f} dropped={row['dropped']:3d} k={row['neighbours']:3d} "
                f"t={row['threshold']:3d} plain {row['plain_s'] * 1e3:8.1f} ms  "
                f"client {row['client_s'] * 1e3:7.1f} ms  "
                f"server {row['server_s']:7.2f} s  up x{row['bytes_ratio']:.3f}  "
                f"err {row['max_error']:.2e} <= {row['error_bound']:.2e}",
                flush=True,
            )
    emit(
        {
            "workload": vars(args),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "threads": 1,
            },
            "rows": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
