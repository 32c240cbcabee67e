"""FedBN: no hyperparameters; batch norm stays with each client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from torch import nn

    from ...core.strategy import TaskInfo


@METHODS.register("fedbn")
@dataclass
class FedBNConfig(MethodConfig):
    personalised = True

    def check_model(self, model: nn.Module, task: TaskInfo) -> None:
        from torch.nn.modules.batchnorm import _BatchNorm

        if not any(isinstance(m, _BatchNorm) for m in model.modules()):
            raise ConfigError(
                "fedbn needs a model with batch norm (e.g. model=cnn_bn)", needs=("model=cnn_bn",)
            )
