"""CCVR's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.checks import one_of
from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("ccvr")
@dataclass
class CCVRConfig(MethodConfig):
    single_label = "class-conditional feature statistics"
    # Re-training budget: CReFF's classifier re-training (m = 100 per class, 300 epochs,
    # SGD lr 0.01, batch 32; spec B.2), so CCVR and CReFF re-train alike on the same protocol.
    virtual_per_class: int = 100
    retrain_epochs: int = 300
    retrain_lr: float = 0.01
    retrain_momentum: float = 0.0
    retrain_batch_size: int = 32
    init_head: str = "fedavg"  # fedavg: calibrate the FedAvg head (CCVR) | fresh: a new random head

    def check(self, run: RootConfig) -> None:
        for key in ("virtual_per_class", "retrain_batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"method.{key} must be >= 1 (got {getattr(self, key)})")
        if self.retrain_epochs < 0:
            raise ConfigError(f"method.retrain_epochs must be >= 0 (got {self.retrain_epochs})")
        if self.retrain_lr <= 0 or not 0 <= self.retrain_momentum < 1:
            raise ConfigError(
                f"ccvr needs method.retrain_lr > 0 and method.retrain_momentum in [0, 1) "
                f"(got {self.retrain_lr}, {self.retrain_momentum})"
            )
        one_of(self, "init_head", ("fedavg", "fresh"))
