"""What keeping a frozen image tower's features with each client's shard saves: PromptFL's
local training (`model=clip_prompt`, CoOp's 16 shared context vectors) through a real
`ClientHost` and the Lightning Trainer, with `model.cache_features` true (each image through
the image tower once per run, then the prompt trains on the features) and false (the tower
runs on every batch of every epoch), on Fashion-MNIST, one thread.

The updates are the same either way (tests/test_prompt.py); only the time differs. Round 1
pays for the features; later rounds reuse them. The tower is random (pretrained=None): its
cost, not its weights, is what is measured.

Run: `python benchmarks/prompt_features.py --out benchmarks/results/prompt_features.json`
(the tiny test architecture, `clip-tiny-random`; `--arch RN50` or `ViT-B-16` for a CLIP-sized
tower; no other work on the machine for numbers worth comparing).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch
from bench_workload import emit  # benchmarks/bench_workload.py

from fl_lightning.core.optim import OptimConfig
from fl_lightning.core.strategy import TaskInfo, round_rng
from fl_lightning.data.registry import load_dataset
from fl_lightning.methods import METHODS
from fl_lightning.models.clip_prompt import CLIPPrompt
from fl_lightning.runtime.host import ClientHost, ClientSpec
from fl_lightning.runtime.summary import cpu_model


def rounds_s(args: argparse.Namespace, cache: bool) -> list[float]:
    """Seconds of each round's client fits (all clients, one after another)."""
    ds = load_dataset("fmnist", os.environ.get("FL_LIGHTNING_DATA", "")).subset(
        args.clients * args.per_client, 10
    )
    shards = {c: np.arange(c * args.per_client, (c + 1) * args.per_client) for c in range(args.clients)}
    names = tuple(ds.class_names)
    task = TaskInfo(num_classes=10, class_names=names, image_mean=(0.286,), image_std=(0.353,))
    cls = METHODS.get("promptfl")
    strategy = cls(cls.config_cls(), args.clients, args.clients, 0, task)
    given = {"arch": args.arch, "pretrained": None, "n_ctx": 16, "cache_features": cache}
    kwargs = strategy.model_kwargs("clip_prompt", given)
    torch.manual_seed(0)
    init = CLIPPrompt(10, 1, 28, **kwargs).state_dict()
    spec = ClientSpec(method="promptfl", objective_kwargs={}, model="clip_prompt", model_kwargs=kwargs,
                      optim=OptimConfig(lr=0.002, momentum=0.9), num_classes=10, in_channels=1,
                      image_size=28, batch_size=16, local_epochs=args.epochs, threads=1,
                      init_params=init)  # fmt: skip
    host = ClientHost(spec, ds, shards)
    state, out = strategy.init_state(init), []
    for rnd in range(1, args.rounds + 1):
        plan = strategy.configure_round(state, rnd, round_rng(0, rnd))
        t = time.perf_counter()
        updates = [host.fit(plan.broadcast, p) for p in plan.payloads]
        out.append(time.perf_counter() - t)
        state = strategy.aggregate(state, updates)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="clip-tiny-random")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--per-client", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    out: dict = {
        "machine": cpu_model(), "python": platform.python_version(), "torch": torch.__version__,
        "threads": 1, **{k: v for k, v in vars(args).items() if k != "out"},
        "load_average_before": os.getloadavg()[0],
    }  # fmt: skip
    for cache in (False, True):
        times = rounds_s(args, cache)
        out["cached" if cache else "uncached"] = {"round_s": [round(t, 3) for t in times]}
        print(f"cache_features={cache}: " + ", ".join(f"{t:.2f}s" for t in times), flush=True)
    un, ca = out["uncached"]["round_s"], out["cached"]["round_s"]
    out["speedup_later_rounds"] = round(sum(un[1:]) / max(sum(ca[1:]), 1e-9), 2)
    out["speedup_whole_run"] = round(sum(un) / max(sum(ca), 1e-9), 2)
    out["load_average_after"] = os.getloadavg()[0]  # other work on the machine inflates the times
    emit(out, args.out)


if __name__ == "__main__":
    main()
