"""`fl-lightning reproduce <paper> --scale paper --estimate`: what a reproduction would cost here.

For each row it times a few real training steps of the row's backbone (the model its config
builds, at its batch size, SGD, on this machine's GPU if there is one, else the CPU) on
synthetic tensors of the dataset's shape (the paper's data need not be here), then projects:

    steps a round = clients a round x ceil(images a client / batch size) x local epochs
    (or the local steps), images a client = training images / clients;
    wall time of a run = steps a round x rounds x seconds a step;
    device-hours = wall time x seeds (each run on one device).

What it does not time, so the projection is a lower bound: the method's own terms beyond the
backbone's (text encoders, prototypes, distillation), server steps (CLIP2FL's federated
features, FedTSP's prompt tuning), evaluation, data loading and communication. Every number it
prints is a projection and says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from ..config import RootConfig, compose
from ..core.errors import ConfigError

#: (channels, image size, training images) of the datasets the paper scales name, as their
#: loaders give them (sizes: the published training splits); `data.image_size`,
#: `data.train_subset` and a long-tailed `data.imbalance_factor` change them
SHAPES: dict[str, tuple[int, int, int]] = {
    "fmnist": (1, 28, 60000), "mnist": (1, 28, 60000), "digits": (1, 8, 1437),
    "cifar10": (3, 32, 50000), "cifar100": (3, 32, 50000), "cifar10_lt": (3, 32, 50000),
    "cifar100_lt": (3, 32, 50000), "flair": (3, 256, 345000),  # FLAIR: ~345k (docs/data.md)
    "tiny_imagenet": (3, 64, 100000), "fmnist_multilabel": (1, 56, 60000),
    "voc2007": (3, 128, 5011), "coco": (3, 128, 82081),  # VOC 2007 trainval; COCO train2014 (annotated)
    "office_caltech": (3, 256, 2533),  # all four domains (958 + 1,123 + 157 + 295): the split trains on part
    # issue 37's 20 classes: the 8,000 client images (the held-out part is not trained on), and
    # as frozen EfficientNet-Lite0 features, [1280, 1, 1] a sample
    "fmnist_digits20": (1, 28, 8000), "fmnist_digits20_eff": (1280, 1, 8000),
    "fmnist_digits20_mosaic": (1, 56, 3000),  # its themed mosaics (E4)
}  # fmt: skip
#: class counts of the datasets whose names are known only once loaded
CLASSES = {
    "cifar100": 100,
    "cifar100_lt": 100,
    "flair": 17,
    "voc2007": 20,
    "coco": 80,
    "fmnist_digits20_mosaic": 20,
}
STEPS_TIMED = 3
REPEATS = 3


def train_images(cfg: RootConfig) -> int | None:
    name = str(cfg.data.name)
    if name not in SHAPES:
        return None
    n = SHAPES[name][2]
    factor = float(cfg.data.imbalance_factor or 1.0)
    if factor > 1 and name.startswith("cifar"):  # the long-tailed profile n_c = n_max * IF^(-c/(K-1))
        k = 100 if name.startswith("cifar100") else 10
        n = sum(int(n // k * factor ** (-c / (k - 1))) for c in range(k))
    subset = cfg.data.train_subset
    return min(n, int(subset)) if subset else n


def steps_per_round(cfg: RootConfig, n: int) -> int:
    fl = cfg.fl
    clients = int(fl.num_clients)
    per_round = int(fl.clients_per_round) if fl.clients_per_round else math.ceil(float(fl.fraction) * clients)
    each = math.ceil(n / clients)
    local = (
        int(fl.local_steps) if fl.local_steps else int(fl.local_epochs) * math.ceil(each / int(fl.batch_size))
    )
    return per_round * local


def seconds_per_step(cfg: RootConfig, device: str, cache: dict[Any, float] | None = None) -> float:
    """Wall time of one SGD step of the row's backbone (client 0's, in a family of models) on
    a synthetic batch: the median of REPEATS timings of STEPS_TIMED steps (a shared machine's
    noise); rows with the same backbone, shape and batch share one timing (`cache`)."""
    import torch

    from ..data.registry import DATASETS
    from ..models import build_client_model
    from .pretrain import model_kwargs

    name = str(cfg.data.name)
    if name not in SHAPES:
        raise ConfigError(f"no shape known for dataset {name!r} (estimate knows {', '.join(SHAPES)})")
    channels, size, _ = SHAPES[name]
    size = int(cfg.data.image_size or size)
    entry = DATASETS.get(name)
    classes = len(entry.class_names) if entry.class_names else CLASSES.get(name, 10)
    kwargs = {k: v for k, v in model_kwargs(cfg).items() if k != "weights"}
    model_name = str(cfg.model["name"])
    key = (model_name, repr(sorted(kwargs.items())), channels, size, classes, int(cfg.fl.batch_size))
    if cache is not None and key in cache:
        return cache[key]
    model = build_client_model(model_name, 0, classes, channels, size, **kwargs).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    batch = int(cfg.fl.batch_size)
    x = torch.rand((batch, channels, size, size), generator=gen).to(device)
    y = torch.randint(0, classes, (batch,), generator=gen).to(device)

    def step() -> None:
        opt.zero_grad()
        out = model(x)
        logits = out[0] if isinstance(out, tuple) else out
        torch.nn.functional.cross_entropy(logits, y).backward()
        opt.step()

    step()  # warm-up: allocation, cudnn's choice of kernels
    times = []
    for _ in range(REPEATS):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(STEPS_TIMED):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / STEPS_TIMED)
    seconds = sorted(times)[REPEATS // 2]
    if cache is not None:
        cache[key] = seconds
    return seconds


def estimate_lines(rows: Sequence[tuple[str, list[str]]], seeds: int) -> list[str]:
    """One line per row (`(label, overrides)`) and the total, every number labelled."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    lines = [
        f"estimate on this machine ({where}): backbone SGD steps timed on synthetic tensors of each "
        f"dataset's shape (median of {REPEATS} x {STEPS_TIMED} steps after a warm-up; client 0's model of a "
        "family); projected = steps a round x rounds x "
        "seconds a step, a lower bound (method terms, server steps, evaluation, data loading not timed)",
        f"{'row':28s} {'s/step':>8s} {'steps/round':>11s} {'rounds':>7s} {'projected h/run':>15s} "
        f"{'seeds':>5s} {'projected device-h':>18s}",
    ]
    total, projected = 0.0, 0
    cache: dict[Any, float] = {}
    for label, args in rows:
        try:
            cfg = compose(args)
            n = train_images(cfg)
            t = seconds_per_step(cfg, device, cache)
        except (ConfigError, RuntimeError, TypeError, ValueError) as e:
            lines.append(f"{label[:28]:28s} not timed: {str(e).splitlines()[0][:120]}")
            continue
        if n is None:
            lines.append(f"{label[:28]:28s} {t:8.4f}  (training set size unknown: no projection)")
            continue
        steps = steps_per_round(cfg, n)
        hours = steps * int(cfg.fl.rounds) * t / 3600
        total += hours * seeds
        projected += 1
        lines.append(
            f"{label[:28]:28s} {t:8.4f} {steps:11d} {int(cfg.fl.rounds):7d} {hours:15.2f} {seeds:5d} "
            f"{hours * seeds:18.2f}"
        )
    if projected == 0:  # a 0.00 total would read as free
        lines.append(f"{'total':28s} none: no row could be projected (above, why)")
        return lines
    lines.append(f"{'total (projected)':28s} {'':8s} {'':11s} {'':7s} {'':15s} {'':5s} {total:18.2f}")
    if projected < len(rows):
        lines.append(f"{'':28s} ({projected} of {len(rows)} rows projected; the rest are not in the total)")
    return lines
