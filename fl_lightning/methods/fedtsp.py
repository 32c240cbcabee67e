"""FedTSP: Wu et al., "Enhancing Visual Representation with Textual Semantics: Textual
Semantics-Powered Prototypes for Heterogeneous Federated Learning" (shared/papers/002;
spec: shared/methods/fedtsp_fedlgt_feddtr.md, part 1).

Model-heterogeneous FL with text prototypes. Clients (any architecture whose features
have the text dimension d; FedTSP sets `model.feature_dim` to it) train
cross-entropy + λ·InfoNCE(cos(f(x), T_c)·exp(s), y) against the broadcast text prototypes
T [C, d] and logit scale s, then upload only per-class mean features (image prototypes,
in eval mode over the local training set) and per-class counts. The driver aggregates the
image prototypes (count-weighted), tunes the class-specific soft prompts (m vectors per
class shared by the k = 3 descriptions "a photo of a {class}: {description}.") through
the frozen text encoder for E_s steps of InfoNCE between text and image prototypes (and
the logit scale), and broadcasts the new text prototypes. The language model and the
prompts never leave the driver; no weights are averaged unless `share_weights=true`
(the paper's model-homogeneous extension: FedAvg of all weights as well).

Table 4 ablation switches: `descriptions=false` (handcrafted "a photo of a {class}."),
`tune_prompts=false` (frozen prompts). Deviation from the authors' code: the soft prompts
start from the embeddings of "a photo of a" (so an untuned prompt is the handcrafted one)
instead of N(0, 0.02²) over the start token; `ctx_init=null method.n_ctx=m` gives that.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

from ..core.errors import ConfigError
from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState, extend
from ..core.objective import ClientObjective
from ..core.strategy import MethodConfig, Strategy
from ..core.types import StateDict
from ..server_steps.prompt_tuning import LN_100, PromptTuner
from ..server_steps.prototypes import aggregate_class_means
from . import METHODS
from .fedproto import LocalClassMeans, PrototypeUpdate

log = logging.getLogger(__name__)


@dataclass
class FedTSPState(ServerState):
    prompt_ctx: Optional[torch.Tensor] = None  # [C, m, h] the soft prompts (driver only)
    logit_scale: Optional[torch.Tensor] = None  # scalar s; clients use exp(s) = 1/τ
    prompt_opt_state: dict = field(default_factory=dict)  # optimiser state across rounds (momentum)
    text_prototypes: Optional[torch.Tensor] = None  # [C, d] what clients align to
    image_prototypes: Optional[torch.Tensor] = None  # [C, d] last aggregate of the uploads
    proto_counts: Optional[torch.Tensor] = None  # [C]
    prompt_loss: list = field(default_factory=list)  # last server step: loss before each step, after the last


@dataclass
class TSPBroadcast(Broadcast):
    text_prototypes: Optional[torch.Tensor] = None  # [C, d]
    logit_scale: Optional[torch.Tensor] = None  # scalar
    finetune: bool = False  # -FT rounds: train only the classifier on the global extractor


class FedTSPObjective(LocalClassMeans, ClientObjective):
    def __init__(  # type: ignore[no-untyped-def]
        self, model: torch.nn.Module, num_classes: int, lam: float = 7.0, share_weights: bool = False, **kwargs
    ) -> None:
        super().__init__(model, **kwargs)
        self.num_classes, self.lam, self.share_weights = num_classes, lam, share_weights
        self._finetune = False

    def is_personal(self, key: str) -> bool:
        return key.startswith("head.") if self._finetune else not self.share_weights

    def begin_round(self, broadcast: Broadcast, payload: ClientPayload | None) -> None:
        self._finetune = bool(getattr(broadcast, "finetune", False))
        super().begin_round(broadcast, payload)  # global weights, then the personal head (-FT)
        for name, p in self.model.named_parameters():  # -FT: only the classifier trains
            p.requires_grad_(not self._finetune or name.startswith("head."))
        self._text = getattr(broadcast, "text_prototypes", None)
        scale = getattr(broadcast, "logit_scale", None)
        self._scale = float(scale) if scale is not None else LN_100

    def on_train_start(self) -> None:
        super().on_train_start()
        if self._text is not None:
            self._t = F.normalize(self._text.to(self.device).float(), dim=-1)

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        if self._finetune:  # the frozen extractor keeps its batch-norm statistics too
            for name, m in self.model.named_children():
                if name != "head":
                    m.eval()

    def loss_terms(self, batch):  # type: ignore[no-untyped-def]
        terms = super().loss_terms(batch)
        if self._text is not None and self.lam > 0 and not self._finetune:
            z = F.normalize(self.batch_features, dim=-1)
            logits = math.exp(self._scale) * z @ self._t.T
            terms["text"] = self.lam * F.cross_entropy(logits, batch[1])
        return terms

    def on_train_end(self) -> None:
        if self._finetune:  # no prototypes: the extractor did not change
            return ClientObjective.on_train_end(self)
        super().on_train_end()

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        update = super().end_round(payload, num_examples)
        if self._finetune:  # only the personal head, kept on the driver; nothing uploaded
            return dataclasses.replace(update, params=None)
        means, counts = self.class_means()
        return extend(update, PrototypeUpdate, prototypes=means, proto_counts=counts)


@dataclass
class FedTSPConfig(MethodConfig):
    name: str = "fedtsp"
    lam: float = 7.0  # λ: 7 cross-silo, 1 cross-device (paper)
    descriptions: bool = True  # false: handcrafted "a photo of a {class}." (Table 4, IDs 2 and 4)
    tune_prompts: bool = True  # false: frozen prompts (Table 4, IDs 2 and 3)
    ctx_init: Optional[str] = "a photo of a"  # the soft prompts start as these token embeddings (m = their count)
    n_ctx: Optional[int] = None  # with ctx_init=null: m random N(0, 0.02²) vectors (the authors' code)
    server_epochs: int = 1  # E_s: full-batch prompt steps per round (1 for CIFAR-10, 20 for CIFAR-100)
    prompt_lr: float = 0.01
    prompt_momentum: float = 0.0  # > 0 keeps momentum buffers in the server state
    learn_logit_scale: bool = True
    logit_scale_init: float = LN_100  # s with τ = 1/exp(s) = 0.01
    logit_scale_lr: float = 0.01
    direction: str = "image_to_text"  # image_to_text (code) | text_to_image (Eq. 7) | symmetric
    weighting: str = "count"  # image-prototype aggregation: count (Eq. 6) | uniform (the code)
    share_weights: bool = False  # model-homogeneous extension: FedAvg of all weights too
    finetune_after: Optional[int] = None  # with share_weights: rounds after this one fine-tune only
    #   each client's classifier on the global extractor (the PFL protocol "-FT"), personal heads


@METHODS.register("fedtsp")
class FedTSP(Strategy):
    name = "fedtsp"
    config_cls = FedTSPConfig
    objective_cls = FedTSPObjective

    def __init__(self, config: FedTSPConfig, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config, *args, **kwargs)
        if config.direction not in ("image_to_text", "text_to_image", "symmetric"):
            raise ConfigError(f"method.direction={config.direction!r}: expected image_to_text, text_to_image or symmetric")
        if config.weighting not in ("count", "uniform"):
            raise ConfigError(f"method.weighting={config.weighting!r}: expected count or uniform")
        if config.finetune_after is not None and not config.share_weights:
            raise ConfigError("method.finetune_after (-FT) needs method.share_weights=true (a global model to fine-tune)")
        from ..text.prompts import descriptions

        text_cfg = dict(self.task.text)
        if text_cfg.get("name", "none") == "none":
            text_cfg = {"name": "minilm"}  # the default encoder (offline)
        names = list(self.task.class_names)
        descs = descriptions(self.task.dataset, names) if config.descriptions else None
        # The encoder and the prompts' token embeddings derive from the config alone, so a
        # resumed run rebuilds the same; the trainable values live in FedTSPState.
        self.tuner = PromptTuner(text_cfg, names, descs, config.ctx_init, config.n_ctx, seed=self.seed)
        self.text_encoder = text_cfg["name"]

    @property
    def personalised(self) -> bool:  # type: ignore[override]
        c = self.config
        return not c.share_weights or c.finetune_after is not None  # type: ignore[attr-defined]

    def finetuning(self, rnd: int) -> bool:
        after = self.config.finetune_after  # type: ignore[attr-defined]
        return after is not None and rnd > after

    def model_kwargs(self, model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        from ..models import feature_dim_key

        key = feature_dim_key(model)
        if key is None:
            raise ConfigError(f"fedtsp needs a model whose feature dimension can be set; {model!r} has none")
        d = self.tuner.text_dim
        if kwargs.get(key) not in (None, d):
            log.info("fedtsp: model.%s=%s set to the text dimension %d", key, kwargs[key], d)
        return {**kwargs, key: d}

    def objective_kwargs(self) -> dict:
        keep = ("lam", "share_weights")
        return {k: getattr(self.config, k) for k in keep} | {"num_classes": self.task.num_classes}

    def init_state(self, global_params: StateDict | None) -> ServerState:
        c = self.config
        ctx = self.tuner.initial_ctx()
        return FedTSPState(
            round=0,
            global_params=global_params if c.share_weights else None,  # type: ignore[attr-defined]
            prompt_ctx=ctx,
            logit_scale=torch.tensor(float(c.logit_scale_init)),  # type: ignore[attr-defined]
            text_prototypes=self.tuner.text_prototypes(ctx),
        )

    def broadcast(self, state: ServerState, rnd: int) -> Broadcast:
        assert isinstance(state, FedTSPState)
        return TSPBroadcast(
            round=rnd,
            global_params=state.global_params if self.config.share_weights else None,  # type: ignore[attr-defined]
            text_prototypes=state.text_prototypes,
            logit_scale=state.logit_scale,
            finetune=self.finetuning(rnd),
        )

    def aggregate(self, state: ServerState, updates: Sequence[ClientUpdate]) -> ServerState:
        new = super().aggregate(state, updates)
        ups = [u for u in updates if isinstance(u, PrototypeUpdate) and u.prototypes is not None]
        if not ups:
            return new
        means, counts = aggregate_class_means(
            [u.prototypes for u in ups], [u.proto_counts for u in ups], self.config.weighting  # type: ignore[attr-defined,misc]
        )
        return dataclasses.replace(new, image_prototypes=means, proto_counts=counts)

    def server_update(self, state: ServerState, updates: Sequence[ClientUpdate]) -> ServerState:
        """Tune the soft prompts on this round's image prototypes; new text prototypes."""
        assert isinstance(state, FedTSPState)
        c = self.config
        if not c.tune_prompts or state.image_prototypes is None or c.server_epochs <= 0:  # type: ignore[attr-defined]
            return state
        if self.finetuning(state.round + 1):  # no new image prototypes in -FT rounds
            return state
        present = state.proto_counts > 0  # type: ignore[operator]
        out = self.tuner.tune(
            state.prompt_ctx, state.logit_scale, state.image_prototypes, present,  # type: ignore[arg-type]
            steps=c.server_epochs, lr=c.prompt_lr, momentum=c.prompt_momentum,  # type: ignore[attr-defined]
            scale_lr=c.logit_scale_lr, learn_scale=c.learn_logit_scale,  # type: ignore[attr-defined]
            direction=c.direction, opt_state=state.prompt_opt_state,  # type: ignore[attr-defined]
        )  # fmt: skip
        return dataclasses.replace(
            state,
            prompt_ctx=out.ctx,
            logit_scale=out.logit_scale,
            prompt_opt_state=out.opt_state,
            text_prototypes=out.text,
            prompt_loss=out.losses,
        )

    def summary(self) -> dict:
        return super().summary() | {
            "text_encoder": self.text_encoder,
            "text_dim": self.tuner.text_dim,
            "prompts_per_class": self.tuner.prompts.k,
            "prompt_tokens": self.tuner.prompts.n_ctx,
        }

    def warnings(self) -> list[str]:
        return ["fedtsp with method.lam=0 is local training (no text alignment)"] if self.config.lam == 0 else []  # type: ignore[attr-defined]
