"""DP-FPL's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.checks import nonnegative, positive
from ...core.errors import ConfigError
from ...core.method import METHODS
from .prompting import PromptConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("dpfpl")
@dataclass
class DpFplConfig(PromptConfig):
    personalised = True  # each client's global + local prompt, on its own test split
    rank: int = 8  # --rank 8: the local prompt's low-rank part U V (U: n_ctx x rank)
    norm_thresh: float = 10.0  # --norm-thresh 10: the per-batch gradient clip (global, U and V)
    noise: float = 0.0  # --noise: the authors' privacy knob (0: no clipping, no local noise)

    def check(self, run: RootConfig) -> None:
        if self.rank < 1:
            raise ConfigError(f"method.rank must be >= 1 (got {self.rank})")
        positive(self, "norm_thresh")
        nonnegative(self, "noise")
        super().check(run)
        n_ctx = (run.model or {}).get("n_ctx", 16)
        if not (run.model or {}).get("ctx_init") and isinstance(n_ctx, int) and self.rank > n_ctx:
            raise ConfigError(
                f"method.rank={self.rank} is above model.n_ctx={n_ctx}: the local prompt's factorisation "
                "orthonormalises rank columns of n_ctx rows (the authors' rank 8 of 16 vectors)"
            )
        if run.data.base_new:
            raise ConfigError(
                "method=dpfpl takes no data.base_new: its clients score every class with the "
                "personalised prompt (base-to-new: method=promptfl or fedtpg)"
            )
        if self.noise > 0 and run.privacy.name != "dp_fedavg":
            raise ConfigError(
                f"method=dpfpl method.noise={self.noise:g} noises the client-kept prompt only; the global "
                "prompt it uploads is privatised by privacy=dp_fedavg (clip, uniform mean, noise, "
                "accountant): add privacy=dp_fedavg, or set method.noise=0"
            )
