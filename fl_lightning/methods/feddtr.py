"""FedDTR: Zhang, Tong, Lin, Chen, "FedDTR: Leveraging intra-domain global priors via
Domain-Invariant Text Representation for Personalized Federated Learning".

Model (per client i): image encoder ω (the backbone's body, averaged); a text encoder θ
(`text`, a 1-layer MLP Linear(text_dim, d), averaged) over frozen class-prompt embeddings
𝔗 ∈ R^{C×text_dim} of "This is a {class}" (computed once on the driver, broadcast); the
personal head h_i (`head`, never overwritten by the server, but uploaded and averaged into
the global head h, Alg. 1 lines 12, 16); the frozen global head h_f = h^t and frozen text
encoder θ_f = θ^t of the round (copies of the broadcast, not trained).

Losses (Eqs. 2, 4, 5, 6), F = f(ω; x) (unnormalised features), T = f(θ_f; 𝔗),
T_i = f(θ; 𝔗), cos logits over τ (τ = 0.01: ×100 in the authors' code; none in the paper):
    cl_image = CE(cos(F, T)/τ, y)                       → ω
    cl_text  = CE(cos(stopgrad(F), T_i)/τ, y)           → θ
    P_i      = Σ_c π_i[c] · stopgrad(T_i^c), π_i = class counts / |D_i|   (never uploaded)
    ce       = CE(h_i(F + P_i) + stopgrad(h_f(stopgrad(F))), y)   → ω, h_i
    L = ce + cl_image + cl_text (all weights 1)
Prediction: h_i(F + P_i) + h_f(F) (§3.4). Sent up: ω, θ, h_i; never: P_i, class counts.

Table 7 ablations: `prior=false` (w.o. IP); `freeze_text=false` (w.o. Freeze: no frozen
text encoder, the naive Eq. 1 `cl` = CE(cos(F, T_i)/τ, y) trains ω and θ together);
`text=false` (w.o. Text: no text encoder, no contrastive terms, no prior);
`global_head=false` (no h_f; h_i is then not uploaded at all). With text, prior and global
head off FedDTR is FedPer (Table 7's "w.o. Text & Freeze", 89.22 = FedPer in Table 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import ConfigError
from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState
from ..core.params import to_cpu
from ..core.strategy import Strategy
from ..core.types import StateDict
from ..text.targets import class_targets
from .configs.feddtr import FedDTRConfig
from .fedper import HEAD, PersonalHead

#: the state-dict prefix of the text encoder θ
TEXT = "text."


@dataclass
class DTRBroadcast(Broadcast):
    class_features: torch.Tensor | None = None  # 𝔗 [C, text_dim]; None without text


def _sub(params: StateDict, prefix: str) -> StateDict:
    return {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}


def cos_logits(z: torch.Tensor, t: torch.Tensor, tau: float) -> torch.Tensor:
    return F.normalize(z, dim=-1) @ F.normalize(t, dim=-1).T / tau


class FedDTRObjective(PersonalHead[DTRBroadcast]):
    class_features: torch.Tensor  # 𝔗, a non-persistent buffer set every round

    def __init__(
        self,
        model: nn.Module,
        text_dim: int = 0,
        tau: float = 0.01,
        text: bool = True,
        prior: bool = True,
        freeze_text: bool = True,
        global_head: bool = True,
        **kwargs: Any,
    ) -> None:
        if text:
            model.add_module("text", nn.Linear(text_dim, int(cast(int, model.feature_dim))))
        super().__init__(model, **kwargs)
        self.tau, self.text, self.prior = tau, text, prior
        self.freeze_text, self.global_head = freeze_text, global_head
        self.register_buffer("class_features", torch.zeros(0, text_dim), persistent=False)
        self._head_f: StateDict = {}
        self._text_f: StateDict = {}

    def begin_round(self, broadcast: DTRBroadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)  # ω, θ (and h^t) from the server, then h_i
        g = broadcast.global_params or {}
        self._head_f = _sub(g, HEAD) if self.global_head else {}
        self._text_f = _sub(g, TEXT) if self.text and self.freeze_text else {}
        if self.text:
            if broadcast.class_features is None:
                raise ValueError("feddtr needs class features in the broadcast")
            self.class_features = broadcast.class_features.to(self.class_features.device)

    # --- the parts ----------------------------------------------------------------------
    def text_embeddings(self, params: StateDict | None = None) -> torch.Tensor:
        """T_i = f(θ; 𝔗) [C, d], or f(params; 𝔗) (the frozen θ_f)."""
        enc = self.model.get_submodule("text")
        if params is None:
            out: torch.Tensor = enc(self.class_features)
            return out
        p = {k: v.to(self.class_features.device) for k, v in params.items()}
        out = torch.func.functional_call(enc, p, (self.class_features,))
        return out

    def intra_domain_prior(self, t_local: torch.Tensor) -> torch.Tensor:
        """P_i = Σ_c π_i[c]·T_i^c with π_i the client's class frequencies (Eq. 4), detached."""
        if self.class_counts is None:
            raise ConfigError("feddtr's prior needs single-label data (class counts)")
        counts = self.class_counts.to(t_local)
        return (counts / counts.sum()) @ t_local.detach()

    def dual_logits(self, z: torch.Tensor, t_local: torch.Tensor | None) -> torch.Tensor:
        """h_i(F + P_i) + stopgrad(h_f(stopgrad(F))) (Eq. 5), as the switches leave it."""
        logits = self.classify(z + self.intra_domain_prior(t_local) if t_local is not None else z)
        if self.global_head:
            head = self.model.get_submodule("head")
            p = {k: v.to(z.device) for k, v in self._head_f.items()}
            with torch.no_grad():
                glob: torch.Tensor = torch.func.functional_call(head, p, (z.detach(),))
            logits = logits + glob
        return logits

    # --- training -------------------------------------------------------------------------
    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        z = self.represent(x)
        self.batch_features = z
        t_local = self.text_embeddings() if self.text else None
        terms = {"ce": F.cross_entropy(self.dual_logits(z, t_local if self.prior else None), y)}
        if t_local is not None:
            if self.freeze_text:
                with torch.no_grad():
                    t_frozen = self.text_embeddings(self._text_f)
                terms["cl_image"] = F.cross_entropy(cos_logits(z, t_frozen, self.tau), y)
                terms["cl_text"] = F.cross_entropy(cos_logits(z.detach(), t_local, self.tau), y)
            else:  # Eq. 1: one term, both encoders
                terms["cl"] = F.cross_entropy(cos_logits(z, t_local, self.tau), y)
        return terms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The personalised prediction h_i(F + P_i) + h_f(F) (§3.4)."""
        if not (self.prior or self.global_head):
            return super().forward(x)
        return self.dual_logits(self.represent(x), self.text_embeddings() if self.prior else None)

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        """ω and θ, plus h_i when there is a global head to average it into (Alg. 1)."""
        update = super().end_round(payload, num_examples)  # h_i also goes to client_state
        if self.global_head:
            head = {k: v for k, v in self.model.state_dict().items() if k.startswith(HEAD)}
            update.params = {**(update.params or {}), **to_cpu(head)}
        return update

    def eval_heads(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        return {"": self.forward}


class FedDTR(Strategy[FedDTRConfig, ServerState, DTRBroadcast]):
    objective_cls = FedDTRObjective

    def __init__(self, config: FedDTRConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.class_features: torch.Tensor | None = None
        self.text_encoder = "none"
        if config.text:
            from ..text import class_text_features

            text_cfg = dict(self.task.text)
            if text_cfg.get("name", "none") == "none":
                text_cfg = {"name": "minilm"}  # the default encoder (offline)
            feats = class_text_features(text_cfg, list(self.task.class_names), templates=[config.template])
            assert isinstance(feats, torch.Tensor)  # without return_info: the features alone
            # the class prior P_i is built from these anchors too (the same targets throughout)
            self.class_features = class_targets(config.targets, feats, self.seed)
            self.text_encoder = str(text_cfg["name"])

    def objective_kwargs(self) -> dict[str, Any]:
        dim = int(self.class_features.shape[1]) if self.class_features is not None else 0
        return super().objective_kwargs() | {"text_dim": dim}

    def broadcast(self, state: ServerState, rnd: int) -> DTRBroadcast:
        return DTRBroadcast(round=rnd, global_params=state.global_params, class_features=self.class_features)

    def summary(self) -> dict[str, Any]:
        return super().summary() | {"text_encoder": self.text_encoder}
