"""FedAMP's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("fedamp")
@dataclass
class FedAMPConfig(MethodConfig):
    personalised = True
    alpha_k: float = 1.0  # αK (PFLlib -alk)
    lam: float = 1.0  # λ (PFLlib -lam)
    sigma: float = 1.0  # σ of the attention e^{-x/σ}/σ (PFLlib -sg)

    def check(self, run: RootConfig) -> None:
        if self.alpha_k <= 0 or self.lam < 0 or self.sigma <= 0:
            raise ConfigError("fedamp needs method.alpha_k > 0, method.lam >= 0 and method.sigma > 0")
