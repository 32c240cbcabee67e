"""FedTGP: Zhang et al., "FedTGP: Trainable Global Prototypes with Adaptive-Margin-Enhanced
Contrastive Learning for Data and Model Heterogeneity in Federated Learning", AAAI 2024,
https://arxiv.org/abs/2401.03230 (an HtFL baseline of FedTSP).

Clients train as in FedProto, cross-entropy + λ·MSE(f(x), P[y]) towards the global
prototypes P, and upload per-class mean features (eval mode, over the local training
set) and counts. The server keeps a small generator (class embedding → Linear+ReLU →
Linear, its weights in the server state) and trains it for `server_epochs` passes over the
uploaded client prototypes with cross-entropy over negative L2 distances to the generated
prototypes, the true class's distance enlarged by the margin min(max_c gap_c, threshold),
where gap_c is class c's smallest distance to another class's average prototype. The
generated prototypes are broadcast. Models stay personal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..core.messages import ClientPayload, ClientUpdate, ServerState, extend
from ..core.strategy import ServerContext, Strategy
from ..core.types import Metrics, StateDict
from ..server_steps.prototypes import (
    aggregate_class_means,
    class_gaps,
    init_prototype_generator,
    train_global_prototypes,
)
from .configs.fedtgp import FedTGPConfig
from .fedproto import FedProtoObjective, LocalClassMeans, PrototypeBroadcast, PrototypeUpdate


@dataclass
class FedTGPState(ServerState):
    generator: StateDict = dataclasses.field(default_factory=dict)  # TrainablePrototypes weights
    prototypes: torch.Tensor | None = None  # [C, D] generated global prototypes
    proto_counts: torch.Tensor | None = None  # [C] client examples per class, at least 1 (all are targets)


class FedTGPObjective(LocalClassMeans[PrototypeBroadcast], FedProtoObjective[PrototypeBroadcast]):
    """FedProto's client loss; prototypes from an eval-mode pass after training."""

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        update = super().end_round(payload, num_examples)
        means, counts = self.class_means()
        return extend(update, PrototypeUpdate, prototypes=means, proto_counts=counts)


class FedTGP(Strategy[FedTGPConfig, FedTGPState, PrototypeBroadcast]):
    reads_each_update = "it reads each client's class prototypes"
    objective_cls = FedTGPObjective

    def objective_kwargs(self) -> dict[str, Any]:
        return {"lam": self.config.lam, "num_classes": self.task.num_classes}

    def init_state(self, global_params: StateDict | None) -> FedTGPState:
        return FedTGPState(round=0, global_params=None)

    def broadcast(self, state: FedTGPState, rnd: int) -> PrototypeBroadcast:
        return PrototypeBroadcast(round=rnd, prototypes=state.prototypes, proto_counts=state.proto_counts)

    def server_update(
        self, state: FedTGPState, updates: Sequence[ClientUpdate], ctx: ServerContext
    ) -> tuple[FedTGPState, Metrics]:
        c = self.config
        ups = [(u.prototypes, u.proto_counts) for u in updates if isinstance(u, PrototypeUpdate)]
        pairs = [(p, n) for p, n in ups if p is not None and n is not None]
        if not pairs:
            return state, {}
        # one training example per (client, class it holds), in client-id order
        protos = torch.cat([p[n > 0] for p, n in pairs])
        labels = torch.cat([(n > 0).nonzero().squeeze(1) for _, n in pairs])
        avg, counts = aggregate_class_means([p for p, _ in pairs], [n for _, n in pairs], "uniform")
        margin = min(float(class_gaps(avg, counts > 0).max()), c.margin_threshold)
        gen = state.generator or init_prototype_generator(self.task.num_classes, protos.shape[1], self.seed)
        seed = int(np.random.SeedSequence([self.seed, ctx.round, 0x7A9]).generate_state(1)[0])
        gen, global_protos, loss = train_global_prototypes(
            gen, protos, labels, margin, c.server_epochs, c.server_batch_size, c.server_lr, seed
        )
        # every class has a generated prototype from now on (the authors' clients use all)
        new = dataclasses.replace(
            state, generator=gen, prototypes=global_protos, proto_counts=counts.clamp(min=1)
        )
        return new, {"margin": margin, "prototype_loss": loss}
