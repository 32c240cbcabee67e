"""FedDyn: Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021,
https://arxiv.org/abs/2111.04263 (Algorithm 1).

Differs from FedAvg on both sides. Client k keeps g_k (its local gradient at its last model;
0 before its first round) and minimises, from the round's global model θ,
    L_k(w) − ⟨g_k, w⟩ + (α/2)·‖w − θ‖²,
then sets g_k ← g_k − α·(w_k − θ). The server keeps h (0 at first) and, over the round's
clients P of all m clients,
    h ← h − (α/m)·Σ_{k∈P} (w_k − θ),      θ ← (1/|P|)·Σ_{k∈P} w_k − h/α
(the plain mean over clients, as the paper's; h is what makes a client's stationary point the
global one). Batch-norm statistics are not trained by the gradient: they take FedAvg's average.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState
from ..core.objective import ClientObjective, is_weight
from ..core.params import to_cpu
from ..core.strategy import ServerContext, Strategy
from ..core.types import StateDict
from .configs.feddyn import FedDynConfig

#: the client-state component holding g_k
GRAD = "feddyn/grad"


@dataclass
class FedDynState(ServerState):
    h: StateDict = field(default_factory=dict)  # one tensor per weight key


class FedDynObjective(ClientObjective[Broadcast]):
    def __init__(self, model: torch.nn.Module, alpha: float = 0.01, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.alpha = alpha

    def on_train_start(self) -> None:
        # on the fit's device: θ, and g_k (zeros for a client's first round)
        self._theta = {k: p.detach().clone() for k, p in self.model.named_parameters()}
        g = self.client_state.get(GRAD) or {}
        self._grad = {k: g[k].to(t.device) if k in g else torch.zeros_like(t) for k, t in self._theta.items()}

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        terms = super().loss_terms(batch)
        linear = torch.zeros((), device=batch[0].device)
        sq = torch.zeros((), device=batch[0].device)
        for k, p in self.model.named_parameters():
            linear = linear + (self._grad[k] * p).sum()
            sq = sq + ((p - self._theta[k]) ** 2).sum()
        terms["dyn"] = 0.5 * self.alpha * sq - linear
        return terms

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        w = dict(self.model.named_parameters())
        grad = {k: g - self.alpha * (w[k].detach() - self._theta[k]) for k, g in self._grad.items()}
        self.client_state[GRAD] = to_cpu(grad)
        return super().end_round(payload, num_examples)


class FedDyn(Strategy[FedDynConfig, FedDynState, Broadcast]):
    aggregates_through_chain = False
    aggregates_through_chain_why = "its weights are the plain mean of the raw updates minus h/alpha"
    objective_cls = FedDynObjective

    def aggregate(
        self, state: FedDynState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> FedDynState:
        avg = self.average(state, updates, ctx)  # FedAvg's average: what BN statistics keep
        theta, sent = state.global_params, [u.params for u in updates if u.params]
        if theta is None or avg.global_params is None or not sent:
            return avg
        alpha, params, h = self.config.alpha, dict(avg.global_params), dict(state.h)
        for k, t in theta.items():
            if not is_weight(k, t):
                continue
            drift = torch.stack([p[k] - t for p in sent]).sum(0)
            h[k] = (h[k] if k in h else torch.zeros_like(t)) - alpha / self.num_clients * drift
            params[k] = torch.stack([p[k] for p in sent]).mean(0) - h[k] / alpha
        return dataclasses.replace(avg, global_params=params, h=h)
