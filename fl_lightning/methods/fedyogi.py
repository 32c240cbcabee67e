"""FedYogi: Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
https://arxiv.org/abs/2003.00295 (Algorithm 2).

FedAdam (`fedadam.py`) with Yogi's second moment (Zaheer et al., "Adaptive Methods for
Nonconvex Optimization", NeurIPS 2018), which moves v towards Δ² by at most (1 − β2)·Δ² a
round instead of forgetting it geometrically:
    v ← v − (1 − β2)·Δ²·sign(v − Δ²).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import METHODS
from .fedadam import FedAdamConfig, ServerAdaptive


@dataclass
class FedYogiConfig(FedAdamConfig):
    name: str = "fedyogi"


@METHODS.register("fedyogi")
class FedYogi(ServerAdaptive[FedYogiConfig]):
    name = "fedyogi"

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.config.beta2) * d2 * torch.sign(v - d2)
