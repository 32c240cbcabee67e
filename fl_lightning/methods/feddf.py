"""FedDF: Lin, Kong, Stich and Jaggi, "Ensemble Distillation for Robust Model Fusion in
Federated Learning", NeurIPS 2020, https://arxiv.org/abs/2006.07242.

Clients train FedAvg's objective and upload their models. The server starts from the
example-weighted average of the round's models (FedAvg) and distils into it the ensemble
of those models on unlabeled server images (`data.server_subset`, held out of every
client's data): teacher = the mean of the client models' logits (the paper's AVGLOGITS),
loss T²·KL(softmax(teacher/T) ‖ softmax(student/T)), Adam at lr 1e-3 (the paper's), one
batch per step. The student trains in train mode, so its batch-norm statistics move to
the server data, as in the paper's code.

Deviation: the paper distils for up to 10^4 steps and stops early on a validation part of
the server data (patience 10^3); here `distill_steps` is fixed (default 500) so every
round costs the same and a resumed run repeats it exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeVar

import torch
import torch.nn.functional as F

from ..core.messages import Broadcast, ClientUpdate, ServerState
from ..core.params import to_cpu
from ..core.strategy import ServerContext, Strategy
from ..core.types import Metrics, StateDict
from ..server_steps.distill import batch_indices, distill, ensemble_mean, model_from
from .configs.feddf import DistillConfig, FedDFConfig

DistillConfigT = TypeVar("DistillConfigT", bound=DistillConfig)


class ServerDistillation(Strategy[DistillConfigT, ServerState, Broadcast]):
    """FedAvg on the clients, then a distillation on the server's unlabeled images (FedDF,
    FedBE): `distil` gets the round's FedAvg mean (`state.global_params`) and client models."""

    reads_each_update = "it reads each client's model (the distillation's ensemble of teachers)"

    def server_update(
        self, state: ServerState, updates: Sequence[ClientUpdate], ctx: ServerContext
    ) -> tuple[ServerState, Metrics]:
        sent = [u for u in updates if u.params]
        if not sent or state.global_params is None or ctx.unlabeled is None:
            return state, {}
        params, metrics = self.distil(state.global_params, sent, ctx, ctx.unlabeled)
        return dataclasses.replace(state, global_params=to_cpu(params)), metrics

    def distil(
        self, mean: StateDict, sent: Sequence[ClientUpdate], ctx: ServerContext, x: torch.Tensor
    ) -> tuple[StateDict, Metrics]:
        raise NotImplementedError


class FedDF(ServerDistillation[FedDFConfig]):
    def distil(
        self, mean: StateDict, sent: Sequence[ClientUpdate], ctx: ServerContext, x: torch.Tensor
    ) -> tuple[StateDict, Metrics]:
        c, t = self.config, self.config.temperature
        teachers = [model_from(ctx.build_model, u.params, ctx.device) for u in sent if u.params]
        targets = ensemble_mean(teachers, x, c.distill_batch_size, probs=False)
        student = model_from(ctx.build_model, mean, ctx.device)

        def kl(s: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
            return F.kl_div(F.log_softmax(s / t, 1), F.softmax(teacher / t, 1), reduction="batchmean") * (
                t * t
            )

        g = torch.Generator().manual_seed(int(ctx.rng.integers(2**62)))
        order = batch_indices(len(x), c.distill_batch_size, c.distill_steps, g)
        opt = torch.optim.Adam(student.parameters(), lr=c.distill_lr)
        before, after, _ = distill(student, x, targets, order, opt, kl)
        return student.state_dict(), {"distill_loss_first": before, "distill_loss_last": after}
