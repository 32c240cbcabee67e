"""FedAvgM: Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data Distribution
for Federated Visual Classification", 2019, https://arxiv.org/abs/1909.06335.

Differs from FedAvg by server momentum: with Δ = w − Σ_k p_k w_k (the round's
pseudo-gradient, p_k ∝ examples), the server keeps v ← β·v + Δ and steps w ← w − η_s·v.
β = 0, η_s = 1 is FedAvg exactly. Batch-norm running statistics are not gradients: they
take the plain average (a momentum on a running variance could drive it negative).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.messages import Broadcast, ClientUpdate, ServerState
from ..core.objective import is_weight
from ..core.strategy import ServerContext, Strategy
from ..core.types import StateDict
from .configs.fedavgm import FedAvgMConfig


@dataclass
class FedAvgMState(ServerState):
    velocity: StateDict = field(default_factory=dict)  # v, one tensor per momentum key


def momentum_keys(params: StateDict) -> list[str]:
    """The keys the server momentum moves: floating tensors that are not BN statistics."""
    return [k for k, v in params.items() if is_weight(k, v)]


def momentum_step(
    w: StateDict, mean: StateDict, v: StateDict, beta: float, lr: float
) -> tuple[StateDict, StateDict]:
    """(w', v'): v' = β·v + (w − mean), w' = w − η_s·v' on the momentum keys; the others
    (BN statistics, counters) take `mean`. Missing velocity entries start at zero."""
    new_w, new_v = dict(mean), {}
    for k in momentum_keys(w):
        delta = w[k] - mean[k]
        new_v[k] = beta * v[k] + delta if k in v else delta
        new_w[k] = w[k] - lr * new_v[k]
    return new_w, new_v


class FedAvgM(Strategy[FedAvgMConfig, FedAvgMState, Broadcast]):
    def aggregate(
        self, state: FedAvgMState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> FedAvgMState:
        avg = self.average(state, updates, ctx)
        w, mean = state.global_params, avg.global_params
        if w is None or mean is None or not any(u.params for u in updates):
            return avg  # nothing shared or nobody reported: no step, the velocity is kept
        c = self.config
        new_w, new_v = momentum_step(w, mean, state.velocity, c.server_momentum, c.server_lr)
        return dataclasses.replace(avg, global_params=new_w, velocity=new_v)

    def warnings(self) -> list[str]:
        c = self.config
        if c.server_momentum == 0 and c.server_lr == 1:
            return ["fedavgm with method.server_momentum=0 and method.server_lr=1 is FedAvg"]
        return []
