"""Ditto: Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, https://arxiv.org/abs/2012.04221.

Two models per client. The global model w is FedAvg: each sampled client trains the
round's w^t on cross-entropy and uploads it. Then (paper Alg. 1) the client's personal model
v, which never leaves it, is trained on cross-entropy plus the proximal pull
(λ/2)·||v − w^t||² to the round's global model (PFLlib `clientditto.py`'s
`PerturbedGradientDescent` adds λ(v − w^t) to the gradient: the same thing).

v is client state (component `ditto/personal`, the whole state dict, batch-norm statistics
included). It starts as the first global model the client receives (PFLlib: a copy of the
initial model; the same when the client first trains in round 1). `begin_round` leaves v in
the model, so evaluation on the client's own split scores the personal model (`accuracy`);
`global/accuracy` scores w^t on the same split. In a fit the phases swap the weights: phase
`global` trains w^t, phase `personal` trains v, and `end_round` keeps v and uploads w.

Defaults: λ = `lam` = 0.1 (our choice; Ditto tunes λ per data set, and PFLlib's `-mu`
defaults to 0, which would make v plain local training); `personal_epochs` = 1 (PFLlib
`-pls plocal_epochs`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState
from ..core.objective import ClientObjective, Phase, with_params
from ..core.params import to_cpu
from ..core.strategy import Strategy
from ..core.types import StateDict
from .configs.ditto import DittoConfig

#: the client-state component holding the personal model v
PERSONAL_MODEL = "ditto/personal"


def _clone(sd: StateDict) -> StateDict:
    return {k: v.detach().clone() for k, v in sd.items()}


class DittoObjective(ClientObjective[Broadcast]):
    def __init__(self, model: nn.Module, lam: float = 0.1, personal_epochs: int = 1, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.lam, self.personal_epochs = lam, personal_epochs
        self._w_global: StateDict = {}
        self._w_local: StateDict = {}
        self._anchor: list[torch.Tensor] = []

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)  # the model holds w^t
        self._w_global = _clone(self.model_state())
        self._w_local = {}
        v = self.client_state.get(PERSONAL_MODEL)
        if v is not None:  # the model holds v: what evaluation scores
            self.load_params(v)

    def phases(self) -> list[Phase]:
        return [Phase("global"), Phase("personal", epochs=self.personal_epochs)]

    def on_train_start(self) -> None:
        # After the Trainer moved the model to its device; swap in the phase's model.
        super().on_train_start()
        if self.phase.name == "global":
            self.client_state[PERSONAL_MODEL] = to_cpu(self.model_state())  # v, kept
            self.load_params(self._w_global)
        else:
            self._w_local = _clone(self.model_state())  # w after the local update
            self.load_params(self.client_state[PERSONAL_MODEL])
            dev = next(self.model.parameters()).device
            self._anchor = [self._w_global[n].to(dev) for n, _ in self.model.named_parameters()]

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        terms = super().loss_terms(batch)
        if self.phase.name == "personal" and self.lam > 0:
            sq = torch.zeros((), device=self._anchor[0].device)
            for p, a in zip(self.model.parameters(), self._anchor, strict=True):
                sq = sq + ((p - a) ** 2).sum()
            terms["prox"] = 0.5 * self.lam * sq
        return terms

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        self.client_state[PERSONAL_MODEL] = to_cpu(self.model_state())  # v
        self.load_params(self._w_local)  # upload w
        return super().end_round(payload, num_examples)

    def eval_heads(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """`""`: the personal model v (what the model holds after `begin_round`);
        `"global"`: the round's global model w^t on the same data."""
        return {"": self.forward, "global": with_params(self.model, self._w_global)}


class Ditto(Strategy[DittoConfig, ServerState, Broadcast]):
    objective_cls = DittoObjective

    def warnings(self) -> list[str]:
        if self.config.lam == 0:
            return ["ditto with method.lam=0: the personal models are plain local training"]
        return []
