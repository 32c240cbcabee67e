"""FedALA: Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated
Learning", AAAI 2023, https://arxiv.org/abs/2212.01197.

FedAvg on the server; on each client, before local training, Adaptive Local Aggregation
(ALA) builds the starting model from the received global model θ_g and the client's own
previous local model θ: the lower layers are θ_g's, each higher-layer weight is
θ + (θ_g − θ)⊙W with element-wise W ∈ [0, 1] learned on a random contiguous `rand_percent`%
of the local data, W ← clip(W − η·∇_θ' L ⊙ (θ_g − θ), 0, 1) per batch (PFLlib `utils/ALA.py`,
which the paper's code is). "Higher" = the last `layer_idx` parameter tensors (PFLlib's
count: 2 = the classifier's weight and bias). W starts at ones and persists with the
client (`fedala/weights`); at the client's first ALA it is trained epoch after epoch until the
std of the last `num_pre_loss` epoch losses falls below `threshold` (capped at
`start_max_epochs`, which PFLlib lacks), afterwards for one epoch per round. A client's
first fit skips ALA (its local model is the global one). Batch-norm statistics stay the
local model's (ALA touches parameters only, as PFLlib).

The local model after training stays with the client (`fedala/local`) and is what
evaluation on its own test split scores (`global/accuracy`: the round's global model); the
whole model is uploaded and averaged.

Defaults (PFLlib, the paper's): η = 1, s = 80%, layer_idx = 2, threshold 0.1, num_pre_loss
10, ALA batch size 10 (PFLlib's `-lbs`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..core.messages import Broadcast, ClientPayload, ClientUpdate
from ..core.objective import OwnModelObjective
from ..core.params import to_cpu
from ..core.strategy import FedAvgStrategy
from .configs.fedala import FedALAConfig

#: client-state components: the local model θ (whole state dict) and the ALA weights W
LOCAL_MODEL = "fedala/local"
ALA_WEIGHTS = "fedala/weights"


class FedALAObjective(OwnModelObjective[Broadcast]):
    own_key = LOCAL_MODEL  # θ; `global_params` holds θ_g

    def __init__(self, model: nn.Module, eta: float = 1.0, rand_percent: float = 80.0, layer_idx: int = 2,
                 threshold: float = 0.1, num_pre_loss: int = 10, ala_batch_size: int = 10,
                 start_max_epochs: int = 100, **kwargs: Any) -> None:  # fmt: skip
        super().__init__(model, **kwargs)
        self.eta, self.rand_percent, self.layer_idx = eta, rand_percent, layer_idx
        self.threshold, self.num_pre_loss = threshold, num_pre_loss
        self.ala_batch_size, self.start_max_epochs = ala_batch_size, start_max_epochs
        #: epochs of weight learning in the latest ALA (0: skipped)
        self.ala_epochs = 0

    def before_fit(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.ala_epochs = 0
        if LOCAL_MODEL not in self.client_state:
            self.load_params(self.global_params)  # the first fit starts from the global model
            return
        dev = next(self.model.parameters()).device
        named = list(self.model.named_parameters())
        lower, higher = named[: -self.layer_idx], named[-self.layer_idx :]
        with torch.no_grad():
            for n, p in lower:
                p.copy_(self.global_params[n])
        buffers = {n: b.detach().clone() for n, b in self.model.named_buffers()}
        local = [p.detach().clone() for _, p in higher]
        diff = [self.global_params[n].to(dev) - t for (n, _), t in zip(higher, local, strict=True)]
        weights = self.client_state.get(ALA_WEIGHTS)
        start = weights is None
        w = [torch.ones_like(p) if weights is None else weights[n].to(dev) for n, p in higher]
        # a contiguous random slice of the (unshuffled) local data, as PFLlib
        num = int(self.rand_percent / 100 * len(y))
        first = int(torch.randint(0, len(y) - num + 1, ()))
        xs, ys = x[first : first + num].to(dev), y[first : first + num].to(dev)
        params = [p for _, p in higher]
        self.model.train()  # as PFLlib's temporary model: batch norm on batch statistics

        def set_higher() -> None:
            with torch.no_grad():
                for p, t, d, wi in zip(params, local, diff, w, strict=True):
                    p.copy_(t + d * wi)

        set_higher()
        losses: list[float] = []
        while True:
            loss = torch.zeros((), device=dev)
            for i in range(0, num, self.ala_batch_size):
                xb, yb = xs[i : i + self.ala_batch_size], ys[i : i + self.ala_batch_size]
                with torch.enable_grad():
                    loss = F.cross_entropy(self.model(xb), yb)
                    grads = torch.autograd.grad(loss, params)
                step = zip(w, grads, diff, strict=True)
                w = [torch.clamp(wi - self.eta * g * d, 0, 1) for wi, g, d in step]
                set_higher()
            losses.append(float(loss.detach()))
            self.ala_epochs += 1
            if not start or self.ala_epochs >= self.start_max_epochs:
                break
            if len(losses) > self.num_pre_loss and np.std(losses[-self.num_pre_loss :]) < self.threshold:
                break
        self.client_state[ALA_WEIGHTS] = to_cpu({n: wi for (n, _), wi in zip(higher, w, strict=True)})
        with torch.no_grad():  # the weight learning's forwards must not move the local statistics
            for n, b in self.model.named_buffers():
                b.copy_(buffers[n])

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        update = super().end_round(payload, num_examples)
        update.metrics["ala_epochs"] = float(self.ala_epochs)
        return update


class FedALA(FedAvgStrategy[FedALAConfig]):
    objective_cls = FedALAObjective
