"""FedLGT: Liu et al., "Language-Guided Transformer for Federated Multi-Label Classification",
AAAI 2024, https://arxiv.org/abs/2312.07165.

C-Tran (`model=ctran`) trained with FedAvg, plus two pieces:

- ULE (`label_embedding=text`): the label embeddings are a frozen text encoder's features of
  "The photo contains {class}." and the state embeddings its features of "positive" and
  "negative" (unknown = zeros); fixed on every client, so never trained, sent or averaged.
  `learned` is C-Tran's own (FedC-Tran); `frozen_random` keeps them fixed but random, which
  separates "frozen" from "meaningful text". `state_embedding` decides the state table apart:
  `text` (frozen text features; the authors' code keeps them so for FedC-Tran too) or
  `learned` (the paper's description of FedC-Tran).
- CA-MLE (`ca_mle`): each local step first draws C-Tran's label-mask-training mask (`lmt`:
  per sample, a uniform number in [0, floor(known_fraction * C)] of labels are known and
  carry their true state), then the received global model, in eval mode with every state
  unknown, scores the batch; labels it is unsure of (|p - threshold| <= epsilon) become
  unknown as well. Per sample, over the whole batch (the authors' loop only calibrates the
  first image of each batch: spec §2.3, read as a bug).

Loss: binary cross-entropy on the unknown positions only, summed over the batch (the
authors' code; `reduction=mean` averages over the unknown positions). Aggregation: FedAvg of
every weight. Evaluation: the global model with every state unknown.

`method=fedctran` is this file with `label_embedding=learned ca_mle=false`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import ConfigError
from ..core.messages import Broadcast, ClientPayload, ServerState
from ..core.objective import ClientObjective
from ..core.strategy import Strategy
from ..models.ctran import UNKNOWN, CTran
from ..text.targets import class_targets
from .configs.fedlgt import FedCTranConfig, FedLGTConfig


def label_mask_training(y: torch.Tensor, known_fraction: float) -> torch.Tensor:
    """C-Tran's LMT mask [B, C] (True = known): per sample, k ~ UniformInt[0, floor(f*C)]
    labels chosen uniformly at random are known. Draws from torch's global generator (the
    host seeds it per client and round)."""
    b, c = y.shape
    k = torch.randint(0, int(known_fraction * c) + 1, (b, 1), device=y.device)
    ranks = torch.rand(b, c, device=y.device).argsort(1).argsort(1)  # a random permutation per row
    return ranks < k


class LGTObjective(ClientObjective[Broadcast]):
    def __init__(
        self,
        model: nn.Module,
        label_features: torch.Tensor | None = None,
        state_features: torch.Tensor | None = None,
        lmt: bool = True,
        known_fraction: float = 0.75,
        ca_mle: bool = True,
        epsilon: float = 0.02,
        threshold: float = 0.5,
        reduction: str = "sum",
        **kwargs: Any,
    ) -> None:
        assert isinstance(model, CTran)  # `FedLGTConfig.check_model` refused any other before the run
        if label_features is not None or state_features is not None:
            model.fix_embeddings(label_features, state_features)
        super().__init__(model, **kwargs)
        self.lmt, self.known_fraction, self.ca_mle = lmt, known_fraction, ca_mle
        self.epsilon, self.threshold, self.reduction = epsilon, threshold, reduction
        # the received global model, frozen for the round; kept out of the module tree so
        # that it is neither trained nor part of any state dict
        self.__dict__["global_model"] = None

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        # a fit (or a client-side evaluation, which never reads it; the driver's has no payload)
        if self.ca_mle and payload is not None:
            g = copy.deepcopy(self.model).eval()
            g.requires_grad_(False)
            self.__dict__["global_model"] = g

    def known_mask(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Which labels of the batch are given to the model (True) rather than predicted."""
        known = (
            label_mask_training(y, self.known_fraction)
            if self.lmt
            else torch.zeros(y.shape, dtype=torch.bool, device=y.device)
        )
        g: CTran | None = self.__dict__["global_model"]
        if self.ca_mle and g is not None:
            with torch.no_grad():
                p = torch.sigmoid(g.to(x.device)(x))
            known &= (p - self.threshold).abs() > self.epsilon  # uncertain: unknown
        return known

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        y = y.to(torch.float32)
        known = self.known_mask(x, y)
        states = torch.where(known, y.long(), torch.full_like(y, UNKNOWN, dtype=torch.long))
        logits = self.model(x, states)
        unknown = (~known).to(logits.dtype)
        bce = (F.binary_cross_entropy_with_logits(logits, y, reduction="none") * unknown).sum()
        if self.reduction == "mean":
            bce = bce / unknown.sum().clamp(min=1.0)
        return {"bce": bce}


class FedLGT(Strategy[FedLGTConfig, ServerState, Broadcast]):
    objective_cls = LGTObjective

    def __init__(self, config: FedLGTConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.label_features: torch.Tensor | None = None
        self.state_features: torch.Tensor | None = None
        self.width: int | None = None  # the text width, which C-Tran's d_model follows by default
        self.text_encoder = "none"
        text_cfg = dict(self.task.text)
        learned = config.label_embedding == "learned"
        if text_cfg.get("name", "none") == "none":
            text_cfg = {"name": "minilm"}  # the default encoder (offline), for fedctran's width too
        from ..text import class_text_features

        labels = class_text_features(text_cfg, list(self.task.class_names), templates=[config.prompt])
        assert isinstance(labels, torch.Tensor)
        self.width, self.text_encoder = int(labels.shape[1]), text_cfg["name"]
        states = class_text_features(text_cfg, list(config.state_words), templates=["{}"])
        assert isinstance(states, torch.Tensor)
        if config.label_embedding == "frozen_random":  # same shape and norm, no meaning
            g = torch.Generator().manual_seed(self.seed)
            labels = F.normalize(torch.randn(labels.shape, generator=g), dim=-1)
            states = F.normalize(torch.randn(states.shape, generator=g), dim=-1)
        labels = class_targets(config.targets, labels, self.seed, self.task.coarse_groups)
        # another draw than the labels' (the same seed would make the uniform states the first label rows)
        states = class_targets(config.state_targets, states, self.seed + 7919)
        # learned tables stay parameters of the model (None); FedC-Tran next to FedLGT: the same width
        self.label_features = None if learned else labels
        self.state_features = None if config.state_embedding == "learned" else states

    def model_kwargs(self, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """`model.d_model: null` becomes the text width whenever a text encoder is chosen, so
        FedC-Tran and FedLGT compare at one width; fixed embeddings require it."""
        if self.width is None:
            return kwargs
        d = self.width
        if self.label_features is None and self.state_features is None:  # all learned: a default only
            return kwargs if kwargs.get("d_model") is not None else {**kwargs, "d_model": d}
        if kwargs.get("d_model") not in (None, d):
            raise ConfigError(
                f"{self.name}'s label embeddings are {self.text_encoder}'s {d}-d features: "
                f"model.d_model must be {d} or null (got {kwargs['d_model']})"
            )
        return {**kwargs, "d_model": d}

    def objective_kwargs(self) -> dict[str, Any]:
        return super().objective_kwargs() | {
            "label_features": self.label_features,
            "state_features": self.state_features,
        }

    def summary(self) -> dict[str, Any]:
        return super().summary() | {"text_encoder": self.text_encoder, "text_dim": self.width}


class FedCTran(FedLGT):
    """C-Tran with learned label embeddings and frozen text state embeddings (the authors'
    code; `method.state_embedding=learned` learns them too, as the paper describes), FedAvg."""

    config_cls = FedCTranConfig
