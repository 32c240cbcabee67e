"""FedProto: Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous
Clients", AAAI 2022, https://arxiv.org/abs/2105.00243.

Clients exchange class prototypes (mean representations) instead of weights: each
client trains cross-entropy + λ·MSE(z, P[y]) towards the global prototypes P and
uploads its per-class means and counts; the server averages them per class, weighted by
counts. Models stay personal (evaluated on each client's test split) unless
`share_weights=true`, which adds FedAvg of the weights (the global-model protocol that
FedGLCL's tables compare against).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState, extend
from ..core.objective import ClientObjective
from ..core.strategy import MethodConfig, Strategy
from ..core.types import StateDict
from . import METHODS


@dataclass
class PrototypeState(ServerState):
    prototypes: torch.Tensor | None = None  # [C, D]; rows of unseen classes are zero
    proto_counts: torch.Tensor | None = None  # [C] examples behind each row


@dataclass
class PrototypeBroadcast(Broadcast):
    prototypes: torch.Tensor | None = None
    proto_counts: torch.Tensor | None = None


@dataclass
class PrototypeUpdate(ClientUpdate):
    prototypes: torch.Tensor | None = None  # [C, D] per-class mean representation
    proto_counts: torch.Tensor | None = None  # [C]


def average_prototypes(protos: Sequence[torch.Tensor], counts: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Count-weighted mean per class over clients; classes nobody saw stay zero."""
    total = torch.stack(list(counts)).sum(0)
    summed = sum(p.double() * c.double()[:, None] for p, c in zip(protos, counts))
    mean = summed / total.clamp(min=1).double()[:, None]
    return mean.float(), total


class LocalClassMeans:
    """Mixin: after local training, the per-class means of `class_mean_inputs(x)` (default:
    the representation) over the client's training set, in eval mode without gradients, as
    the FedTGP/FedTSP code's `collect_protos` does. `class_means()` -> ([C, D], counts [C])."""

    num_classes: int

    def class_mean_inputs(self, x: torch.Tensor) -> torch.Tensor:
        return self.represent(x)  # type: ignore[attr-defined]

    def on_train_end(self) -> None:
        super().on_train_end()  # type: ignore[misc]
        was_training = self.training  # type: ignore[attr-defined]
        self.eval()  # type: ignore[attr-defined]
        sums, n = None, torch.zeros(self.num_classes, dtype=torch.long)
        with torch.no_grad():
            train = self.trainer.train_dataloader  # type: ignore[attr-defined]
            # every training example once, in order (the fit's loader shuffles, may drop one)
            for x, y in DataLoader(train.dataset, batch_size=train.batch_size or 256):
                z = self.class_mean_inputs(x.to(self.device)).float().cpu()  # type: ignore[attr-defined]
                if sums is None:
                    sums = torch.zeros(self.num_classes, z.shape[1], dtype=torch.float64)
                sums.index_add_(0, y, z.double())
                n += torch.bincount(y, minlength=self.num_classes)
        self.train(was_training)  # type: ignore[attr-defined]
        self._class_means = (sums / n.clamp(min=1)[:, None]).float()  # type: ignore[operator]
        self._class_counts = n

    def class_means(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._class_means, self._class_counts


class FedProtoObjective(ClientObjective):
    def __init__(  # type: ignore[no-untyped-def]
        self, model: torch.nn.Module, num_classes: int, lam: float = 1.0, share_weights: bool = False, **kwargs
    ) -> None:
        super().__init__(model, **kwargs)
        self.num_classes, self.lam, self.share_weights = num_classes, lam, share_weights

    def is_personal(self, key: str) -> bool:
        return not self.share_weights

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        self._protos = getattr(broadcast, "prototypes", None)
        self._proto_counts = getattr(broadcast, "proto_counts", None)
        self._sums: torch.Tensor | None = None
        self._n: torch.Tensor | None = None

    def on_train_start(self) -> None:
        if self._protos is not None:
            self._p = self._protos.to(self.device)
            self._has = (self._proto_counts > 0).to(self.device)  # type: ignore[operator]

    def on_train_epoch_start(self) -> None:  # prototypes come from the last local epoch
        self._sums, self._n = None, None

    def loss_terms(self, batch):  # type: ignore[no-untyped-def]
        terms = super().loss_terms(batch)
        x, y = batch
        z = self.batch_features
        if self._protos is not None and self.lam > 0:
            keep = self._has[y]
            if keep.any():
                terms["proto"] = self.lam * F.mse_loss(z[keep], self._p[y[keep]])
        zd = z.detach()
        if self._sums is None:
            self._sums = torch.zeros(self.num_classes, zd.shape[1], device=zd.device)
            self._n = torch.zeros(self.num_classes, device=zd.device)
        self._sums.index_add_(0, y, zd)
        self._n.index_add_(0, y, torch.ones_like(y, dtype=zd.dtype))  # type: ignore[union-attr]
        return terms

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        update = super().end_round(payload, num_examples)
        n = self._n.cpu()  # type: ignore[union-attr]
        protos = self._sums.cpu() / n.clamp(min=1)[:, None]  # type: ignore[union-attr]
        return extend(update, PrototypeUpdate, prototypes=protos, proto_counts=n.long())


@dataclass
class FedProtoConfig(MethodConfig):
    name: str = "fedproto"
    lam: float = 1.0  # weight of the prototype term (FedGLCL used mu = 1)
    share_weights: bool = False


@METHODS.register("fedproto")
class FedProto(Strategy):
    name = "fedproto"
    config_cls = FedProtoConfig
    objective_cls = FedProtoObjective

    @property
    def personalised(self) -> bool:  # type: ignore[override]
        return not self.config.share_weights  # type: ignore[attr-defined]

    def objective_kwargs(self) -> dict:
        return super().objective_kwargs() | {"num_classes": self.task.num_classes}

    def init_state(self, global_params: StateDict) -> ServerState:
        return PrototypeState(round=0, global_params=global_params)

    def broadcast(self, state: ServerState, rnd: int) -> Broadcast:
        assert isinstance(state, PrototypeState)
        return PrototypeBroadcast(
            round=rnd,
            global_params=state.global_params if self.config.share_weights else None,  # type: ignore[attr-defined]
            prototypes=state.prototypes,
            proto_counts=state.proto_counts,
        )

    def aggregate(self, state: ServerState, updates: Sequence[ClientUpdate]) -> ServerState:
        new = super().aggregate(state, updates)
        ups = [u for u in updates if isinstance(u, PrototypeUpdate) and u.prototypes is not None]
        if not ups:
            return new
        protos, counts = average_prototypes([u.prototypes for u in ups], [u.proto_counts for u in ups])  # type: ignore[misc]
        return dataclasses.replace(new, prototypes=protos, proto_counts=counts)
