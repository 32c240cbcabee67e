"""FedDistill: Jeong et al., "Communication-Efficient On-Device Machine Learning: Federated
Distillation and Augmentation under Non-IID Private Data", 2018,
https://arxiv.org/abs/1811.11479 (logit sharing; the HtFL baseline of FedTGP/FedTSP).

Clients share per-class mean logits instead of weights: each trains
cross-entropy + γ·MSE(logits, L[y]) towards the global per-class logits L [C, C] (classes
someone holds), then uploads its per-class mean logits (eval mode, over its training set)
and counts; the server averages them per class. Models stay personal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState, extend
from ..core.strategy import ServerContext, Strategy
from ..core.types import StateDict
from ..server_steps.prototypes import aggregate_class_means
from .configs.feddistill import FedDistillConfig
from .fedproto import LocalClassMeans


@dataclass
class DistillState(ServerState):
    logits: torch.Tensor | None = None  # [C, C] global per-class mean logits
    counts: torch.Tensor | None = None  # [C]


@dataclass
class LogitBroadcast(Broadcast):
    logits: torch.Tensor | None = None
    counts: torch.Tensor | None = None


@dataclass
class LogitUpdate(ClientUpdate):
    logits: torch.Tensor | None = None  # [C, C] per-class mean logits
    counts: torch.Tensor | None = None  # [C]


class FedDistillObjective(LocalClassMeans[LogitBroadcast]):
    def __init__(self, model: torch.nn.Module, num_classes: int, gamma: float = 1.0, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.num_classes, self.gamma = num_classes, gamma

    def is_personal(self, key: str) -> bool:
        return True

    def class_mean_inputs(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)  # logits

    def begin_round(self, broadcast: LogitBroadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        self._glob = broadcast.logits
        self._glob_n = broadcast.counts

    def on_train_start(self) -> None:
        super().on_train_start()
        if self._glob is not None and self._glob_n is not None:
            self._g, self._has = self._glob.to(self.device), (self._glob_n > 0).to(self.device)

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        z = self.represent(x)
        self.batch_features = z
        logits = self.classify(z)
        terms = {"ce": self.task_loss(logits, y)}
        if self._glob is not None and self.gamma > 0:
            keep = self._has[y]
            if keep.any():
                terms["distill"] = self.gamma * F.mse_loss(logits[keep], self._g[y[keep]])
        return terms

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        update = super().end_round(payload, num_examples)
        means, counts = self.class_means()
        return extend(update, LogitUpdate, logits=means, counts=counts)


class FedDistill(Strategy[FedDistillConfig, DistillState, LogitBroadcast]):
    reads_each_update = "it reads each client's per-class logits"
    objective_cls = FedDistillObjective

    def objective_kwargs(self) -> dict[str, Any]:
        return {"gamma": self.config.gamma, "num_classes": self.task.num_classes}

    def init_state(self, global_params: StateDict | None) -> DistillState:
        return DistillState(round=0, global_params=None)

    def broadcast(self, state: DistillState, rnd: int) -> LogitBroadcast:
        return LogitBroadcast(round=rnd, logits=state.logits, counts=state.counts)

    def aggregate(
        self, state: DistillState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> DistillState:
        new = self.average(state, updates, ctx)
        ups = [(u.logits, u.counts) for u in updates if isinstance(u, LogitUpdate)]
        pairs = [(lg, n) for lg, n in ups if lg is not None and n is not None]
        if not pairs:
            return new
        logits, counts = aggregate_class_means(
            [lg for lg, _ in pairs], [n for _, n in pairs], self.config.weighting
        )
        return dataclasses.replace(new, logits=logits, counts=counts)
