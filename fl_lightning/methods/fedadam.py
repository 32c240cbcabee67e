"""FedAdam: Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
https://arxiv.org/abs/2003.00295 (Algorithm 2). FedYogi and FedAdagrad, the same algorithm
with another second moment, build on the family's base here.

Differs from FedAvg on the server only. The round's pseudo-gradient Δ = Σ_k p_k w_k − w
(p_k ∝ examples, as FedAvg weighs clients; the paper writes the plain mean over the sampled
clients) drives an Adam step without bias correction:
    m ← β1·m + (1 − β1)·Δ,   v ← β2·v + (1 − β2)·Δ²,   w ← w + η·m / (√v + τ),
from m = 0 and v = τ² (the paper's v₋₁ ≥ τ²); τ bounds how adaptive the step is. Clients
train FedAvg's objective. Batch-norm statistics are not gradients: they take the average.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from ..core.errors import ConfigError
from ..core.messages import Broadcast, ClientUpdate, ServerState
from ..core.objective import is_weight
from ..core.strategy import MethodConfig, Strategy
from ..core.types import StateDict
from . import METHODS


@dataclass
class AdaptiveConfig(MethodConfig):
    """The server optimiser of the family (η, β1, τ: the paper's names)."""

    server_lr: float = 0.01  # η (the paper tunes it per task on a grid of powers of 10)
    beta1: float = 0.9  # β1 (the paper's experiments)
    tau: float = 1e-3  # τ, the adaptivity (the paper's experiments use 1e-3 unless tuned)

    def __post_init__(self) -> None:
        if not self.server_lr > 0:
            raise ConfigError(f"method.server_lr must be > 0 (got {self.server_lr})")
        if not 0 <= self.beta1 < 1:
            raise ConfigError(f"method.beta1 must be in [0, 1) (got {self.beta1})")
        if not self.tau > 0:
            raise ConfigError(f"method.tau must be > 0 (got {self.tau})")


@dataclass
class FedAdamConfig(AdaptiveConfig):
    name: str = "fedadam"
    beta2: float = 0.99  # β2 (the paper's experiments)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.beta2 < 1:
            raise ConfigError(f"method.beta2 must be in [0, 1) (got {self.beta2})")


@dataclass
class AdaptiveState(ServerState):
    m: StateDict = field(default_factory=dict)  # first moment, one tensor per weight key
    v: StateDict = field(default_factory=dict)  # second moment


AdaptiveConfigT = TypeVar("AdaptiveConfigT", bound=AdaptiveConfig)


class ServerAdaptive(Strategy[AdaptiveConfigT, AdaptiveState, Broadcast]):
    """FedAvg's clients and an adaptive server step; a method gives its `second_moment`."""

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        """v_t from v_{t−1} and Δ² (element-wise)."""
        raise NotImplementedError

    def aggregate(self, state: AdaptiveState, updates: Sequence[ClientUpdate]) -> AdaptiveState:
        avg = super().aggregate(state, updates)  # the weighted mean: what BN statistics keep
        w, mean = state.global_params, avg.global_params
        if w is None or mean is None or not any(u.params for u in updates):
            return avg  # nobody reported: no step, the moments are kept
        c = self.config
        params, m, v = dict(mean), dict(state.m), dict(state.v)
        for k, wk in w.items():
            if not is_weight(k, wk):
                continue
            d = mean[k] - wk
            m[k] = c.beta1 * m[k] + (1 - c.beta1) * d if k in m else (1 - c.beta1) * d
            v[k] = self.second_moment(v[k] if k in v else torch.full_like(d, c.tau**2), d * d)
            params[k] = wk + c.server_lr * m[k] / (v[k].sqrt() + c.tau)
        return dataclasses.replace(avg, global_params=params, m=m, v=v)


@METHODS.register("fedadam")
class FedAdam(ServerAdaptive[FedAdamConfig]):
    name = "fedadam"

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return self.config.beta2 * v + (1 - self.config.beta2) * d2
