"""The configs of the adaptive server optimisers (FedAdam, FedYogi, FedAdagrad)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.checks import positive, within
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@dataclass
class AdaptiveConfig(MethodConfig):
    """The server optimiser of the family (η, β1, τ: the paper's names)."""

    server_lr: float = 0.01  # η (the paper tunes it per task on a grid of powers of 10)
    beta1: float = 0.9  # β1 (the paper's experiments)
    tau: float = 1e-3  # τ, the adaptivity (the paper's experiments use 1e-3 unless tuned)

    def check(self, run: RootConfig) -> None:
        positive(self, "server_lr", "tau")
        within(self, "beta1", 0, 1, open_hi=True)


@METHODS.register("fedadam")
@dataclass
class FedAdamConfig(AdaptiveConfig):
    beta2: float = 0.99  # β2 (the paper's experiments)

    def check(self, run: RootConfig) -> None:
        super().check(run)
        within(self, "beta2", 0, 1, open_hi=True)


@METHODS.register("fedyogi")
@dataclass
class FedYogiConfig(FedAdamConfig):
    """FedAdam's keys; Yogi's second moment."""


@METHODS.register("fedadagrad")
@dataclass
class FedAdagradConfig(AdaptiveConfig):
    """No β2: Adagrad sums the squares."""
