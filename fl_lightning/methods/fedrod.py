"""FedRoD: Chen & Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022, https://arxiv.org/abs/2107.00778.

Two heads on one body. The generic head `head` and the body are averaged (FedAvg) and
trained with the balanced-softmax loss on the client's class counts n_i (Ren et al. 2020):
CE(h_G(z) + log n_i, y). The personal head `phead` never leaves the client and is trained
with CE on the sum of the (detached) generic logits and its own logits on the detached
features: CE(stopgrad(h_G(z)) + h_P(stopgrad(z)), y). So the body and the generic head
get gradients from the balanced loss only, the personal head from the personalised loss
only (paper Alg. 1: θ, ψ ← ∇L_BR; φ_m ← ∇L; PFLlib `clientrod.py` detaches the same
way). The two losses are one sum with disjoint parameters, so one SGD step equals
PFLlib's two optimisers with the same learning rate.

Prediction on a client: h_G(z) + h_P(z) (`accuracy`); `generic/accuracy` is h_G alone.
The personal head starts as a copy of the initial generic head (PFLlib: `deepcopy`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..core.messages import Broadcast
from ..core.objective import ClientObjective
from ..core.strategy import FedAvgStrategy
from .configs.fedrod import FedRoDConfig

#: the state-dict prefix of the personal head
PHEAD = "phead."


def balanced_softmax_loss(logits: torch.Tensor, y: torch.Tensor, class_counts: torch.Tensor) -> torch.Tensor:
    """CE(logits + log n_c, y): classes the client never saw get logit −inf (weight 0)."""
    return F.cross_entropy(logits + class_counts.to(logits).log(), y)


class FedRoDObjective(ClientObjective[Broadcast]):
    def __init__(self, model: nn.Module, **kwargs: Any) -> None:
        head = model.get_submodule("head")
        model.add_module("phead", copy.deepcopy(head))
        super().__init__(model, **kwargs)

    def phead(self, z: torch.Tensor) -> torch.Tensor:
        """The personal head's logits."""
        out: torch.Tensor = self.model.get_submodule("phead")(z)
        return out

    def is_personal(self, key: str) -> bool:
        return key.startswith(PHEAD)

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        assert self.class_counts is not None  # single-label data: FedRoDConfig.single_label
        z = self.represent(x)
        self.batch_features = z
        out_g = self.classify(z)
        out_p = self.phead(z.detach())
        return {
            "bsm": balanced_softmax_loss(out_g, y, self.class_counts),
            "ce": F.cross_entropy(out_g.detach() + out_p, y),
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.represent(x)
        out: torch.Tensor = self.classify(z) + self.phead(z)
        return out

    def eval_heads(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        return {"": self.forward, "generic": lambda x: self.classify(self.represent(x))}


class FedRoD(FedAvgStrategy[FedRoDConfig]):
    objective_cls = FedRoDObjective
