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
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState, extend
from ..core.objective import ClientObjective
from ..core.strategy import MethodConfig, Strategy
from ..core.types import StateDict
from ..server_steps.prototypes import aggregate_class_means
from . import METHODS
from .fedproto import LocalClassMeans


@dataclass
class DistillState(ServerState):
    logits: Optional[torch.Tensor] = None  # [C, C] global per-class mean logits
    counts: Optional[torch.Tensor] = None  # [C]


@dataclass
class LogitBroadcast(Broadcast):
    logits: Optional[torch.Tensor] = None
    counts: Optional[torch.Tensor] = None


@dataclass
class LogitUpdate(ClientUpdate):
    logits: Optional[torch.Tensor] = None  # [C, C] per-class mean logits
    counts: Optional[torch.Tensor] = None  # [C]


class FedDistillObjective(LocalClassMeans, ClientObjective):
    def __init__(self, model: torch.nn.Module, num_classes: int, gamma: float = 1.0, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(model, **kwargs)
        self.num_classes, self.gamma = num_classes, gamma

    def is_personal(self, key: str) -> bool:
        return True

    def class_mean_inputs(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)  # logits

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        self._glob = getattr(broadcast, "logits", None)
        self._glob_n = getattr(broadcast, "counts", None)

    def on_train_start(self) -> None:
        super().on_train_start()
        if self._glob is not None:
            self._g, self._has = self._glob.to(self.device), (self._glob_n > 0).to(self.device)  # type: ignore[operator]

    def loss_terms(self, batch):  # type: ignore[no-untyped-def]
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


@dataclass
class FedDistillConfig(MethodConfig):
    name: str = "feddistill"
    gamma: float = 1.0  # weight of the distillation term (γ = 1 in FedTSP's baselines)
    weighting: str = "count"  # count | uniform (the HtFLlib code)


@METHODS.register("feddistill")
class FedDistill(Strategy):
    name = "feddistill"
    config_cls = FedDistillConfig
    objective_cls = FedDistillObjective
    personalised = True

    def objective_kwargs(self) -> dict:
        return {"gamma": self.config.gamma, "num_classes": self.task.num_classes}  # type: ignore[attr-defined]

    def init_state(self, global_params: StateDict | None) -> ServerState:
        return DistillState(round=0, global_params=None)

    def broadcast(self, state: ServerState, rnd: int) -> Broadcast:
        assert isinstance(state, DistillState)
        return LogitBroadcast(round=rnd, logits=state.logits, counts=state.counts)

    def aggregate(self, state: ServerState, updates: Sequence[ClientUpdate]) -> ServerState:
        new = super().aggregate(state, updates)
        ups = [u for u in updates if isinstance(u, LogitUpdate) and u.logits is not None]
        if not ups:
            return new
        logits, counts = aggregate_class_means([u.logits for u in ups], [u.counts for u in ups], self.config.weighting)  # type: ignore[attr-defined,misc]
        return dataclasses.replace(new, logits=logits, counts=counts)
