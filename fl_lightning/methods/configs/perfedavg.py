"""Per-FedAvg's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("perfedavg")
@dataclass
class PerFedAvgConfig(MethodConfig):
    personalised = True
    single_label = "its inner step's loss"
    alpha: float | None = None  # inner / personalisation step; None: optim.lr (PFLlib)
    first_order: bool = True  # PFLlib's FO variant; false: exact second-order MAML

    def check(self, run: RootConfig) -> None:
        if self.alpha is not None and self.alpha <= 0:
            raise ConfigError("perfedavg needs method.alpha > 0 (or null: optim.lr)")
