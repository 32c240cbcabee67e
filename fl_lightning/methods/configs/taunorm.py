"""τ-norm's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.checks import nonnegative
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...config import RootConfig


@METHODS.register("taunorm")
@dataclass
class TauNormConfig(MethodConfig):
    tau: float = 1.0  # τ: Kang et al. pick it on validation data in [0, 1]; 1 = unit-norm classes

    def check(self, run: RootConfig) -> None:
        nonnegative(self, "tau")
