"""FedAdam: Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
https://arxiv.org/abs/2003.00295 (Algorithm 2), with the paper's FedYogi and FedAdagrad: the
same step with another second moment, Yogi's v ← v − (1 − β2)·Δ²·sign(v − Δ²) (Zaheer et al.,
NeurIPS 2018: v moves towards Δ² by at most (1 − β2)·Δ² a round) and Adagrad's v ← v + Δ².

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

from ..core.messages import Broadcast, ClientUpdate, ServerState
from ..core.objective import is_weight
from ..core.strategy import ServerContext, Strategy
from ..core.types import StateDict
from .configs.fedadam import AdaptiveConfig, FedAdagradConfig, FedAdamConfig, FedYogiConfig


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

    def aggregate(
        self, state: AdaptiveState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> AdaptiveState:
        avg = self.average(state, updates, ctx)  # the weighted mean: what BN statistics keep
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


class FedAdam(ServerAdaptive[FedAdamConfig]):
    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return self.config.beta2 * v + (1 - self.config.beta2) * d2


class FedYogi(ServerAdaptive[FedYogiConfig]):
    """FedYogi: FedAdam's step with Yogi's additive second moment (Zaheer et al. 2018)."""

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.config.beta2) * d2 * torch.sign(v - d2)


class FedAdagrad(ServerAdaptive[FedAdagradConfig]):
    """FedAdagrad: the second moment sums the squares."""

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return v + d2
