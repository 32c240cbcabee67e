"""FedProto: Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous
Clients", AAAI 2022, https://arxiv.org/abs/2105.00243.

Clients exchange class prototypes (mean representations) instead of weights: each
client trains cross-entropy + λ·MSE(z, P[y]) towards the global prototypes P and
uploads its per-class means and counts; the server averages them per class, weighted by
counts. Models stay personal (evaluated on each client's test split) unless
`share_weights=true`, which adds FedAvg of the weights (the global-model protocol that
FedGLCL's tables compare against). Under `privacy=dp_fedavg` the prototypes are clipped and
noised, and their mean is over the (noised) count of clients holding each class
(core/privacy/prototypes.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ..core.batched import MaskedStep
from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState, extend
from ..core.objective import BroadcastT, ClientObjective
from ..core.privacy.prototypes import privacy_step, private_prototypes
from ..core.strategy import ServerContext, Strategy
from .configs.fedproto import FedProtoConfig


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


def average_prototypes(
    protos: Sequence[torch.Tensor], counts: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Count-weighted mean per class over clients; classes nobody saw stay zero."""
    total = torch.stack(list(counts)).sum(0)
    summed = torch.zeros(protos[0].shape, dtype=torch.float64)
    for p, c in zip(protos, counts, strict=False):
        summed = summed + p.double() * c.double()[:, None]
    mean = summed / total.clamp(min=1).double()[:, None]
    return mean.float(), total


class LocalClassMeans(ClientObjective[BroadcastT]):
    """Mixin: after local training, the per-class means of `class_mean_inputs(x)` (default:
    the representation) over the client's training set, in eval mode without gradients, as
    the FedTGP/FedTSP code's `collect_protos` does. `class_means()` -> ([C, D], counts [C])."""

    num_classes: int

    def class_mean_inputs(self, x: torch.Tensor) -> torch.Tensor:
        return self.represent(x)

    def on_train_end(self) -> None:
        super().on_train_end()
        was_training = self.training
        self.eval()
        sums: torch.Tensor | None = None
        n = torch.zeros(self.num_classes, dtype=torch.long)
        with torch.no_grad():
            train = self.trainer.train_dataloader  # a DataLoader or the host's ResidentBatches
            # every training example once, in order (the fit's loader shuffles, may drop one)
            for x, y in DataLoader(train.dataset, batch_size=train.batch_size or 256):  # type: ignore[union-attr]
                z = self.class_mean_inputs(x.to(self.device)).float().cpu()
                if sums is None:
                    sums = torch.zeros(self.num_classes, z.shape[1], dtype=torch.float64)
                sums.index_add_(0, y, z.double())
                n += torch.bincount(y, minlength=self.num_classes)
        self.train(was_training)
        assert sums is not None
        self._class_means = (sums / n.clamp(min=1)[:, None]).float()
        self._class_counts = n

    def class_means(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._class_means, self._class_counts


class FedProtoObjective(ClientObjective[BroadcastT]):
    batched_step = True

    def __init__(
        self,
        model: torch.nn.Module,
        num_classes: int,
        lam: float = 1.0,
        share_weights: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.num_classes, self.lam, self.share_weights = num_classes, lam, share_weights

    def is_personal(self, key: str) -> bool:
        return not self.share_weights

    def begin_round(self, broadcast: BroadcastT, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        # FedProto's own broadcast carries prototypes; FedTGP's subclass sends the same type
        self._protos = broadcast.prototypes if isinstance(broadcast, PrototypeBroadcast) else None
        self._proto_counts = broadcast.proto_counts if isinstance(broadcast, PrototypeBroadcast) else None
        self._sums: torch.Tensor | None = None
        self._n: torch.Tensor | None = None

    def on_train_start(self) -> None:
        if self._protos is not None and self._proto_counts is not None:
            self._p = self._protos.to(self.device)
            self._has = (self._proto_counts > 0).to(self.device)

    def on_train_epoch_start(self) -> None:  # prototypes come from the last local epoch
        self._sums, self._n = None, None

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        terms = super().loss_terms(batch)
        x, y = batch
        z = self.batch_features
        if self._protos is not None and self.lam > 0:
            keep = self._has[y]
            if keep.any():
                terms["proto"] = self.lam * F.mse_loss(z[keep], self._p[y[keep]])
        zd = z.detach()
        if self._sums is None or self._n is None:
            self._sums = torch.zeros(self.num_classes, zd.shape[1], device=zd.device)
            self._n = torch.zeros(self.num_classes, device=zd.device)
        self._sums.index_add_(0, y, zd)
        self._n.index_add_(0, y, torch.ones_like(y, dtype=zd.dtype))
        return terms

    def masked_terms(self, step: MaskedStep) -> dict[str, torch.Tensor]:
        terms = super().masked_terms(step)
        if self._protos is not None and self.lam > 0:  # MSE over the examples of seen classes
            keep = step.w * self._has[step.y].to(step.w.dtype)
            sq = ((step.z - self._p[step.y]) ** 2).sum(1)
            terms["proto"] = self.lam * (sq * keep).sum() / (keep.sum().clamp(min=1) * step.z.shape[1])
        return terms

    def epoch_sums(self, step: MaskedStep) -> dict[str, torch.Tensor]:
        classes = torch.arange(self.num_classes, device=step.y.device)  # not F.one_hot: it reads y's range
        onehot = (step.y[:, None] == classes).to(step.z.dtype) * step.w[:, None]
        return {"sums": onehot.T @ step.z.detach(), "n": onehot.sum(0)}

    def end_batched(
        self, loss_sum: torch.Tensor, term_sums: dict[str, torch.Tensor], count: int,
        epoch_sums: dict[str, torch.Tensor],
    ) -> None:  # fmt: skip
        super().end_batched(loss_sum, term_sums, count, epoch_sums)
        self._sums, self._n = epoch_sums["sums"], epoch_sums["n"]

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        update = super().end_round(payload, num_examples)
        assert self._n is not None and self._sums is not None
        n = self._n.cpu()
        protos = self._sums.cpu() / n.clamp(min=1)[:, None]
        return extend(update, PrototypeUpdate, prototypes=protos, proto_counts=n.long())


class FedProto(Strategy[FedProtoConfig, PrototypeState, PrototypeBroadcast]):
    reads_each_update = "it reads each client's class prototypes"
    objective_cls = FedProtoObjective

    def objective_kwargs(self) -> dict[str, Any]:
        return super().objective_kwargs() | {"num_classes": self.task.num_classes}

    def broadcast(self, state: PrototypeState, rnd: int) -> PrototypeBroadcast:
        return PrototypeBroadcast(
            round=rnd,
            global_params=state.global_params if self.config.share_weights else None,
            prototypes=state.prototypes,
            proto_counts=state.proto_counts,
        )

    def aggregate(
        self, state: PrototypeState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> PrototypeState:
        new = self.average(state, updates, ctx)
        ups = [(u.prototypes, u.proto_counts) for u in sorted(updates, key=lambda u: u.client_id)
               if isinstance(u, PrototypeUpdate)]  # fmt: skip
        pairs = [(p, c) for p, c in ups if p is not None and c is not None]
        private = privacy_step(self.aggregator)
        if private is not None:  # privacy=dp_fedavg: the prototypes clipped and noised, accounted
            new, protos, counts = private_prototypes(
                state, new, [p for p, _ in pairs], [c for _, c in pairs], private, ctx
            )
            if protos is None or counts is None:
                return new
        elif not pairs:
            return new
        else:
            protos, counts = average_prototypes([p for p, _ in pairs], [c for _, c in pairs])
        return dataclasses.replace(new, prototypes=protos, proto_counts=counts)
