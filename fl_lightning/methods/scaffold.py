"""SCAFFOLD: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020, https://arxiv.org/abs/1910.06378.

Differs from FedAvg by control variates: every gradient step adds (c − c_i); after local
training the client sets c_i⁺ = c_i − c + (x − y)/(K·lr) (option II) and uploads
Δc_i = c_i⁺ − c_i next to its weights; the server moves c by (|S|/N)·mean(Δc_i).
Weights are averaged as in FedAvg (global learning rate 1). Variates cover trainable
parameters only, not batch-norm statistics.

Option II assumes plain SGD local steps: then (x − y)/(K·lr) is exactly the mean of the K
corrected gradients. With momentum m the displacement grows by up to 1/(1 − m) (10× at
0.9) and the variates overestimate the mean gradient; Adam rescales every step. So the
method's default optimiser is plain SGD (`conf/method/scaffold.yaml`) and a run with
momentum > 0 or adam/adamw is refused (a ConfigError before anything runs) unless
`method.allow_momentum=true`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState, extend
from ..core.objective import ClientObjective
from ..core.params import to_cpu
from ..core.strategy import ServerContext, Strategy
from ..core.types import StateDict
from .configs.scaffold import ScaffoldConfig

#: the client-state component holding c_i
C_LOCAL = "scaffold/c_local"


@dataclass
class ScaffoldServerState(ServerState):
    c_global: StateDict = field(default_factory=dict)


@dataclass
class ScaffoldBroadcast(Broadcast):
    c_global: StateDict = field(default_factory=dict)


@dataclass
class ScaffoldUpdate(ClientUpdate):
    c_delta: StateDict = field(default_factory=dict)


class ScaffoldObjective(ClientObjective[ScaffoldBroadcast]):
    def begin_round(self, broadcast: ScaffoldBroadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        zeros = {k: torch.zeros_like(p) for k, p in self.model.named_parameters()}
        self._c = broadcast.c_global or zeros
        self._ci = self.client_state.get(C_LOCAL) or zeros
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
            k: self._ci[k].cpu() - self._c[k].cpu() + (self._x[k] - y[k].detach()).cpu() * scale
            for k in self._x
        }
        self.client_state[C_LOCAL] = to_cpu(c_new)
        return extend(base, ScaffoldUpdate, c_delta={k: c_new[k] - self._ci[k].cpu() for k in c_new})


class Scaffold(Strategy[ScaffoldConfig, ScaffoldServerState, ScaffoldBroadcast]):
    reads_each_update = "it reads each client's control-variate change (c_delta)"
    objective_cls = ScaffoldObjective

    def objective_kwargs(self) -> dict[str, Any]:
        return {}  # allow_momentum is the config's check (`ScaffoldConfig.check`)

    def broadcast(self, state: ScaffoldServerState, rnd: int) -> ScaffoldBroadcast:
        return ScaffoldBroadcast(round=rnd, global_params=state.global_params, c_global=state.c_global)

    def aggregate(
        self, state: ScaffoldServerState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> ScaffoldServerState:
        new = self.average(state, updates, ctx)
        deltas = [u.c_delta for u in updates if isinstance(u, ScaffoldUpdate)]
        if deltas:
            frac = len(deltas) / self.num_clients
            c = state.c_global or {k: torch.zeros_like(v) for k, v in deltas[0].items()}
            mean = {k: torch.stack([d[k] for d in deltas]).mean(0) for k in deltas[0]}
            new = dataclasses.replace(new, c_global={k: c[k] + frac * mean[k] for k in mean})
        return new
