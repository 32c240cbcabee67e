"""CReFF's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from torch import nn

    from ...core.run_config import RootConfig
    from ...core.strategy import TaskInfo


AUGMENTS = ("dsa", "none")


@METHODS.register("creff")
@dataclass
class CReFFConfig(MethodConfig):
    single_label = "it re-trains a single-label classifier"
    num_features: int = 100  # m federated features per class [code: num_of_feature]
    match_steps: int = 100  # feature SGD steps per round [code: match_epoch]
    feature_lr: float = 0.1  # [code: lr_feature], no momentum
    match_bias: bool = True  # the bias gradient counts in the distance (spec B.1.5 item 4)
    retrain_epochs: int = 300  # [code: crt_epoch], a fresh Linear each round
    retrain_lr: float = 0.01  # [code: lr_net]
    retrain_batch_size: int = 32
    grad_repeats: int = 10  # client gradient draws per class [code]
    grad_batch: int = 32  # images per draw [code: batch_real]
    grad_augment: str = "dsa"  # dsa (color/crop/cutout/flip/scale/rotate) | none

    def check_model(self, model: nn.Module, task: TaskInfo) -> None:
        keys = model.state_dict()
        if "head.weight" not in keys or "head.bias" not in keys:  # φ̂ is a Linear(d, C) of its shape
            raise ConfigError(f"{self.name} needs a model whose classifier is a Linear `head`")

    def check(self, run: RootConfig) -> None:
        if self.grad_augment not in AUGMENTS:
            raise ConfigError(f"method.grad_augment={self.grad_augment!r}: expected dsa or none")
        for key in ("num_features", "grad_repeats", "grad_batch", "retrain_batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"method.{key} must be >= 1 (got {getattr(self, key)})")
