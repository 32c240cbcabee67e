"""pFedMe: T. Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes",
NeurIPS 2020, https://arxiv.org/abs/2006.08848.

Each client minimises the Moreau envelope F_i(w) = min_θ f_i(θ) + (λ/2)||θ − w||². Per
local step (one batch): K inner steps approximate the personalised model,
θ ← θ − η_p(∇f(θ; batch) + λ(θ − w) + μθ) (PFLlib `pFedMeOptimizer`, μ its hidden L2
term), then the local model w takes one step of the run's optimiser on the envelope's
gradient λ(w − θ̂): with plain SGD w ← w − ηλ(w − θ̂) (PFLlib `clientpFedMe.py`). θ starts
each round at the received global model and carries over from batch to batch, as in
PFLlib and the authors' code. The client uploads w; the server mixes,
w ← (1 − β)w_prev + β·mean(w_i) on the weights (batch-norm statistics: the plain mean, as
PFLlib mixes `parameters()` only).

The personalised model θ̂ after the client's latest fit never leaves it (component
`pfedme/personal`, a whole state dict); evaluation on the client's own split scores it
(`accuracy`), `global/accuracy` the global model. (PFLlib's `personalized_params` alias the
model's parameters, so its "personalised" evaluation scores the global model; we score θ̂ as
the paper describes.)

Defaults: λ = 15, K = 5, β = 1 (paper, MNIST); η_p = 0.01 and μ = 0.001 (PFLlib). Both
codes step w with plain SGD, hence `optim.momentum: 0` in `conf/method/pfedme.yaml`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState
from ..core.objective import ClientObjective, is_weight, with_params
from ..core.params import to_cpu
from ..core.strategy import ServerContext, Strategy
from ..core.types import StateDict
from .configs.pfedme import PFedMeConfig

#: the client-state component holding the personalised model θ̂
PERSONAL_MODEL = "pfedme/personal"


class PFedMeObjective(ClientObjective[Broadcast]):
    def __init__(self, model: nn.Module, lam: float = 15.0, personal_lr: float = 0.01, inner_steps: int = 5,
                 mu: float = 0.001, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(model, **kwargs)
        self.lam, self.personal_lr, self.inner_steps, self.mu = lam, personal_lr, inner_steps, mu
        self._w_global: StateDict = {}
        self._theta: list[torch.Tensor] = []

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)  # the model holds w^t
        self._w_global = {k: v.detach().clone() for k, v in self.model_state().items()}
        self._theta = []
        theta = self.client_state.get(PERSONAL_MODEL)
        if theta is not None:  # the model holds θ̂: what evaluation scores
            self.load_params(theta)

    def on_train_start(self) -> None:
        super().on_train_start()
        self.load_params(self._w_global)  # train from w^t; θ starts there too
        self._theta = [p.detach().clone() for p in self.model.parameters()]

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        names = [n for n, _ in self.model.named_parameters()]
        w = [p.detach() for p in self.model.parameters()]
        ce = torch.zeros((), device=w[0].device)
        for _ in range(self.inner_steps):
            theta = [t.requires_grad_() for t in self._theta]
            out = torch.func.functional_call(self.model, dict(zip(names, theta, strict=True)), (x,))
            ce = self.task_loss(out, y)
            grads = torch.autograd.grad(ce, theta)
            with torch.no_grad():
                self._theta = [
                    t - self.personal_lr * (g + self.lam * (t - wi) + self.mu * t)
                    for t, g, wi in zip(theta, grads, w, strict=True)
                ]
        # gradient λ(w − θ̂) of the Moreau envelope, taken by the run's optimiser
        params = self.model.parameters()
        sq = torch.stack([((p - t) ** 2).sum() for p, t in zip(params, self._theta, strict=True)])
        return {"ce": ce.detach(), "moreau": 0.5 * self.lam * sq.sum()}

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        names = [n for n, _ in self.model.named_parameters()]
        theta = dict(zip(names, self._theta, strict=True))
        self.client_state[PERSONAL_MODEL] = to_cpu({**self.model_state(), **theta})
        return super().end_round(payload, num_examples)  # uploads w

    def eval_heads(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """`""`: the personalised model θ̂ (what the model holds after `begin_round`);
        `"global"`: the round's global model on the same data."""
        return {"": self.forward, "global": with_params(self.model, self._w_global)}


class PFedMe(Strategy[PFedMeConfig, ServerState, Broadcast]):
    objective_cls = PFedMeObjective

    def aggregate(
        self, state: ServerState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> ServerState:
        prev, new = state.global_params, self.average(state, updates, ctx)
        if prev is None or new.global_params is None or self.config.beta == 1.0:
            return new
        b = self.config.beta
        mixed = {k: (1 - b) * prev[k] + b * v if is_weight(k, v) else v for k, v in new.global_params.items()}
        return dataclasses.replace(new, global_params=mixed)
