"""`runtime.batched`: a client's local step written as a pure function, so K clients' models
can step together (`torch.func`: stacked weights, `vmap(grad(...))`; `runtime/batched.py`).

Clients of one round hold different numbers of examples. As fedjax's `for_each_client`, each
client's batches are padded to the batch size with a weight per example (`MaskedStep.w`: 1 for
the client's own, 0 for padding), and a client whose batches have run out takes no step: every
client sees exactly the batches and steps it would see alone. A loss term is therefore a
*masked mean* over the batch (`MaskedStep.mean`), never a plain `mean()`.

An objective says it can be trained this way by declaring `batched_step = True` in its own
class body (`ClientObjective.masked_terms` is then its loss, term for term); a subclass that
changes the client step in any way must declare it anew (an inherited declaration does not
count), so a method nobody wrote the function for is refused, not trained wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .optim import OptimConfig


@dataclass
class MaskedStep:
    """One client's padded batch, as its loss sees it inside the vmap over clients (every
    tensor is that client's: no client axis).

    Attributes:
        params: the objective's parameters (`named_parameters()` names) being trained.
        start: their values when this round's local training started (FedProx's anchor).
        x, y: the batch, padded to the batch size.
        w: [B] 1.0 for the client's examples, 0.0 for padding.
        z: the batch's representation (`represent(x)`, what `loss_terms` calls `batch_features`).
        logits: `classify(z)`.
    """

    params: dict[str, torch.Tensor]
    start: dict[str, torch.Tensor]
    x: torch.Tensor
    y: torch.Tensor
    w: torch.Tensor
    z: torch.Tensor
    logits: torch.Tensor

    def mean(self, per_example: torch.Tensor) -> torch.Tensor:
        """The mean over the client's own examples (padding weighs 0; an empty batch gives 0)."""
        return (per_example * self.w).sum() / self.w.sum().clamp(min=1)


def batched_refusal(
    method: str, objective_cls: type, optim: OptimConfig, precision: str, family: bool
) -> str | None:
    """Why a run cannot train its clients batched (one line), or None: checked from the config
    alone, before any data is loaded (the model's layers are checked once it is built:
    `model_refusal`)."""
    if not vars(objective_cls).get("batched_step", False):
        return (
            f"method {method!r} cannot train clients batched: its client step "
            f"({objective_cls.__name__}) is not written as a function of stacked weights"
        )
    if optim.name != "sgd":
        return f"optim.name={optim.name}: batched clients train with plain SGD only"
    if optim.grad_clip is not None:
        return "optim.grad_clip: batched clients do not clip gradients"
    if str(precision) != "32":
        return f"runtime.precision={precision}: batched clients train in 32-bit only"
    if family:
        return "a model family (a different architecture per client) cannot be stacked"
    return None


def model_refusal(objective: Any) -> str | None:
    """Why this built objective cannot train batched (one line), or None: batch norm (its
    batch statistics would count the padding), dropout (its random draws would differ from
    one client alone), or the objective's own reason (`batched_refusal()`)."""
    for name, m in objective.named_modules():
        layer = name.removeprefix("model.")
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return f"the model has batch norm ({layer}); batched clients need a model without it"
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return f"the model has dropout ({layer}); batched clients need a model without it"
    reason: str | None = objective.batched_refusal()
    return reason
