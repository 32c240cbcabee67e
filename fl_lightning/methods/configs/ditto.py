"""Ditto's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("ditto")
@dataclass
class DittoConfig(MethodConfig):
    personalised = True
    lam: float = 0.1  # λ of the proximal pull (our default; PFLlib -mu defaults to 0)
    personal_epochs: int = 1  # PFLlib -pls (plocal_epochs)

    def check(self, run: RootConfig) -> None:
        if self.lam < 0 or self.personal_epochs < 1:
            raise ConfigError("ditto needs method.lam >= 0 and method.personal_epochs >= 1")
