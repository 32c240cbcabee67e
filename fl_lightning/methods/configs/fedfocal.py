"""Fed-Focal's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.checks import nonnegative
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


@METHODS.register("fedfocal")
@dataclass
class FedFocalConfig(MethodConfig):
    single_label = "the focal loss weighs p_y"  # multi-hot targets have no single p_y
    gamma: float = 2.0  # focusing parameter γ (Lin et al.'s default, used by Fed-Focal)

    def check(self, run: RootConfig) -> None:
        nonnegative(self, "gamma")
