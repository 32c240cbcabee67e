"""Pure state-dict arithmetic. Strategies call these; tests check them in isolation."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from .types import StateDict


def to_cpu(sd: StateDict) -> StateDict:
    """Detached CPU copies: what may cross a process boundary or go into a checkpoint."""
    return {k: v.detach().to("cpu", copy=True) for k, v in sd.items()}


def weighted_mean(states: Sequence[StateDict], weights: Sequence[float]) -> StateDict:
    """Σ_k w_k θ_k / Σ_k w_k over every key, parameters and buffers alike.

    Sums in float64 in the order given (callers sort by client id, so serial and Ray runs
    give identical bits); integer buffers such as `num_batches_tracked` are rounded back.
    """
    if not states:
        raise ValueError("weighted_mean of no states")
    if len(states) != len(weights):
        raise ValueError("one weight per state")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights must sum to a positive number")
    out: StateDict = {}
    for key, ref in states[0].items():
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for sd, w in zip(states, weights, strict=False):
            acc += sd[key].detach().to("cpu", torch.float64) * (w / total)
        out[key] = acc.round().to(ref.dtype) if not ref.is_floating_point() else acc.to(ref.dtype)
    return out


def select(sd: StateDict, keep: Callable[[str], bool]) -> StateDict:
    return {k: v for k, v in sd.items() if keep(k)}


def subtract(a: StateDict, b: StateDict) -> StateDict:
    return {k: a[k] - b[k] for k in a}


def add(a: StateDict, b: StateDict, scale: float = 1.0) -> StateDict:
    return {k: a[k] + scale * b[k] if a[k].is_floating_point() else a[k] for k in a}


def nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def state_nbytes(sd: StateDict | None) -> int:
    return 0 if sd is None else nbytes(sd.values())
