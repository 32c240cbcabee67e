"""The client optimiser's settings (no torch import: the config schema uses it too)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OptimConfig:
    """Client optimiser (`optim.*`); rebuilt every round, as in the papers' code."""

    name: str = "sgd"  # sgd | adam
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
