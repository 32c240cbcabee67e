"""FedBN: Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021, https://arxiv.org/abs/2102.07623.

Differs from FedAvg by keeping every batch-norm layer (affine weights and running
statistics) with its client: those keys are never uploaded or averaged. There is no
single global model, so FedBN is evaluated on each client's own test split.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..core.messages import Broadcast
from ..core.objective import ClientObjective
from ..core.strategy import FedAvgStrategy
from .configs.fedbn import FedBNConfig


def batchnorm_prefixes(model: nn.Module) -> tuple[str, ...]:
    return tuple(
        f"{name}." for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
    )


class FedBNObjective(ClientObjective[Broadcast]):
    def __init__(self, model: nn.Module, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self._bn = batchnorm_prefixes(model)  # some: `FedBNConfig.check_model` refused a model without

    def is_personal(self, key: str) -> bool:
        return key.startswith(self._bn)


class FedBN(FedAvgStrategy[FedBNConfig]):
    objective_cls = FedBNObjective
