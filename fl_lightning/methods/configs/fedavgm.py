"""FedAvgM's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.checks import positive, within
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("fedavgm")
@dataclass
class FedAvgMConfig(MethodConfig):
    server_momentum: float = 0.9  # β (Hsu et al. sweep β in [0, 0.997]; 0.9 is their common choice)
    server_lr: float = 1.0  # η_s (Hsu et al.: server learning rate 1)

    def check(self, run: RootConfig) -> None:
        within(self, "server_momentum", 0, 1, open_hi=True)
        positive(self, "server_lr")
