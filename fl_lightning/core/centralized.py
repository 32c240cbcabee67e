"""Centralized training on one tensor set, for what a run needs before its first round: a
pretrained trunk (`fl-lightning pretrain`) and CLIP2FL's aligned teacher. Plain SGD with a
cosine schedule over epochs, a seeded shuffle, the progress line of every long step; torch's
global RNG is restored afterwards, so building one changes nothing of the run that follows."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from .errors import ConfigError
from .progress import progress


def fit_centralized(
    build: Callable[[], nn.Module],
    loss_fn: Callable[[nn.Module, Tensor, Tensor], Tensor],
    x: Tensor,
    y: Tensor,
    *,
    epochs: int,
    lr: float,
    momentum: float,
    batch_size: int,
    seed: int,
    what: str,
    weight_decay: float = 0.0,
) -> nn.Module:
    """`build()` a model under `seed` and train it on (x, y): `loss_fn(model, xb, yb)` per
    batch, batches of fewer than 2 skipped (BatchNorm needs two). Returns it in eval mode;
    a non-finite loss stops with one line (lower the rate)."""
    batches = -(-len(y) // batch_size)
    with torch.random.fork_rng(devices=[]), progress(what, epochs * batches, "batch") as bar:
        torch.manual_seed(seed)
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(epochs, 1))
        g = torch.Generator().manual_seed(seed)
        model.train()
        for epoch in range(epochs):
            perm = torch.randperm(len(y), generator=g)
            for i in range(0, len(y), batch_size):
                sel = perm[i : i + batch_size]
                if len(sel) < 2:
                    bar.update(epoch=f"{epoch + 1}/{epochs}")
                    continue
                loss = loss_fn(model, x[sel], y[sel])
                if not torch.isfinite(loss):
                    raise ConfigError(f"{what}: non-finite loss in epoch {epoch + 1}; lower the rate")
                opt.zero_grad()
                loss.backward()
                opt.step()
                bar.update(epoch=f"{epoch + 1}/{epochs}", loss=float(loss.detach()))
            sched.step()
    return model.eval()
