"""`fl-lightning pretrain <overrides> --out FILE`: centralized training of a backbone on a
held-out part of the training set that no client sees, written as a weights file
(models/weights.py) with its test accuracy; `model.weights=FILE` then starts a run from it.

    fl-lightning pretrain data=fmnist model=cnn --out weights/fmnist_cnn.pt
    fl-lightning run +experiment=fedlgt_fmnist_lt model.weights=weights/fmnist_cnn.pt

The held-out images are training indices [holdout_from, holdout_from + holdout_size) of the
full training set (Fashion-MNIST: 55,000 to 60,000 by default, the range CLIP2FL's aligned
teacher learns from); a run keeps its clients off them with `data.train_subset=<holdout_from>`
(single images) or `data.source_subset=<holdout_from>` (the mosaics of fmnist_multilabel).
Single-label data trains with cross-entropy, multi-label with binary cross-entropy; plain SGD
with momentum 0.9 and a cosine schedule, a fixed seed. Accuracy (or C-AP) is measured on the
test set (`data.test_subset` applies), and travels in the file (`info`) into every run's
summary that loads it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ..core.centralized import fit_centralized
from ..core.errors import ConfigError

if TYPE_CHECKING:
    from ..config import RootConfig


@dataclass(frozen=True)
class PretrainConfig:
    holdout_from: int = 55000  # the first training index it learns from
    holdout_size: int | None = None  # how many from there (None: to the end)
    epochs: int = 10
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    batch_size: int = 64
    seed: int = 0

    def check(self) -> None:
        if self.holdout_from < 0 or (self.holdout_size is not None and self.holdout_size < 1):
            raise ConfigError("--holdout-from must be >= 0 and --holdout-size >= 1")
        if self.epochs < 1 or self.batch_size < 2 or not self.lr > 0 or not 0 <= self.momentum < 1:
            raise ConfigError("--epochs >= 1, --batch-size >= 2, --lr > 0 and 0 <= --momentum < 1")
        if self.weight_decay < 0 or self.seed < 0:
            raise ConfigError("--weight-decay and --seed must be >= 0")


def model_kwargs(cfg: RootConfig) -> dict[str, Any]:
    """The builder's arguments of `cfg.model`."""
    from ..models.weights import MODEL_GENERIC_KEYS

    return {str(k): v for k, v in cfg.model.items() if k not in MODEL_GENERIC_KEYS}


def pretrain(cfg: RootConfig, pc: PretrainConfig) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Train `cfg.model` on the held-out training images of `cfg.data`; (model, info)."""
    from ..core.metrics import EvalSpec, TaskMetrics, primary_metric
    from ..data.registry import load_from_config
    from ..models import build_model

    ds = load_from_config(replace(cfg.data, train_subset=None))
    name = str(cfg.model["name"])
    n = len(ds.train_y)
    stop = n if pc.holdout_size is None else min(n, pc.holdout_from + pc.holdout_size)
    if pc.holdout_from >= n or stop <= pc.holdout_from:
        raise ConfigError(
            f"hold-out [{pc.holdout_from}, {stop}) is empty: {cfg.data.name} has {n} training images"
        )
    x, y = ds.tensors(ds.train_x[pc.holdout_from : stop], ds.train_y[pc.holdout_from : stop])
    kwargs = model_kwargs(cfg)
    spec = EvalSpec(ds.num_classes, multilabel=ds.multilabel)

    def loss_fn(model: torch.nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        out = model(xb)
        return F.binary_cross_entropy_with_logits(out, yb) if ds.multilabel else F.cross_entropy(out, yb)

    start = time.perf_counter()
    model = fit_centralized(
        lambda: build_model(name, ds.num_classes, ds.in_channels, ds.image_size, **kwargs),
        loss_fn, x, y, epochs=pc.epochs, lr=pc.lr, momentum=pc.momentum, weight_decay=pc.weight_decay,
        batch_size=pc.batch_size, seed=pc.seed, what=f"pretrain {name} ({len(y)} images)",
        shorten="shorter: --epochs or --holdout-size",
    )  # fmt: skip
    metrics = TaskMetrics(spec)
    tx, ty = ds.tensors(ds.test_x, ds.test_y)
    with torch.no_grad():
        for i in range(0, len(ty), 1000):
            metrics.update(model(tx[i : i + 1000]), ty[i : i + 1000])
    scores = metrics.compute()
    metric = primary_metric(spec)
    info = {
        "dataset": cfg.data.name, "arch": name, "train_range": [pc.holdout_from, stop],
        "train_images": int(len(y)), "test_images": int(len(ty)), "metric": metric,
        "held_out_" + metric: scores[metric], "pretrain": asdict(pc),
        "in_channels": ds.in_channels, "image_size": ds.image_size, "num_classes": ds.num_classes,
        "time_s": round(time.perf_counter() - start, 1),
    }  # fmt: skip
    return model, info


def pretrain_command(overrides: list[str], out: str | None, pc: PretrainConfig) -> int:
    from ..config import compose, validate_registered
    from ..data.registry import check_data
    from ..models.weights import save_weights
    from ..runtime.lock import check_output_dir

    if not out:
        raise ConfigError("fl-lightning pretrain needs --out FILE (where the weights file goes)")
    path = Path(out).expanduser()
    if path.is_dir() or (path.exists() and not path.is_file()):
        raise ConfigError(f"--out {out} is a folder, not a file path")
    check_output_dir(path.parent, out, "--out")  # below a file, not writable: before the training
    pc.check()
    cfg = compose(overrides)
    validate_registered(cfg)  # model keys, data names: one line before any training
    check_data(cfg.data)
    model, info = pretrain(cfg, pc)
    save_weights(path, model, info["arch"], model_kwargs(cfg), info)
    lo, hi = info["train_range"]
    metric = info["metric"]
    print(
        f"pretrained {info['arch']} on {cfg.data.name} training images [{lo}, {hi}) "
        f"({info['train_images']}, "
        f"{pc.epochs} epochs): {metric} {info['held_out_' + metric]:.4f} on {info['test_images']} test images"
    )
    print(f"weights: {path} (use model.weights={path}; keep clients off [{lo}, {hi}))")
    return 0
