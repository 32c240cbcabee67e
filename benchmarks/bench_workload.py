"""The benchmark workload shared by `engine_overhead.py` and `vs_flower.py` (and the Flower side,
`flower_app.py`): Fashion-MNIST, 10 IID clients x 600 images, FedAvg's CNN, 1 local epoch,
batch 32, SGD(0.05, momentum 0.9), 5 rounds, server evaluation on 2,000 test images each round.

Standard library only: Ray actors and freshly started measured processes import it, and it
must cost them nothing.
"""

from __future__ import annotations

import argparse


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    """The workload's command-line options (same names and defaults in every benchmark)."""
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--per-client", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per client fit")


def overrides(args: argparse.Namespace, out: str) -> list[str]:
    """The workload as fl_lightning config overrides (add `runtime=...`)."""
    return [
        "method=fedavg", "data=fmnist", "data.partition=iid", f"fl.num_clients={args.clients}",
        f"data.train_subset={args.clients * args.per_client}", f"data.test_subset={args.test}",
        f"fl.rounds={args.rounds}", "fl.local_epochs=1", "fl.batch_size=32", "optim.lr=0.05",
        "logger=none", f"output_dir={out}", f"seed={args.seed}", f"runtime.threads_per_client={args.threads}",
    ]  # fmt: skip


def emit(result: dict, path: str | None) -> None:
    """Print a benchmark's JSON result, and write it to `path` when given."""
    import json

    text = json.dumps(result, indent=1)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text)
