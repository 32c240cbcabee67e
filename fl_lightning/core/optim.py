"""The client optimiser's settings (no torch import: the config schema uses it too)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from .errors import ConfigError

OptimizerName = Literal["sgd", "adam", "adamw"]
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)


@dataclass
class OptimConfig:
    """Client optimiser (`optim.*`); rebuilt every round and every phase, as in the papers' code."""

    name: OptimizerName = "sgd"
    #: plain SGD at 0.01, as PFLlib, FL-bench and most FL codebases run their baselines: stable
    #: for every method on the usual non-IID splits (2-class shards, Dirichlet 0.1); 0.05 with
    #: momentum 0.9 (an effective step of 0.5) diverged in rounds 1-2 for FedAvg on 2-class
    #: shards and for FedDTR. A method whose paper uses another sets it in its conf file.
    lr: float = 0.01
    momentum: float = 0.0  # sgd only
    weight_decay: float = 0.0
    grad_clip: float | None = None  # max global L2 norm of the gradients; null: no clipping

    def check(self) -> None:
        """ConfigError naming the first bad value (`config.RootConfig.check` calls it)."""
        for key in ("lr", "grad_clip"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise ConfigError(f"optim.{key} must be > 0 (got {value})")
        for key in ("momentum", "weight_decay"):
            if getattr(self, key) < 0:
                raise ConfigError(f"optim.{key} must be >= 0 (got {getattr(self, key)})")
