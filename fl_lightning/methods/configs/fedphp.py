"""FedPHP's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("fedphp")
@dataclass
class FedPHPConfig(MethodConfig):
    personalised = True
    mu: float = 0.9  # the inherited model's largest weight (reached at round T)
    lam: float = 0.5  # weight of the MMD term (1 - lam: cross-entropy)

    def check(self, run: RootConfig) -> None:
        if not 0.0 <= self.mu <= 1.0 or not 0.0 <= self.lam <= 1.0:
            raise ConfigError(f"fedphp needs 0 <= method.mu, method.lam <= 1 (got {self.mu}, {self.lam})")
