"""SCAFFOLD: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020, https://arxiv.org/abs/1910.06378.

Differs from FedAvg by control variates: every gradient step adds (c − c_i); after local
training the client sets c_i⁺ = c_i − c + (x − y)/(K·lr) (option II) and uploads
Δc_i = c_i⁺ − c_i next to its weights; the server moves c by (|S|/N)·mean(Δc_i).
Weights are averaged as in FedAvg (global learning rate 1). Variates cover trainable
parameters only, not batch-norm statistics.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..core.messages import Broadcast, ClientPayload, ClientState, ClientUpdate, ServerState, extend
from ..core.objective import ClientObjective
from ..core.params import to_cpu
from ..core.strategy import Strategy
from ..core.types import StateDict
from . import METHODS


@dataclass
class ScaffoldServerState(ServerState):
    c_global: StateDict = field(default_factory=dict)


@dataclass
class ScaffoldClientState(ClientState):
    c_local: StateDict = field(default_factory=dict)


@dataclass
class ScaffoldBroadcast(Broadcast):
    c_global: StateDict = field(default_factory=dict)


@dataclass
class ScaffoldUpdate(ClientUpdate):
    c_delta: StateDict = field(default_factory=dict)


class ScaffoldObjective(ClientObjective):
    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        assert isinstance(broadcast, ScaffoldBroadcast)
        state = payload.client_state if payload is not None else None
        zeros = {k: torch.zeros_like(p) for k, p in self.model.named_parameters()}
        self._c = broadcast.c_global or zeros
        self._ci = state.c_local if isinstance(state, ScaffoldClientState) and state.c_local else zeros
        self._steps = 0

    def on_train_start(self) -> None:
        dev = next(self.model.parameters()).device
        self._x = {k: p.detach().clone() for k, p in self.model.named_parameters()}
        self._corr = {k: (self._c[k] - self._ci[k]).to(dev) for k in self._x}

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        for k, p in self.model.named_parameters():
            if p.grad is not None:
                p.grad.add_(self._corr[k])
        self._steps += 1

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        base = super().end_round(payload, num_examples)
        scale = 1.0 / (max(self._steps, 1) * self.lr)
        y = dict(self.model.named_parameters())
        c_new = {
            k: self._ci[k].cpu() - self._c[k].cpu() + (self._x[k] - y[k].detach()).cpu() * scale for k in self._x
        }
        return extend(
            base,
            ScaffoldUpdate,
            client_state=ScaffoldClientState(c_local=to_cpu(c_new)),
            c_delta={k: c_new[k] - self._ci[k].cpu() for k in c_new},
        )


@METHODS.register("scaffold")
class Scaffold(Strategy):
    name = "scaffold"
    objective_cls = ScaffoldObjective

    def init_state(self, global_params: StateDict) -> ServerState:
        return ScaffoldServerState(round=0, global_params=global_params)

    def broadcast(self, state: ServerState, rnd: int) -> Broadcast:
        assert isinstance(state, ScaffoldServerState)
        return ScaffoldBroadcast(round=rnd, global_params=state.global_params, c_global=state.c_global)

    def aggregate(self, state: ServerState, updates: Sequence[ClientUpdate]) -> ServerState:
        new = super().aggregate(state, updates)
        deltas = [u.c_delta for u in updates if isinstance(u, ScaffoldUpdate)]
        if deltas:
            frac = len(deltas) / self.num_clients
            c = state.c_global or {k: torch.zeros_like(v) for k, v in deltas[0].items()}  # type: ignore[attr-defined]
            mean = {k: torch.stack([d[k] for d in deltas]).mean(0) for k in deltas[0]}
            new = dataclasses.replace(new, c_global={k: c[k] + frac * mean[k] for k in mean})
        return new
