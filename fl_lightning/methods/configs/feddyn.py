"""FedDyn's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.checks import positive
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("feddyn")
@dataclass
class FedDynConfig(MethodConfig):
    alpha: float = 0.01  # α (the paper's experiments use 1e-1, 1e-2 and 1e-3)

    def check(self, run: RootConfig) -> None:
        positive(self, "alpha")
