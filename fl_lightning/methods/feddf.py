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
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from ..core.errors import ConfigError
from ..core.messages import Broadcast, ClientUpdate, ServerState
from ..core.params import to_cpu
from ..core.strategy import MethodConfig, ServerContext, Strategy
from ..core.types import Metrics, StateDict
from ..server_steps.distill import batch_indices, distill, ensemble_mean, model_from
from . import METHODS


@dataclass
class FedDFConfig(MethodConfig):
    name: str = "feddf"
    distill_steps: int = 500  # server steps per round (the paper: <= 1e4 with early stopping)
    distill_batch_size: int = 128
    distill_lr: float = 1e-3  # Adam (the paper's)
    temperature: float = 1.0  # T of the softened KL


DistillConfigT = TypeVar("DistillConfigT", bound=MethodConfig)


def require_server_subset(method: str, run: dict[str, Any]) -> None:
    if not run["data"].get("server_subset"):
        raise ConfigError(
            f"method {method} distils on unlabeled server images: set data.server_subset=N "
            "(N training images taken out of every client's data)"
        )


def positive_fields(config: MethodConfig, names: Sequence[str]) -> None:
    for name in names:
        if getattr(config, name) <= 0:
            raise ConfigError(f"method.{name} must be > 0 (got {getattr(config, name)})")


class ServerDistillation(Strategy[DistillConfigT, ServerState, Broadcast]):
    """FedAvg on the clients, then a distillation on the server's unlabeled images (FedDF,
    FedBE): `distil` gets the round's FedAvg mean (`state.global_params`) and client models."""

    @classmethod
    def check_run(cls, config: DistillConfigT, run: dict[str, Any]) -> None:
        require_server_subset(cls.name, run)

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


@METHODS.register("feddf")
class FedDF(ServerDistillation[FedDFConfig]):
    name = "feddf"

    def __init__(self, config: FedDFConfig, *args: Any, **kwargs: Any) -> None:
        positive_fields(config, ("distill_steps", "distill_batch_size", "distill_lr", "temperature"))
        super().__init__(config, *args, **kwargs)

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
