"""FedAvg + τ-norm: FedAvg training, then at prediction the τ-normalised classifier of
Kang et al., "Decoupling Representation and Classifier for Long-Tailed Recognition",
ICLR 2020, https://arxiv.org/abs/1910.09217.

Training is FedAvg unchanged. Evaluation scores with each class's weight vector divided by
its norm to the power τ, w̃_c = w_c / ||w_c||^τ, in the head's last linear layer: on
long-tailed data head classes grow larger weight norms, and τ-norm evens that out without
retraining. The bias is kept as trained (Kang et al. normalise the weights only). τ = 0 is
FedAvg; the plain FedAvg head is logged beside it as `fedavg_head/*`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..core.messages import Broadcast, ServerState
from ..core.objective import ClientObjective
from ..core.strategy import Strategy
from .configs.taunorm import TauNormConfig


def last_linear(head: nn.Module) -> str:
    """The parameter prefix ('' or 'n.') of the classifier layer: the last nn.Linear of the head
    (there is one: `TauNormConfig.check_model` refused a head without)."""
    names = [n for n, m in head.named_modules() if isinstance(m, nn.Linear)]
    return f"{names[-1]}." if names[-1] else ""


def tau_normalised(weight: torch.Tensor, tau: float) -> torch.Tensor:
    """w_c / ||w_c||^τ for every class row c."""
    return weight / weight.norm(dim=1, keepdim=True) ** tau


class TauNormObjective(ClientObjective[Broadcast]):
    def __init__(self, model: nn.Module, tau: float = 1.0, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.tau = tau
        head = model.get_submodule("head")
        self._w = f"{last_linear(head)}weight"

    def tau_forward(self, x: torch.Tensor) -> torch.Tensor:
        head = self.model.get_submodule("head")
        params: dict[str, torch.Tensor] = dict(head.named_parameters())
        params[self._w] = tau_normalised(params[self._w], self.tau)
        return torch.func.functional_call(head, params, (self.represent(x),))

    def eval_heads(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        return {"": self.tau_forward, "fedavg_head": self.forward}


class TauNorm(Strategy[TauNormConfig, ServerState, Broadcast]):
    objective_cls = TauNormObjective

    def warnings(self) -> list[str]:
        return ["taunorm with method.tau=0 is FedAvg"] if self.config.tau == 0 else []
