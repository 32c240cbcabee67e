"""FedProx: Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020,
https://arxiv.org/abs/1812.06127.

Differs from FedAvg by one client loss term, (mu/2)·||w − w_global||², which keeps local
models near the round's global model. mu = 0 is FedAvg exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.batched import MaskedStep
from ..core.messages import Broadcast, ServerState
from ..core.objective import BroadcastT, ClientObjective
from ..core.strategy import Strategy
from .configs.fedprox import FedProxConfig


class ProximalTerm(ClientObjective[BroadcastT]):
    """Mixin for any objective: adds `prox` = (mu/2)·||w − w_global||² to `loss_terms`."""

    prox_mu: float = 0.0
    _anchor: list[torch.Tensor]

    def on_train_start(self) -> None:
        # After the Trainer moved the model to its device; the round's global weights.
        self._anchor = [p.detach().clone() for p in self.model.parameters()]
        super().on_train_start()

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        terms = super().loss_terms(batch)
        if self.prox_mu > 0:
            sq = torch.zeros((), device=self._anchor[0].device)
            for p, a in zip(self.model.parameters(), self._anchor, strict=False):
                sq = sq + ((p - a) ** 2).sum()  # in order, as a plain loop would
            terms["prox"] = 0.5 * self.prox_mu * sq
        return terms

    def masked_terms(self, step: MaskedStep) -> dict[str, torch.Tensor]:
        terms = super().masked_terms(step)
        if self.prox_mu > 0:  # the anchor is where this client's training started
            sq = torch.zeros((), device=step.x.device)
            for k, a in step.start.items():
                if k.startswith("model."):
                    sq = sq + ((step.params[k] - a) ** 2).sum()
            terms["prox"] = 0.5 * self.prox_mu * sq
        return terms


class FedProxObjective(ProximalTerm[Broadcast]):
    batched_step = True

    def __init__(self, model: torch.nn.Module, mu: float = 0.001, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.prox_mu = mu


class FedProx(Strategy[FedProxConfig, ServerState, Broadcast]):
    objective_cls = FedProxObjective

    def warnings(self) -> list[str]:
        return ["fedprox with method.mu=0 is FedAvg"] if self.config.mu == 0 else []
