"""MOON: Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021,
https://arxiv.org/abs/2103.16257.

Differs from FedAvg by one client loss term: the representation z of the local model is
pulled towards the global model's z_g and pushed from the client's previous local
model's z_p: −log(e^{cos(z,z_g)/T} / (e^{cos(z,z_g)/T} + e^{cos(z,z_p)/T})), weight mu.
The previous local model is client state (component `moon/prev`), resident with its
client (first round: the global).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState
from ..core.objective import BroadcastT, ClientObjective
from ..core.params import to_cpu
from ..core.strategy import Strategy
from .configs.moon import MoonConfig

#: the client-state component holding the client's previous local model
PREV = "moon/prev"


class ModelContrastive(ClientObjective[BroadcastT]):
    """Mixin for any objective: adds `moon` = mu · model-contrastive loss on `represent`."""

    moon_mu: float = 0.0
    moon_temperature: float = 0.5

    def on_train_start(self) -> None:
        super().on_train_start()
        if self.moon_mu <= 0:
            return
        glob = copy.deepcopy(self.model).eval()
        prev = copy.deepcopy(glob)
        if PREV in self.client_state:
            prev.load_state_dict(self.client_state[PREV])
        for m in (glob, prev):
            m.requires_grad_(False)
        self._frozen: tuple[nn.Module, nn.Module] = (glob, prev)  # a tuple: not registered as submodules

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        terms = super().loss_terms(batch)
        if self.moon_mu > 0:
            x = batch[0]
            z = self.batch_features
            with torch.no_grad():
                zg, zp = (self.represent(x, m) for m in self._frozen)
            logits = torch.stack([F.cosine_similarity(z, zg, -1), F.cosine_similarity(z, zp, -1)], 1)
            target = torch.zeros(len(x), dtype=torch.long, device=x.device)
            terms["moon"] = self.moon_mu * F.cross_entropy(logits / self.moon_temperature, target)
        return terms

    def batched_refusal(self) -> str | None:
        if self.moon_mu > 0:
            return "method.moon_mu > 0: MOON's term needs each client's previous model beside its own"
        return super().batched_refusal()

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        update = super().end_round(payload, num_examples)
        if self.moon_mu > 0:  # the previous model of the next round, kept with the client
            self.client_state[PREV] = to_cpu(self.model_state())
        return update


class MoonObjective(ModelContrastive[Broadcast]):
    def __init__(
        self, model: torch.nn.Module, mu: float = 1.0, temperature: float = 0.5, **kwargs: Any
    ) -> None:
        super().__init__(model, **kwargs)
        self.moon_mu, self.moon_temperature = mu, temperature


class Moon(Strategy[MoonConfig, ServerState, Broadcast]):
    objective_cls = MoonObjective
