"""FedTSP: Wu et al., "Enhancing Visual Representation with Textual Semantics: Textual
Semantics-Powered Prototypes for Heterogeneous Federated Learning", 2025,
https://arxiv.org/abs/2503.13543.

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ..core.errors import ConfigError
from ..core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState, extend
from ..core.objective import ClientObjective
from ..core.privacy.prototypes import privacy_step, private_prototypes
from ..core.strategy import ServerContext, Strategy
from ..core.types import Metrics, StateDict
from ..server_steps.prompt_tuning import LN_100, PromptTuner
from ..server_steps.prototypes import aggregate_class_means
from .configs.fedtsp import FedTSPConfig
from .fedproto import LocalClassMeans, PrototypeUpdate

log = logging.getLogger(__name__)


@dataclass
class FedTSPState(ServerState):
    prompt_ctx: torch.Tensor | None = None  # [C, m, h] the soft prompts (driver only)
    logit_scale: torch.Tensor | None = None  # scalar s; clients use exp(s) = 1/τ
    prompt_opt_state: dict[int, dict[str, Any]] = field(
        default_factory=dict
    )  # optimiser state across rounds (momentum)
    text_prototypes: torch.Tensor | None = None  # [C, d] what clients align to
    image_prototypes: torch.Tensor | None = None  # [C, d] last aggregate of the uploads
    proto_counts: torch.Tensor | None = None  # [C]


@dataclass
class TSPBroadcast(Broadcast):
    text_prototypes: torch.Tensor | None = None  # [C, d]
    logit_scale: torch.Tensor | None = None  # scalar
    finetune: bool = False  # -FT rounds: train only the classifier on the global extractor


class FedTSPObjective(LocalClassMeans[TSPBroadcast]):
    def __init__(
        self,
        model: torch.nn.Module,
        num_classes: int,
        lam: float = 7.0,
        share_weights: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.num_classes, self.lam, self.share_weights = num_classes, lam, share_weights
        self._finetune = False

    def is_personal(self, key: str) -> bool:
        return key.startswith("head.") if self._finetune else not self.share_weights

    def begin_round(self, broadcast: TSPBroadcast, payload: ClientPayload | None) -> None:
        self._finetune = broadcast.finetune
        super().begin_round(broadcast, payload)  # global weights, then the personal head (-FT)
        for name, p in self.model.named_parameters():  # -FT: only the classifier trains
            p.requires_grad_(not self._finetune or name.startswith("head."))
        self._text = broadcast.text_prototypes
        scale = broadcast.logit_scale
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

    def loss_terms(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        terms = super().loss_terms(batch)
        if self._text is not None and self.lam > 0 and not self._finetune:
            z = F.normalize(self.batch_features, dim=-1)
            logits = math.exp(self._scale) * z @ self._t.T
            terms["text"] = self.lam * F.cross_entropy(logits, batch[1])
        return terms

    def on_train_end(self) -> None:
        if self._finetune:  # no prototypes: the extractor did not change
            ClientObjective.on_train_end(self)
            return
        super().on_train_end()

    def end_round(self, payload: ClientPayload, num_examples: int) -> ClientUpdate:
        update = super().end_round(payload, num_examples)
        if self._finetune:  # only the personal head, kept in the client's state; nothing uploaded
            return dataclasses.replace(update, params=None)
        means, counts = self.class_means()
        return extend(update, PrototypeUpdate, prototypes=means, proto_counts=counts)

    #   each client's classifier on the global extractor (the PFL protocol "-FT"), personal heads


class FedTSP(Strategy[FedTSPConfig, FedTSPState, TSPBroadcast]):
    reads_each_update = "it reads each client's class prototypes"
    objective_cls = FedTSPObjective

    def __init__(self, config: FedTSPConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        from ..text.prompts import descriptions

        text_cfg = dict(self.task.text)
        if text_cfg.get("name", "none") == "none":
            text_cfg = {"name": "minilm"}  # the default encoder (offline)
        names = list(self.task.class_names)
        descs = descriptions(self.task.dataset, names) if config.descriptions else None
        # The encoder and the prompts' token embeddings derive from the config alone, so a
        # resumed run rebuilds the same; the trainable values live in FedTSPState.
        self.tuner = PromptTuner(
            text_cfg, names, descs, config.ctx_init, config.n_ctx, seed=self.seed, targets=config.targets
        )
        self.text_encoder = text_cfg["name"]

    def finetuning(self, rnd: int) -> bool:
        after = self.config.finetune_after
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

    def objective_kwargs(self) -> dict[str, Any]:
        keep = ("lam", "share_weights")
        return {k: getattr(self.config, k) for k in keep} | {"num_classes": self.task.num_classes}

    def init_state(self, global_params: StateDict | None) -> FedTSPState:
        c = self.config
        ctx = self.tuner.initial_ctx()
        return FedTSPState(
            round=0,
            global_params=global_params if c.share_weights else None,
            prompt_ctx=ctx,
            logit_scale=torch.tensor(float(c.logit_scale_init)),
            text_prototypes=self.tuner.text_prototypes(ctx),
        )

    def broadcast(self, state: FedTSPState, rnd: int) -> TSPBroadcast:
        return TSPBroadcast(
            round=rnd,
            global_params=state.global_params if self.config.share_weights else None,
            text_prototypes=state.text_prototypes,
            logit_scale=state.logit_scale,
            finetune=self.finetuning(rnd),
        )

    def aggregate(
        self, state: FedTSPState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> FedTSPState:
        new = self.average(state, updates, ctx)
        ups = [(u.prototypes, u.proto_counts) for u in sorted(updates, key=lambda u: u.client_id)
               if isinstance(u, PrototypeUpdate)]  # fmt: skip
        pairs = [(p, n) for p, n in ups if p is not None and n is not None]
        private = privacy_step(self.aggregator)
        if private is not None:  # privacy=dp_fedavg: over the noised count of holders (uniform)
            new, means, counts = private_prototypes(
                state, new, [p for p, _ in pairs], [n for _, n in pairs], private, ctx
            )
            if means is None or counts is None:
                return new
        elif not pairs:
            return new
        else:
            means, counts = aggregate_class_means(
                [p for p, _ in pairs], [n for _, n in pairs], self.config.weighting
            )
        return dataclasses.replace(new, image_prototypes=means, proto_counts=counts)

    def server_update(
        self, state: FedTSPState, updates: Sequence[ClientUpdate], ctx: ServerContext
    ) -> tuple[FedTSPState, Metrics]:
        """Tune the soft prompts on this round's image prototypes; new text prototypes.
        Logs the prompt loss before the first and after the last step, and how far the
        text prototypes moved (1 − cosine, mean and max over classes)."""
        c = self.config
        if not c.tune_prompts or state.image_prototypes is None or c.server_epochs <= 0:
            return state, {}
        if self.finetuning(ctx.round):  # no new image prototypes in -FT rounds
            return state, {}
        assert (
            state.prompt_ctx is not None and state.logit_scale is not None and state.proto_counts is not None
        )
        present = state.proto_counts > 0
        out = self.tuner.tune(
            state.prompt_ctx, state.logit_scale, state.image_prototypes, present,
            steps=c.server_epochs, lr=c.prompt_lr, momentum=c.prompt_momentum,
            scale_lr=c.logit_scale_lr, learn_scale=c.learn_logit_scale, max_logit_scale=c.logit_scale_max,
            direction=c.direction, opt_state=state.prompt_opt_state,
        )  # fmt: skip
        metrics: Metrics = {
            "prompt_loss_before": float(out.losses[0]),
            "prompt_loss_after": float(out.losses[-1]),
            "logit_scale": float(out.logit_scale),
        }
        if state.text_prototypes is not None:
            moved = 1 - F.cosine_similarity(out.text.double(), state.text_prototypes.double(), dim=-1)
            metrics.update(prototype_shift_mean=float(moved.mean()), prototype_shift_max=float(moved.max()))
        new = dataclasses.replace(
            state,
            prompt_ctx=out.ctx,
            logit_scale=out.logit_scale,
            prompt_opt_state=out.opt_state,
            text_prototypes=out.text,
        )
        return new, metrics

    def summary(self) -> dict[str, Any]:
        return super().summary() | {
            "text_encoder": self.text_encoder,
            "text_dim": self.tuner.text_dim,
            "prompts_per_class": self.tuner.prompts.k,
            "prompt_tokens": self.tuner.prompts.n_ctx,
        }

    def warnings(self) -> list[str]:
        return (
            ["fedtsp with method.lam=0 is local training (no text alignment)"] if self.config.lam == 0 else []
        )
