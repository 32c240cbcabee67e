"""MOON: Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021,
https://arxiv.org/abs/2103.16257.

Differs from FedAvg by one client loss term: the representation z of the local model is
pulled towards the global model's z_g and pushed from the client's previous local
model's z_p: −log(e^{cos(z,z_g)/T} / (e^{cos(z,z_g)/T} + e^{cos(z,z_p)/T})), weight mu.
The previous local model is client state, kept on the driver (first round: the global).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..core.messages import ClientPayload, ClientState, ClientUpdate, extend
from ..core.objective import ClientObjective
from ..core.params import to_cpu
from ..core.strategy import MethodConfig, Strategy
from ..core.types import StateDict
from . import METHODS


@dataclass
class MoonClientState(ClientState):
    prev_params: StateDict = field(default_factory=dict)


class ModelContrastive:
    """Mixin for any objective: adds `moon` = mu · model-contrastive loss on `represent`."""

    moon_mu: float = 0.0
    moon_temperature: float = 0.5

    def begin_round(self, broadcast, payload) -> None:  # type: ignore[no-untyped-def]
        super().begin_round(broadcast, payload)  # type: ignore[misc]
        state = payload.client_state if payload is not None else None
        self._prev = state.prev_params if isinstance(state, MoonClientState) else None

    def on_train_start(self) -> None:
        super().on_train_start()  # type: ignore[misc]
        if self.moon_mu <= 0:
            return
        glob = copy.deepcopy(self.model).eval()  # type: ignore[attr-defined]
        prev = copy.deepcopy(glob)
        if self._prev is not None:
            prev.load_state_dict(self._prev)
        for m in (glob, prev):
            m.requires_grad_(False)
        self._frozen = (glob, prev)  # a tuple: not registered as submodules or parameters

    def loss_terms(self, batch):  # type: ignore[no-untyped-def]
        terms = super().loss_terms(batch)  # type: ignore[misc]
        if self.moon_mu > 0:
            x = batch[0]
            z = self.batch_features  # type: ignore[attr-defined]
            with torch.no_grad():
                zg, zp = (self.represent(x, m) for m in self._frozen)  # type: ignore[attr-defined]
            logits = torch.stack([F.cosine_similarity(z, zg, -1), F.cosine_similarity(z, zp, -1)], 1)
            target = torch.zeros(len(x), dtype=torch.long, device=x.device)
            terms["moon"] = self.moon_mu * F.cross_entropy(logits / self.moon_temperature, target)
        return terms

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        update = super().end_round(payload, num_examples)  # type: ignore[misc]
        if self.moon_mu <= 0:
            return update
        personal = update.client_state.personal_params if update.client_state else {}
        state = MoonClientState(personal_params=personal, prev_params=to_cpu(self.model.state_dict()))  # type: ignore[attr-defined]
        return extend(update, type(update), client_state=state)


class MoonObjective(ModelContrastive, ClientObjective):
    def __init__(self, model: torch.nn.Module, mu: float = 1.0, temperature: float = 0.5, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(model, **kwargs)
        self.moon_mu, self.moon_temperature = mu, temperature


@dataclass
class MoonConfig(MethodConfig):
    name: str = "moon"
    mu: float = 1.0
    temperature: float = 0.5


@METHODS.register("moon")
class Moon(Strategy):
    name = "moon"
    config_cls = MoonConfig
    objective_cls = MoonObjective
