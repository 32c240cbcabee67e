"""FedLC: Zhang et al., "Federated Learning with Label Distribution Skew via Logits
Calibration", ICML 2022, https://proceedings.mlr.press/v162/zhang22p.html.

Differs from FedAvg by the client loss: cross-entropy on calibrated logits
z_c − τ·n_c^{−1/4}, with n_c the client's count of class c (absent classes drop out of
the softmax, as n^{−1/4} = ∞ does in the authors' code).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..core.messages import Broadcast, ServerState
from ..core.objective import ClientObjective
from ..core.strategy import Strategy
from .configs.fedlc import FedLCConfig


def calibrated_logits(logits: torch.Tensor, counts: torch.Tensor, tau: float) -> torch.Tensor:
    shift = tau * counts.to(logits).clamp(min=1) ** -0.25
    return (logits - shift).masked_fill(counts.to(logits.device) == 0, float("-inf"))


class FedLCObjective(ClientObjective[Broadcast]):
    def __init__(self, model: torch.nn.Module, tau: float = 1.0, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.tau = tau

    def task_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.class_counts is None:
            return F.cross_entropy(logits, y)
        return F.cross_entropy(calibrated_logits(logits, self.class_counts, self.tau), y)


class FedLC(Strategy[FedLCConfig, ServerState, Broadcast]):
    objective_cls = FedLCObjective
