"""FedPHP: Li et al., "FedPHP: Federated Personalization with Inherited Private Models",
ECML PKDD 2021, as PFLlib implements it (`clientphp.py`, `serverphp.py`; a FedDTR baseline).

Each client keeps its own model (`fedphp/local`). When sampled in round R (counted from 0,
as PFLlib) it starts from a mix of the received global model w and its own model θ,
    θ ← (1 − μ_R)·w + μ_R·θ,   μ_R = mu · R / T   (T = fl.rounds),
so the inherited private model weighs more as training goes on (the first fit starts from w).
Local training: (1 − λ)·CE(θ(x), y) + λ·MMD(f_θ(x), f_w(x)), the MMD with an RBF kernel
(bandwidths 10, 15, 20, 50) between this batch's features under θ and under a frozen copy
of w (in training mode, as PFLlib's teacher, whose mode is never set). The trained θ is
uploaded and averaged (FedAvg), and kept; the model's buffers (batch-norm statistics) stay
the client's own, as PFLlib mixes parameters only. Evaluation on the client's own test split scores
it (`global/accuracy`: the round's global model).

Defaults: mu = 0.9, lam = 0.5 (ours: PFLlib's `-mu 0 -lam 1` would drop the cross-entropy
and the inheritance altogether; FedDTR does not give its settings).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..core.messages import Broadcast, ClientPayload
from ..core.objective import OwnModelObjective
from ..core.strategy import FedAvgStrategy
from .configs.fedphp import FedPHPConfig

LOCAL_MODEL = "fedphp/local"
BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


def mmd_rbf(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Biased MMD² estimate, mean over all pairs of k(x,x') + k(y,y') − 2k(x,y) with
    k = Σ_a exp(−‖·‖²/(2a)) over `BANDWIDTHS` (PFLlib's `MMD(..., 'rbf')`)."""
    dxx, dyy, dxy = torch.cdist(x, x) ** 2, torch.cdist(y, y) ** 2, torch.cdist(x, y) ** 2
    k = torch.zeros_like(dxy)
    for a in BANDWIDTHS:
        k = k + torch.exp(-0.5 * dxx / a) + torch.exp(-0.5 * dyy / a) - 2 * torch.exp(-0.5 * dxy / a)
    return k.mean()


class FedPHPObjective(OwnModelObjective[Broadcast]):
    own_key = LOCAL_MODEL  # θ; `global_params` holds w

    def __init__(
        self, model: nn.Module, mu: float = 0.9, lam: float = 0.5, rounds: int = 1, **kwargs: Any
    ) -> None:
        super().__init__(model, **kwargs)
        self.mu, self.lam, self.rounds = mu, lam, rounds
        self._round = 0
        self.__dict__["teacher"] = None  # outside the module tree: never trained or sent

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        self._round = payload.round if payload is not None else 0

    def before_fit(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Training only: the teacher is w; the model starts from the mix of w and θ."""
        dev = next(self.model.parameters()).device
        teacher = copy.deepcopy(self.model).train()  # PFLlib's model_s, whose mode is never set
        teacher.load_state_dict(self.global_params)
        teacher.requires_grad_(False)
        self.__dict__["teacher"] = teacher
        local = self.client_state.get(LOCAL_MODEL)
        if local is None:  # the first fit starts from w
            self.load_params(self.global_params)
            return
        mu = self.mu * (self._round - 1) / self.rounds  # PFLlib counts rounds from 0
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for k, v in self.model_state().items():
                if k in params:
                    v.copy_((1 - mu) * self.global_params[k].to(dev) + mu * local[k].to(dev))
                else:  # buffers (batch-norm statistics): the client's own, as PFLlib
                    v.copy_(local[k].to(dev))

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        z = self.represent(x)
        teacher = self.__dict__["teacher"]
        with torch.no_grad():
            zt = teacher.to(x.device).forward_features(x)
        return {
            "ce": (1 - self.lam) * F.cross_entropy(self.classify(z), y),
            "mmd": self.lam * mmd_rbf(z, zt),
        }


class FedPHP(FedAvgStrategy[FedPHPConfig]):
    objective_cls = FedPHPObjective

    def objective_kwargs(self) -> dict[str, Any]:
        return super().objective_kwargs() | {"rounds": max(1, self.task.rounds)}
