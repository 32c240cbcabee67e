"""FedAdagrad: Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
https://arxiv.org/abs/2003.00295 (Algorithm 2).

FedAdam (`fedadam.py`) with Adagrad's second moment, the sum of every round's Δ²:
    v ← v + Δ²,
so the step shrinks as the rounds add up (no β2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import METHODS
from .fedadam import AdaptiveConfig, ServerAdaptive


@dataclass
class FedAdagradConfig(AdaptiveConfig):
    name: str = "fedadagrad"


@METHODS.register("fedadagrad")
class FedAdagrad(ServerAdaptive[FedAdagradConfig]):
    name = "fedadagrad"

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return v + d2
