"""pFedMe's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("pfedme")
@dataclass
class PFedMeConfig(MethodConfig):
    personalised = True
    lam: float = 15.0  # λ of the Moreau envelope (paper; PFLlib -lam defaults to 1)
    personal_lr: float = 0.01  # η_p of the inner steps (PFLlib -lrp)
    inner_steps: int = 5  # K (paper, PFLlib -K)
    mu: float = 0.001  # L2 on θ in the inner steps (PFLlib pFedMeOptimizer's default)
    beta: float = 1.0  # server mixing (paper: 1 or 2; PFLlib -bt defaults to 0 = no update)

    def check(self, run: RootConfig) -> None:
        if self.lam <= 0 or self.personal_lr <= 0 or self.inner_steps < 1 or self.mu < 0 or self.beta <= 0:
            raise ConfigError(
                "pfedme needs method.lam > 0, personal_lr > 0, inner_steps >= 1, mu >= 0 and beta > 0"
            )
