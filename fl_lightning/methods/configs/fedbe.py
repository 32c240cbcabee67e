"""FedBE's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.checks import nonnegative
from ...core.method import METHODS
from .feddf import DistillConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("fedbe")
@dataclass
class FedBEConfig(DistillConfig):
    samples: int = 10  # models sampled from the Gaussian (the paper's M = 10)
    distill_lr: float = 1e-3  # SGD, momentum 0.9
    swa_every: int = 50  # steps between the SWA snapshots

    def check(self, run: RootConfig) -> None:
        super().check(run)  # the server's images, the distillation's budget
        nonnegative(self, "samples")
