"""FedFomo: Zhang et al., "Personalized Federated Learning with First Order Model
Optimization", ICLR 2021, https://arxiv.org/abs/2012.08565, as PFLlib implements it
(`clientfomo.py`, `serverfomo.py`; a FedDTR baseline).

No global model. The server keeps every client's latest upload (a client that has not
trained counts as the initial model) and an affinity matrix P (N x N, starting as the
identity). A sampled client i receives the models of the M clients with the largest P[i]
(M = min(`m`, clients that uploaded last round): none in round 1; ties go to the lower id).
Before training it weighs each received model θ_n by how much it lowers the loss on its
validation data, per unit of distance:
    w_n = (L(θ_old) − L(θ_n)) / (‖θ_n − θ_old‖ + 1e-5),
θ_old being its model after its previous such step (the initial model at first), and, if any
w_n > 0, replaces its model's weights by Σ max(w_n, 0)·θ_n / Σ max(w_n, 0) (buffers stay
its own). It then trains, uploads the model and w, and keeps the model (`fedfomo/personal`);
the server stores it and adds w to row i of P.

Validation data: the last `val_fraction` (20%) of the client's local training data, as
PFLlib. Deviations, both to keep the engine's data path: the client trains on all its data
(PFLlib on the other 80%, unshuffled), and L is the mean loss over the validation samples in
eval mode (PFLlib: the mean of batch means, with modules in whatever mode they were left).
Evaluation scores the client's model on its own test split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState, extend
from ..core.objective import ClientObjective
from ..core.params import to_cpu
from ..core.strategy import ServerContext, Strategy
from ..core.types import ClientId, StateDict
from .configs.fedfomo import FedFomoConfig

PERSONAL_MODEL = "fedfomo/personal"
OLD_MODEL = "fedfomo/old"  # θ_old: the model after the client's previous weighting step


@dataclass
class FedFomoServerState(ServerState):
    """`global_params`: the initial model; `client_models`: each client's latest upload;
    `affinity`: P [N, N] (float64); `uploaded`: the clients that uploaded last round."""

    client_models: dict[ClientId, StateDict] = field(default_factory=dict)
    affinity: torch.Tensor | None = None
    uploaded: list[ClientId] = field(default_factory=list)


@dataclass
class FedFomoPayload(ClientPayload):
    """`received`: (client id, model) of the M clients with the largest affinity, in order."""

    received: list[tuple[ClientId, StateDict]] = field(default_factory=list)


@dataclass
class FedFomoUpdate(ClientUpdate):
    """`weights[k]`: w_n for `ids[k]`, the models the client received."""

    ids: list[ClientId] = field(default_factory=list)
    weights: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))


class FedFomoObjective(ClientObjective[Broadcast]):
    def __init__(self, model: nn.Module, val_fraction: float = 0.2, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.val_fraction = val_fraction
        self._received: list[tuple[ClientId, StateDict]] = []
        self._weights = torch.zeros(0, dtype=torch.float64)

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        own = self.client_state.get(PERSONAL_MODEL)
        if own is not None:
            self.load_params(own)
        self._received = payload.received if isinstance(payload, FedFomoPayload) else []
        self._weights = torch.zeros(0, dtype=torch.float64)

    @torch.no_grad()
    def _val_loss(self, params: StateDict, x: torch.Tensor, y: torch.Tensor) -> float:
        dev = x.device
        scores = torch.func.functional_call(self.model, {k: t.to(dev) for k, t in params.items()}, (x,))
        return float(F.cross_entropy(scores, y))

    def before_fit(self, x: torch.Tensor, y: torch.Tensor) -> None:
        own = {k: v.detach().clone() for k, v in self.model_state().items()}
        old = self.client_state.get(OLD_MODEL, own)
        n_val = int(self.val_fraction * len(y))
        if self._received and n_val > 0:
            dev = next(self.model.parameters()).device
            xv, yv = x[-n_val:].to(dev), y[-n_val:].to(dev)
            names = [n for n, _ in self.model.named_parameters()]
            was = self.model.training
            self.model.eval()
            base = self._val_loss(old, xv, yv)
            ws = []
            for _, theta in self._received:
                diff = [(theta[k].double() - old[k].double().cpu()).flatten() for k in names]
                dist = torch.cat(diff).norm()
                ws.append((base - self._val_loss(theta, xv, yv)) / (float(dist) + 1e-5))
            self.model.train(was)
            self._weights = torch.tensor(ws, dtype=torch.float64)
            pos = self._weights.clamp(min=0)
            if float(pos.sum()) > 0:
                pos = pos / pos.sum()
                with torch.no_grad():
                    for n, p in self.model.named_parameters():
                        mix = torch.zeros_like(p, dtype=torch.float64, device="cpu")
                        for w, (_, theta) in zip(pos, self._received, strict=True):
                            mix += float(w) * theta[n].double()
                        p.copy_(mix.to(p.device, p.dtype))
        self.client_state[OLD_MODEL] = to_cpu(self.model_state())

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        self.client_state[PERSONAL_MODEL] = to_cpu(self.model_state())
        update = super().end_round(payload, num_examples)  # uploads the trained model
        return extend(update, FedFomoUpdate, ids=[c for c, _ in self._received], weights=self._weights)


class FedFomo(Strategy[FedFomoConfig, FedFomoServerState, Broadcast]):
    aggregates_through_chain = False
    aggregates_through_chain_why = "it keeps each client's model and mixes them per client"
    objective_cls = FedFomoObjective
    plain_eval_payloads = True  # evaluation scores each client's own model: no models to send

    def objective_kwargs(self) -> dict[str, Any]:
        return {"val_fraction": self.config.val_fraction}

    def init_state(self, global_params: StateDict | None) -> FedFomoServerState:
        eye = torch.eye(self.num_clients, dtype=torch.float64)
        return FedFomoServerState(round=0, global_params=global_params, affinity=eye)

    def broadcast(self, state: FedFomoServerState, rnd: int) -> Broadcast:
        return Broadcast(round=rnd)  # no global model

    def payload(self, state: FedFomoServerState, rnd: int, client_id: ClientId) -> ClientPayload:
        base = super().payload(state, rnd, client_id)
        assert state.affinity is not None and state.global_params is not None
        m = min(self.config.m, len(state.uploaded))
        order = np.argsort(-state.affinity[client_id].numpy(), kind="stable")[:m]
        received = [(int(j), state.client_models.get(int(j), state.global_params)) for j in order]
        return FedFomoPayload(**dataclasses.asdict(base), received=received)

    def aggregate(
        self, state: FedFomoServerState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> FedFomoServerState:
        assert state.affinity is not None
        models, affinity = dict(state.client_models), state.affinity.clone()
        for u in updates:
            if u.params is not None:
                models[u.client_id] = u.params
            if isinstance(u, FedFomoUpdate):
                for j, w in zip(u.ids, u.weights.tolist(), strict=True):
                    affinity[u.client_id, j] += w
        return dataclasses.replace(
            state, client_models=models, affinity=affinity, uploaded=[u.client_id for u in updates]
        )
