"""τ-norm's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.checks import nonnegative
from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from torch import nn

    from ...core.run_config import RootConfig
    from ...core.strategy import TaskInfo


@METHODS.register("taunorm")
@dataclass
class TauNormConfig(MethodConfig):
    tau: float = 1.0  # τ: Kang et al. pick it on validation data in [0, 1]; 1 = unit-norm classes

    def check(self, run: RootConfig) -> None:
        nonnegative(self, "tau")

    def check_model(self, model: nn.Module, task: TaskInfo) -> None:
        from torch import nn

        head = getattr(model, "head", None)
        if not isinstance(head, nn.Module) or not any(isinstance(m, nn.Linear) for m in head.modules()):
            raise ConfigError("taunorm needs a model whose head has a linear classifier layer")
