"""Centralized training on one tensor set, for what a run needs before its first round: a
pretrained trunk (`fl-lightning pretrain`) and CLIP2FL's aligned teacher. Plain SGD with a
cosine schedule over epochs, a seeded shuffle, the progress line of every long step; torch's
global RNG is restored afterwards, so building one changes nothing of the run that follows."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from .errors import ConfigError
from .progress import announce, duration, progress

#: a step whose estimate passes this says so before it goes on (seconds)
ANNOUNCE_ABOVE_S = 30.0


def cores_given() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota (a
    container's `cpu.max`). torch's default thread count is the machine's cores, which in a
    container, or beside other work, oversubscribes them."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, int(quota) // int(period))
    except (OSError, ValueError):
        pass
    return max(1, n)


class StepTimer:
    """Seconds a step from a loop's first steps: the first warms up (allocation, the choice
    of kernels) and is not timed, the next `timed` are. `step()` after each step returns the
    seconds a step once, after the last timed one, else None."""

    def __init__(self, timed: int = 2) -> None:
        self.timed, self.done, self.t1 = timed, 0, 0.0

    def step(self) -> float | None:
        self.done += 1
        if self.done == 1:
            self.t1 = time.perf_counter()  # timed from the warm-up's end
        elif self.done == self.timed + 1:
            return (time.perf_counter() - self.t1) / self.timed
        return None


def announce_long(what: str, seconds: float, detail: str, shorten: str = "") -> None:
    """Past `ANNOUNCE_ABOVE_S`: one line saying how long `what` will take, how that was
    reckoned (`detail`) and `shorten`, the flag that shortens it."""
    if seconds > ANNOUNCE_ABOVE_S:
        announce(f"{what}: about {duration(seconds)} ({detail})" + (f"; {shorten}" if shorten else ""))


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with `n` intra-op threads (same count in every executor: same numbers). `n=1` for
    the server's loops of tiny ops (prototype training, CReFF's feature matching and
    re-training, CCVR's calibration): with two threads on a busy 2-core machine a step waits on
    the other thread's core (CReFF's 300 re-training epochs: 52 s vs 1 s), and their result
    no longer depends on the driver's thread count."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    shorten: str = "",
    threads: int | None = None,
) -> nn.Module:
    """`build()` a model under `seed` and train it on (x, y): `loss_fn(model, xb, yb)` per
    batch, batches of fewer than 2 skipped (BatchNorm needs two). Returns it in eval mode;
    a non-finite loss stops with one line (lower the rate). Runs on `threads` torch threads
    (default: torch's own count, at most `cores_given()`); once three batches are timed, a step
    estimated past `ANNOUNCE_ABOVE_S` says how long it will take and `shorten` (the flag that
    shortens it)."""
    batches = -(-len(y) // batch_size)
    total, done, timer = epochs * batches, 0, StepTimer()
    n_threads = threads or min(torch.get_num_threads(), cores_given())
    with torch_threads(n_threads), torch.random.fork_rng(devices=[]), progress(what, total, "batch") as bar:
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
                done += 1
                if (step_s := timer.step()) is not None:
                    announce_long(
                        what, step_s * (total - done),
                        f"{epochs} epochs x {batches} batches on {torch.get_num_threads()} threads", shorten,
                    )  # fmt: skip
            sched.step()
    return model.eval()
