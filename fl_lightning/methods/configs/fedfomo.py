"""FedFomo's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("fedfomo")
@dataclass
class FedFomoConfig(MethodConfig):
    personalised = True
    m: int = 5  # models sent to each client (PFLlib -M)
    val_fraction: float = 0.2  # the last part of the local data used to weigh them (PFLlib)

    def check(self, run: RootConfig) -> None:
        if self.m < 1 or not 0 < self.val_fraction < 1:
            raise ConfigError("fedfomo needs method.m >= 1 and 0 < method.val_fraction < 1")
