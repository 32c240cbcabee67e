"""FedNova: Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020, https://arxiv.org/abs/2007.07481.

Differs from FedAvg in aggregation: clients that ran more local steps would pull the
average towards their own objective, so each client's change is normalised by its number
of effective steps a_i (τ_i for SGD; [τ − ρ(1 − ρ^τ)/(1 − ρ)]/(1 − ρ) with momentum ρ),
then the average direction is scaled by τ_eff = Σ p_i a_i:
    x ← x − τ_eff · Σ_i p_i (x − y_i)/a_i,   p_i = n_i / Σ n.
Batch-norm statistics (not optimised by SGD) are averaged as in FedAvg.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState, extend
from ..core.objective import ClientObjective
from ..core.strategy import FedAvgStrategy, ServerContext
from .configs.fednova import FedNovaConfig

_STAT_KEYS = ("running_mean", "running_var", "num_batches_tracked")


def effective_steps(tau: int, momentum: float) -> float:
    """a_i of FedNova for `tau` SGD steps with heavy-ball momentum ρ."""
    if momentum == 0:
        return float(tau)
    rho = momentum
    return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)


@dataclass
class FedNovaUpdate(ClientUpdate):
    a: float = 1.0  # effective local steps (uploaded: one float)


class FedNovaObjective(ClientObjective[Broadcast]):
    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        self._steps = 0

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._steps += 1

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        rho = self.momentum if self.optimizer_name == "sgd" else 0.0
        return extend(
            super().end_round(payload, num_examples), FedNovaUpdate, a=effective_steps(self._steps, rho)
        )


class FedNova(FedAvgStrategy[FedNovaConfig]):
    aggregates_through_chain = False
    aggregates_through_chain_why = "its direction is each update's raw change normalised by its own steps"
    objective_cls = FedNovaObjective

    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> ServerState:
        new = self.average(state, updates, ctx)  # buffers as in FedAvg
        x = state.global_params
        ups = [u for u in updates if isinstance(u, FedNovaUpdate) and u.params]
        if x is None or not ups:
            return new
        total = float(sum(u.num_examples for u in ups))
        p = [u.num_examples / total for u in ups]
        tau_eff = sum(pi * u.a for pi, u in zip(p, ups, strict=False))
        params = dict(new.global_params or {})
        for k, xk in x.items():
            if not xk.is_floating_point() or k.endswith(_STAT_KEYS):
                continue
            direction = torch.zeros((), dtype=torch.float64)
            for pi, u in zip(p, ups, strict=False):
                assert u.params is not None
                direction = direction + pi * (xk.double() - u.params[k].double()) / u.a
            params[k] = (xk.double() - tau_eff * direction).to(xk.dtype)
        return dataclasses.replace(new, global_params=params)
