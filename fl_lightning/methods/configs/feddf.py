"""FedDF's config, and the server's images every server distillation needs (FedDF, FedBE)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from ...core.checks import positive
from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@dataclass
class DistillConfig(MethodConfig):
    """The server distils on unlabeled images held out of every client (`data.server_subset`)."""

    distill_steps: int = 500  # server steps per round
    distill_batch_size: int = 128

    def check(self, run: RootConfig) -> None:
        if not run.data.server_subset:
            raise ConfigError(
                f"method {self.name} distils on unlabeled server images: set data.server_subset=N "
                "(N training images taken out of every client's data)",
                needs=("data.server_subset=N",),
            )
        positive(
            self, *(f.name for f in fields(self) if f.name.startswith("distill_") or f.name == "swa_every")
        )


@METHODS.register("feddf")
@dataclass
class FedDFConfig(DistillConfig):
    distill_steps: int = 500  # server steps per round (the paper: <= 1e4 with early stopping)
    distill_lr: float = 1e-3  # Adam (the paper's)
    temperature: float = 1.0  # T of the softened KL

    def check(self, run: RootConfig) -> None:
        super().check(run)
        positive(self, "temperature")
