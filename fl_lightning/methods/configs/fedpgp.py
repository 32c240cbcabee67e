"""FedPGP's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.checks import nonnegative, positive
from ...core.errors import ConfigError
from ...core.method import METHODS
from .prompting import PromptConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("fedpgp")
@dataclass
class FedPGPConfig(PromptConfig):
    personalised = True  # each client's global + U V, on its own test split
    rank: int = 8  # BOTTLENECK: U is n_ctx x rank, V rank x width (the authors' scripts: 8)
    mu: float = 0.5  # weight of the prompt-wise contrastive term (their scripts: 0.5)
    temp: float = 0.5  # its temperature

    def check(self, run: RootConfig) -> None:
        if self.rank < 1:
            raise ConfigError(f"method.rank must be >= 1 (got {self.rank})")
        nonnegative(self, "mu")
        positive(self, "temp")
        super().check(run)
