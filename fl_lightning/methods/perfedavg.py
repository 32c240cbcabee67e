"""Per-FedAvg: Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020,
https://arxiv.org/abs/2002.07948.

The global model θ is trained for the MAML objective F_i(θ − α∇f_i(θ)): each local step
takes one batch, does an inner SGD step of size α on its first half,
θ' = θ − α∇f(θ; D), and moves θ by the outer optimiser (the run's `optim`, step β = lr)
along the gradient at θ' on its second half, ∇f(θ'; D'). This is the first-order (FO)
variant, as PFLlib's `clientperavg.py` (which draws batches of 2B and splits them; here
the run's batch is split, so `data.batch_size` = 2B matches it). `first_order=false`
differentiates through the inner step (exact second-order MAML, the Hessian-vector
product that the paper's HF variant approximates by finite differences).

Personalisation is one SGD step of size α from the round's global model on a batch of the
client's own training data, then evaluation on its own test split (PFLlib
`evaluate_one_step` / `train_one_step`; `global/accuracy` scores θ itself). The batch is the
first inner half-batch of the client's latest fit, kept with the client (component
`perfedavg/adapt_batch`); a client that never trained is scored with θ unadapted.

Defaults: α = `alpha` = null = the run's lr (PFLlib sets β = α = lr); PFLlib's optimiser
is plain SGD, hence `optim.momentum: 0` in `conf/method/perfedavg.yaml`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..core.messages import Broadcast, ClientPayload, ServerState
from ..core.objective import ClientObjective, with_params
from ..core.strategy import Strategy
from ..core.types import StateDict
from .configs.perfedavg import PerFedAvgConfig

#: the client-state component holding the batch the evaluation adapts on
ADAPT_BATCH = "perfedavg/adapt_batch"


class PerFedAvgObjective(ClientObjective[Broadcast]):
    def __init__(self, model: nn.Module, alpha: float | None = None, first_order: bool = True,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(model, **kwargs)
        self.alpha = alpha if alpha is not None else self.optim.lr
        self.first_order = first_order
        self._global: StateDict = {}
        self._kept_batch = False

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        self._global = {k: v.detach().clone() for k, v in self.model_state().items()}
        self._kept_batch = False

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        h = (len(y) + 1) // 2
        if len(y) == 1:  # a one-example client: both steps on it
            x, y = torch.cat([x, x]), torch.cat([y, y])
        if not self._kept_batch:  # the first inner batch of this fit: what evaluation adapts on
            self.client_state[ADAPT_BATCH] = {"x": x[:h].detach().cpu(), "y": y[:h].detach().cpu()}
            self._kept_batch = True
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        inner = F.cross_entropy(self.model(x[:h]), y[:h])
        grads = torch.autograd.grad(inner, [p for _, p in named], create_graph=not self.first_order)
        # FO: g carries no graph, so ∂θ'/∂θ = I and the outer gradient is ∇f(θ') itself
        fast = {n: p - self.alpha * g for (n, p), g in zip(named, grads, strict=True)}
        out: torch.Tensor = torch.func.functional_call(self.model, fast, (x[h:],))
        return {"ce": F.cross_entropy(out, y[h:]), "inner_ce": inner.detach()}

    def _adapt(self, kept: dict[str, torch.Tensor]) -> None:
        """One SGD step of size α on the kept batch, in training mode (as PFLlib)."""
        dev = next(self.model.parameters()).device
        was = self.model.training
        self.model.train()
        params = [p for p in self.model.parameters()]
        with torch.enable_grad():
            loss = F.cross_entropy(self.model(kept["x"].to(dev)), kept["y"].to(dev))
            grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.sub_(self.alpha * g)
        self.model.train(was)

    def eval_heads(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """`""`: the global model after one step on the client's kept batch (the step is
        taken here, once per evaluation); `"global"`: the global model unadapted."""
        glob = self._global
        kept = self.client_state.get(ADAPT_BATCH)
        if kept is not None:
            self._adapt(kept)
        return {"": self.forward, "global": with_params(self.model, glob)}


class PerFedAvg(Strategy[PerFedAvgConfig, ServerState, Broadcast]):
    objective_cls = PerFedAvgObjective
