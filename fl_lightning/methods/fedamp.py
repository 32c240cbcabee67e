"""FedAMP: Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID Data",
AAAI 2021, https://arxiv.org/abs/2007.03797.

Attentive message passing on the server. Each client i has a personal model w_i, which
stays with it (component `fedamp/personal`, the whole state dict) and which it uploads
after each fit. The server keeps the latest upload of every client (`client_models`: the
driver holds one model per client that has trained, inherently for this method: the
attention needs all of them) and gives each sampled client its cloud model
u_i = ξ_ii·w_i + Σ_{j≠i} ξ_ij·w_j, ξ_ij = αK·e^{−||w_i − w_j||²/σ}/σ, ξ_ii = 1 − Σ_{j≠i} ξ_ij
(PFLlib `serveramp.py`; the paper's A'(x) for A(x) = 1 − e^{−x/σ}), over the weights (not
batch-norm statistics), in the client's payload. A client the server has no model of counts
as the initial model. The client then trains w_i, from its own model, on
CE + λ/(2αK)·||w − u_i||² (paper Eq. 7). (PFLlib's client adds 0.5·λ/αK·||w − u_i|| built
from `.data`, which carries no gradient; we follow the paper.) Evaluation scores w_i on the
client's own test split.

With partial participation the attention runs over the latest model of every client the
server has seen (the paper has all clients every round; PFLlib uses the previous round's
uploads only). Defaults: αK = 1, λ = 1, σ = 1 (PFLlib `-alk`, `-lam`, `-sg`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState
from ..core.objective import ClientObjective, is_weight
from ..core.params import to_cpu
from ..core.strategy import ServerContext, Strategy
from ..core.types import ClientId, StateDict
from .configs.fedamp import FedAMPConfig

#: the client-state component holding the personal model w_i
PERSONAL_MODEL = "fedamp/personal"


@dataclass
class FedAMPServerState(ServerState):
    """`global_params`: the initial model (no global model is trained); `client_models`: the
    latest upload w_i of every client that has trained."""

    client_models: dict[ClientId, StateDict] = field(default_factory=dict)


@dataclass
class FedAMPPayload(ClientPayload):
    """`cloud`: client i's cloud model u_i (weights only)."""

    cloud: StateDict = field(default_factory=dict)


class FedAMPObjective(ClientObjective[Broadcast]):
    def __init__(self, model: nn.Module, lam: float = 1.0, alpha_k: float = 1.0, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.lam, self.alpha_k = lam, alpha_k
        self._cloud: list[tuple[nn.Parameter, torch.Tensor]] = []
        self._cloud_cpu: StateDict = {}

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        w = self.client_state.get(PERSONAL_MODEL)
        if w is not None:
            self.load_params(w)
        self._cloud_cpu = payload.cloud if isinstance(payload, FedAMPPayload) else {}
        self._cloud = []

    def on_train_start(self) -> None:
        super().on_train_start()
        dev = next(self.model.parameters()).device
        named = dict(self.model.named_parameters())
        self._cloud = [(named[k], u.to(dev)) for k, u in self._cloud_cpu.items() if k in named]

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        terms = super().loss_terms(batch)
        if self._cloud:
            sq = torch.stack([((p - u) ** 2).sum() for p, u in self._cloud]).sum()
            terms["prox"] = 0.5 * self.lam / self.alpha_k * sq
        return terms

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        self.client_state[PERSONAL_MODEL] = to_cpu(self.model_state())
        return super().end_round(payload, num_examples)  # uploads w_i


class FedAMP(Strategy[FedAMPConfig, FedAMPServerState, Broadcast]):
    aggregates_through_chain = False
    aggregates_through_chain_why = "it keeps each client's model and mixes them per client"
    objective_cls = FedAMPObjective
    plain_eval_payloads = True  # evaluation scores w_i alone: no cloud models to compute

    def objective_kwargs(self) -> dict[str, Any]:
        return {"lam": self.config.lam, "alpha_k": self.config.alpha_k}

    def broadcast(self, state: FedAMPServerState, rnd: int) -> Broadcast:
        return Broadcast(round=rnd)  # no global model: each client trains its own

    def cloud_model(self, state: FedAMPServerState, client_id: ClientId) -> StateDict:
        """u_i: the attention-weighted combination of the clients' models."""
        assert state.global_params is not None
        own = state.client_models.get(client_id, state.global_params)
        keys = [k for k, v in own.items() if is_weight(k, v)]
        flat_i = torch.cat([own[k].double().flatten() for k in keys])
        others = [(c, m) for c, m in sorted(state.client_models.items()) if c != client_id]
        coefs = []
        for _, m in others:
            d2 = float(((flat_i - torch.cat([m[k].double().flatten() for k in keys])) ** 2).sum())
            coefs.append(self.config.alpha_k * math.exp(-d2 / self.config.sigma) / self.config.sigma)
        u = {k: (1.0 - sum(coefs)) * own[k] for k in keys}
        for c, (_, m) in zip(coefs, others, strict=True):
            for k in keys:
                u[k] = u[k] + c * m[k]
        return u

    def payload(self, state: FedAMPServerState, rnd: int, client_id: ClientId) -> ClientPayload:
        base = super().payload(state, rnd, client_id)
        return FedAMPPayload(**dataclasses.asdict(base), cloud=self.cloud_model(state, client_id))

    def aggregate(
        self, state: FedAMPServerState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> FedAMPServerState:
        models = dict(state.client_models)
        for u in updates:
            if u.params is not None:
                models[u.client_id] = u.params
        return dataclasses.replace(state, client_models=models)
