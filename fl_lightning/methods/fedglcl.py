"""FedGLCL: Yan et al., "On the Importance of Language-driven Representation Learning for
Heterogeneous Federated Learning", ICLR 2025 (shared/papers/000).

Differs from FedAvg by the client objective only: the classifier is replaced by a
projector to the text dimension, and logits are cos(image embedding, class-text
embedding)/τ against frozen text features of "a photo of a {class}" computed once on the
driver; cross-entropy over all classes (the positive included, as the authors' code
does). Prediction is the nearest class text. Aggregation is FedAvg.

Options from the paper: prompt ensembles (`templates=imagenet80`), random or random-
orthogonal class vectors instead of text (Table 10), and FedGLCL+FedProx / +MOON
(`prox_mu`, `moon_mu`: the language loss replaces cross-entropy inside those methods).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import ConfigError
from ..core.messages import Broadcast, ServerState
from ..core.objective import ClientObjective
from ..core.strategy import MethodConfig, Strategy
from . import METHODS
from .fedprox import ProximalTerm
from .moon import ModelContrastive

log = logging.getLogger(__name__)


@dataclass
class GLCLBroadcast(Broadcast):
    class_features: torch.Tensor | None = None  # [C, d] L2-normalised, sent once per round


def projector(in_dim: int, out_dim: int, final_relu: bool = True) -> nn.Sequential:
    """The papers' last projector layer: Linear → BN1d (→ ReLU)."""
    layers: list[nn.Module] = [nn.Linear(in_dim, out_dim), nn.BatchNorm1d(out_dim)]
    return nn.Sequential(*layers, nn.ReLU(inplace=True)) if final_relu else nn.Sequential(*layers)


class GLCLObjective(ModelContrastive, ProximalTerm, ClientObjective):
    def __init__(  # type: ignore[no-untyped-def]
        self,
        model: nn.Module,
        text_dim: int,
        tau: float = 0.07,
        final_relu: bool = True,
        prox_mu: float = 0.0,
        moon_mu: float = 0.0,
        moon_temperature: float = 0.5,
        **kwargs,
    ) -> None:
        model.head = projector(model.feature_dim, text_dim, final_relu)  # no classifier
        super().__init__(model, **kwargs)
        self.tau, self.prox_mu, self.moon_mu, self.moon_temperature = tau, prox_mu, moon_mu, moon_temperature
        self.register_buffer("class_features", torch.zeros(0, text_dim), persistent=False)

    def begin_round(self, broadcast: Broadcast, payload) -> None:  # type: ignore[no-untyped-def]
        super().begin_round(broadcast, payload)
        feats = getattr(broadcast, "class_features", None)
        if feats is None:
            raise ValueError("fedglcl needs class features in the broadcast")
        self.class_features = feats.to(self.class_features.device)

    def represent(self, x: torch.Tensor, model: nn.Module | None = None) -> torch.Tensor:
        return F.normalize((model if model is not None else self.model)(x), dim=-1)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        return z @ F.normalize(self.class_features, dim=-1).T / self.tau


@dataclass
class FedGLCLConfig(MethodConfig):
    name: str = "fedglcl"
    tau: float = 0.07
    templates: list[str] = field(default_factory=lambda: ["a photo of a {}"])  # or ["imagenet80"]
    class_embedding: str = "text"  # text | random | orthogonal (Table 10)
    final_relu: bool = True
    prox_mu: float = 0.0  # > 0: FedGLCL + FedProx
    moon_mu: float = 0.0  # > 0: FedGLCL + MOON
    moon_temperature: float = 0.5


def class_vectors(kind: str, text: torch.Tensor, seed: int) -> torch.Tensor:
    """Text features, or random / random-orthogonal vectors of the same shape (Table 10)."""
    if kind == "text":
        return text
    g = torch.Generator().manual_seed(seed)
    rand = torch.randn(text.shape, generator=g)
    if kind == "random":
        return F.normalize(rand, dim=-1)
    if kind == "orthogonal":
        if text.shape[0] > text.shape[1]:
            raise ConfigError(f"{text.shape[0]} orthogonal class vectors need dimension >= classes")
        q, _ = torch.linalg.qr(rand.T)
        return q.T.contiguous()
    raise ConfigError(f"method.class_embedding={kind!r} is not one of: text, random, orthogonal")


@METHODS.register("fedglcl")
class FedGLCL(Strategy):
    name = "fedglcl"
    config_cls = FedGLCLConfig
    objective_cls = GLCLObjective

    def __init__(self, config: FedGLCLConfig, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config, *args, **kwargs)
        from ..text import class_text_features

        text_cfg = dict(self.task.text)
        if text_cfg.get("name", "none") == "none":
            text_cfg = {"name": "minilm"}  # the default encoder (offline)
        templates = config.templates[0] if len(config.templates) == 1 and "{}" not in config.templates[0] else list(config.templates)
        text = class_text_features(text_cfg, list(self.task.class_names), templates=templates)
        # Derived from the config alone (cached on disk), so a resumed run gets the same.
        self.class_features = class_vectors(config.class_embedding, text, self.seed)
        self.text_encoder = text_cfg["name"]

    def objective_kwargs(self) -> dict:
        kw = super().objective_kwargs()
        for k in ("templates", "class_embedding"):
            kw.pop(k)
        return kw | {"text_dim": int(self.class_features.shape[1])}

    def broadcast(self, state: ServerState, rnd: int) -> Broadcast:
        return GLCLBroadcast(round=rnd, global_params=state.global_params, class_features=self.class_features)

    def summary(self) -> dict:
        return super().summary() | {"text_encoder": self.text_encoder, "text_dim": int(self.class_features.shape[1])}
