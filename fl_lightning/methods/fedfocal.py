"""Fed-Focal Loss: Sarkar, Narang and Rai, "Fed-Focal Loss for imbalanced data
classification in Federated Learning", 2020, https://arxiv.org/abs/2011.06283.

Differs from FedAvg by the client loss: the focal loss of Lin et al. (ICCV 2017),
−(1 − p_y)^γ · log p_y averaged over the batch, which down-weights examples the model
already classifies well (on long-tailed data: mostly head classes). γ = 0 is FedAvg.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..core.messages import Broadcast, ServerState
from ..core.objective import ClientObjective
from ..core.strategy import Strategy
from .configs.fedfocal import FedFocalConfig


def focal_loss(logits: torch.Tensor, y: torch.Tensor, gamma: float) -> torch.Tensor:
    """Mean over the batch of −(1 − p_y)^γ log p_y."""
    if gamma == 0:
        return F.cross_entropy(logits, y)  # the same value; keeps γ = 0 bit-identical to FedAvg
    logp = F.log_softmax(logits, dim=-1).gather(1, y[:, None]).squeeze(1)
    return -((1 - logp.exp()) ** gamma * logp).mean()


class FedFocalObjective(ClientObjective[Broadcast]):
    def __init__(self, model: torch.nn.Module, gamma: float = 2.0, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.gamma = gamma

    def task_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return focal_loss(logits, y, self.gamma)


class FedFocal(Strategy[FedFocalConfig, ServerState, Broadcast]):
    objective_cls = FedFocalObjective

    def warnings(self) -> list[str]:
        return ["fedfocal with method.gamma=0 is FedAvg"] if self.config.gamma == 0 else []
