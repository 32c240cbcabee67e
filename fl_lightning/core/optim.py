"""The client optimiser's settings (no torch import: the config schema uses it too)."""

from __future__ import annotations

from dataclasses import dataclass

OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass
class OptimConfig:
    """Client optimiser (`optim.*`); rebuilt every round and every phase, as in the papers' code."""

    name: str = "sgd"  # sgd | adam | adamw
    lr: float = 0.05
    momentum: float = 0.9  # sgd only
    weight_decay: float = 0.0
    grad_clip: float | None = None  # max global L2 norm of the gradients; null: no clipping
