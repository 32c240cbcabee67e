"""`ClientObjective`: the local objective of a method, as a LightningModule.

It defines the loss and nothing else: no loops, devices, sampling or Ray. The Trainer
owns the loop; the host (serial or Ray actor) owns data and the round protocol:

    objective.begin_round(broadcast, payload)   # load global and personal state
    trainer.fit(objective, loader)              # fresh quiet Trainer per fit
    update = objective.end_round(payload, n)    # collect what leaves the client

Objectives are reused across rounds and across clients of the same architecture, so
`begin_round` must set every piece of state the round depends on.
"""
from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from .messages import Broadcast, ClientPayload, ClientState, ClientUpdate
from .params import to_cpu
from .types import StateDict


class ClientObjective(L.LightningModule):
    """Cross-entropy on a backbone's logits (FedAvg's objective); methods override hooks.

    Override `loss_terms` to change the loss, `is_personal` to keep parameters local,
    `on_before_optimizer_step` for gradient corrections, `end_round` to send more.
    """

    def __init__(
        self,
        model: nn.Module,
        lr: float = 0.05,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        optimizer: str = "sgd",
    ) -> None:
        super().__init__()
        self.model = model
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.optimizer_name = optimizer
        self._loss_sum = 0.0
        self._loss_count = 0
        #: this client's training examples per class, set by the host before each round
        #: (FedLC's calibration, prototype counts); None where labels are not single-class.
        self.class_counts: torch.Tensor | None = None

    def represent(self, x: torch.Tensor, model: nn.Module | None = None) -> torch.Tensor:
        """The representation a method aligns or compares (MOON, prototypes); `model`
        defaults to the client's own (MOON passes its frozen global/previous copies)."""
        return (model if model is not None else self.model).forward_features(x)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Class logits from a representation."""
        return self.model.forward_head(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits; evaluation takes the argmax of this."""
        return self.classify(self.represent(x))

    # --- round protocol -------------------------------------------------------------
    def is_personal(self, key: str) -> bool:
        """Parameters (by `model.state_dict()` key) that stay with their client."""
        return False

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        if broadcast.global_params is not None:
            self.load_params(broadcast.global_params)
        state = payload.client_state if payload is not None else None
        if state is not None and state.personal_params:
            self.load_params(state.personal_params)
        self._loss_sum, self._loss_count = 0.0, 0

    def load_params(self, params: StateDict) -> None:
        """Copy `params` into the model; keys absent from `params` keep their values."""
        missing = set(params) - set(self.model.state_dict())
        if missing:
            raise KeyError(f"unknown parameter keys: {sorted(missing)[:5]}")
        self.model.load_state_dict(params, strict=False)

    def shared_params(self) -> StateDict:
        return {k: v for k, v in self.model.state_dict().items() if not self.is_personal(k)}

    def personal_params(self) -> StateDict:
        return {k: v for k, v in self.model.state_dict().items() if self.is_personal(k)}

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        personal = self.personal_params()
        shared = self.shared_params()
        return ClientUpdate(
            client_id=payload.client_id,
            num_examples=num_examples,
            params=to_cpu(shared) if shared else None,
            client_state=ClientState(personal_params=to_cpu(personal)) if personal else None,
            metrics={"train_loss": self._loss_sum / max(self._loss_count, 1)},
        )

    # --- training -------------------------------------------------------------------
    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Named loss terms, summed by `training_step`. Mixins add terms after `super()`
        and may read `self.batch_features`, the batch's representation."""
        x, y = batch
        z = self.represent(x)
        self.batch_features = z
        return {"ce": self.task_loss(self.classify(z), y)}

    def task_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, y)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        terms = self.loss_terms(batch)
        loss = torch.stack(list(terms.values())).sum()
        self._loss_sum += float(loss.detach()) * len(batch[1])
        self._loss_count += len(batch[1])
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(
                params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
            )
        if self.optimizer_name == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        raise ValueError(f"unknown optimizer {self.optimizer_name!r}; valid: adam, sgd")


@torch.no_grad()
def evaluate_model(
    module: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000
) -> dict[str, float]:
    """Accuracy and mean cross-entropy of `module(x)` logits. Restores the training mode."""
    was_training = module.training
    module.eval()
    device = next(module.parameters()).device
    correct, loss_sum = 0, 0.0
    for i in range(0, len(y), batch_size):
        xb, yb = x[i : i + batch_size].to(device), y[i : i + batch_size].to(device)
        logits = module(xb)
        loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    module.train(was_training)
    n = max(len(y), 1)
    return {"accuracy": correct / n, "loss": loss_sum / n}
