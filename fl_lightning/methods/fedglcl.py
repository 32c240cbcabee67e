"""FedGLCL: Yan et al., "On the Importance of Language-driven Representation Learning for
Heterogeneous Federated Learning", ICLR 2025.

Differs from FedAvg by the client objective only: the classifier is replaced by a
projector to the text dimension, and logits are cos(image embedding, class-text
embedding)/τ against frozen text features of "a photo of a {class}" computed once on the
driver; cross-entropy over all classes (the positive included, as the authors' code
does). Prediction is the nearest class text. Aggregation is FedAvg.

Options from the paper: prompt ensembles (`templates=imagenet80`), random or random-
orthogonal class vectors instead of text (Table 10), and FedGLCL+FedProx / +MOON
(`prox_mu`, `moon_mu`: the language loss replaces cross-entropy inside those methods).
`targets` is the controls switch all text-using methods share (`text/targets.py`: text,
permuted, orthogonal, uniform, centred), plus the oracle targets, FedGLCL's only
(`text/oracle.py`: held-out class means, the positive control of experiment E6);
`class_embedding` is the older one, kept so the committed reports rerun (its `random` is
normalised randn: near-orthogonal in 384-d, unlike the paper's correlated random tensors,
which `targets=uniform` gives).

The projector (`projector`): `linear` (Linear to the text dimension), `bn` (Linear → BN1d)
or `bn_relu` (Linear → BN1d → ReLU, the authors' AlexNet head). The default `auto` is
`bn_relu` when the backbone has batch norm and `linear` when it has none. In the paper
every method shares one AlexNet-BN, so FedGLCL's BN projector is like for like; on a
BN-free backbone (`model=cnn`) a BN projector would be the only batch norm in the
comparison, and under extreme label skew its averaged running statistics (each client's
from its own few classes and drifted weights) do not describe the averaged model: they
cost FedGLCL accuracy that has nothing to do with the language loss. `auto` keeps the
comparison to FedAvg & co. on the same backbone fair either way. `final_relu` (before
`projector` existed) still works: true = `bn_relu`, false = `bn`.

Not in the paper: `text_lora_rank` > 0 trains the text side too, with LoRA adapters (`peft`)
on the sentence encoder's attention projections (`text_lora_targets`, BERT's query and value
by default; `text/lora.py`). The class prompts then go through the adapted encoder in every
step, the adapters are averaged with the image side by FedAvg, and the encoder's own weights
never leave their folder (frozen by role). At round 0 (B = 0) it is FedGLCL exactly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..core.checks import ORACLE_TARGETS
from ..core.errors import ConfigError
from ..core.messages import Broadcast, ClientPayload, ServerState
from ..core.objective import Role
from ..core.strategy import Strategy
from ..text.lora import is_adapter_key
from ..text.targets import class_targets
from .configs.fedglcl import CLASS_EMBEDDINGS, FedGLCLConfig, projector_kind
from .fedprox import ProximalTerm
from .moon import ModelContrastive

log = logging.getLogger(__name__)


@dataclass
class GLCLBroadcast(Broadcast):
    class_features: torch.Tensor | None = None  # [C, d] L2-normalised, sent once per round


def has_batch_norm(model: nn.Module, skip: str = "head") -> bool:
    """Whether `model` has batch norm outside its submodule `skip` (the classifier FedGLCL replaces)."""
    return any(
        isinstance(m, nn.modules.batchnorm._BatchNorm)
        for name, m in model.named_modules()
        if name != skip and not name.startswith(f"{skip}.")
    )


def build_projector(in_dim: int, out_dim: int, kind: str = "bn_relu") -> nn.Sequential:
    """FedGLCL's projector to the text dimension: `linear` = Linear, `bn` = Linear → BN1d,
    `bn_relu` = Linear → BN1d → ReLU (the authors' AlexNet head). Always a Sequential, so
    the parameter names (`head.0.weight`, ...) are the same for every kind."""
    layers: list[nn.Module] = [nn.Linear(in_dim, out_dim)]
    if kind in ("bn", "bn_relu"):
        layers.append(nn.BatchNorm1d(out_dim))
    if kind == "bn_relu":
        layers.append(nn.ReLU(inplace=True))
    if kind not in ("linear", "bn", "bn_relu"):
        raise ConfigError(f"projector kind {kind!r} is not one of: linear, bn, bn_relu")
    return nn.Sequential(*layers)


#: the model's submodule holding the LoRA-adapted sentence encoder (`method.text_lora_rank`)
TEXT_LORA = "text_lora"


class GLCLObjective(ModelContrastive[GLCLBroadcast], ProximalTerm[GLCLBroadcast]):
    """`text_lora` (the `LoRATextTower` arguments, `method.text_lora_rank` > 0): the class
    features are the adapted sentence encoder's features of the class prompts, computed in
    every step (gradients reach its adapters), in place of the broadcast frozen ones. The
    encoder sits in the model as `text_lora`; its weights are frozen by role, its adapters
    shared (trained, uploaded, averaged by FedAvg, checkpointed) like the image side."""

    class_features: torch.Tensor  # [C, d] a non-persistent buffer, set every round
    batched_step = True  # its logits are `classify(represent(x))`; + FedProx's term; MOON's refused

    def __init__(
        self,
        model: nn.Module,
        text_dim: int,
        tau: float = 0.07,
        projector: str = "auto",
        final_relu: bool | None = None,
        prox_mu: float = 0.0,
        moon_mu: float = 0.0,
        moon_temperature: float = 0.5,
        text_lora: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kind = projector_kind(projector, final_relu, has_batch_norm(model))
        model.head = build_projector(int(cast(int, model.feature_dim)), text_dim, kind)  # no classifier
        self.text_lora = bool(text_lora)
        if text_lora:
            from ..text.lora import LoRATextTower

            model.add_module(TEXT_LORA, LoRATextTower(**text_lora))
        super().__init__(model, **kwargs)
        self.projector_kind = kind  # the projector built (`auto` resolved against this backbone)
        self.tau, self.prox_mu, self.moon_mu, self.moon_temperature = tau, prox_mu, moon_mu, moon_temperature
        self.register_buffer("class_features", torch.zeros(0, text_dim), persistent=False)

    def begin_round(self, broadcast: GLCLBroadcast, payload: ClientPayload | None) -> None:
        super().begin_round(broadcast, payload)
        if broadcast.class_features is None:
            raise ValueError("fedglcl needs class features in the broadcast")
        self.class_features = broadcast.class_features.to(self.class_features.device)

    def role(self, key: str) -> Role:
        """The adapted sentence encoder's weights are frozen (every copy loads them from its
        folder), its adapter tensors shared."""
        if key.startswith(f"{TEXT_LORA}.") and not is_adapter_key(key):
            return "frozen"
        return super().role(key)

    def batched_refusal(self) -> str | None:
        if self.text_lora:
            return (
                "method.text_lora_rank > 0: its sentence encoder runs in the step (not for stacked weights)"
            )
        return super().batched_refusal()

    def represent(self, x: torch.Tensor, model: nn.Module | None = None) -> torch.Tensor:
        out: torch.Tensor = (model if model is not None else self.model)(x)
        return F.normalize(out, dim=-1)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        text = self.model.get_submodule(TEXT_LORA)() if self.text_lora else self.class_features
        return z @ F.normalize(text, dim=-1).T / self.tau


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
    raise ConfigError(f"method.class_embedding={kind!r} is not one of: {', '.join(CLASS_EMBEDDINGS)}")


class FedGLCL(Strategy[FedGLCLConfig, ServerState, GLCLBroadcast]):
    objective_cls = GLCLObjective

    def __init__(self, config: FedGLCLConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        from ..text import class_text_features

        text_cfg = dict(self.task.text)
        if text_cfg.get("name", "none") == "none":
            text_cfg = {"name": "minilm"}  # the default encoder (offline)
        templates = (
            config.templates[0]
            if len(config.templates) == 1 and "{}" not in config.templates[0]
            else list(config.templates)
        )
        text = class_text_features(text_cfg, list(self.task.class_names), templates=templates)
        assert isinstance(text, torch.Tensor)  # without return_info: the features alone
        self.oracle_info: dict[str, Any] = {}
        # Derived from the config alone (cached on disk), so a resumed run gets the same.
        if config.targets in ORACLE_TARGETS:
            self.class_features = self.oracle(config, int(text.shape[1]))
        else:
            self.class_features = class_targets(
                config.targets, class_vectors(config.class_embedding, text, self.seed), self.seed
            )
        self.text_encoder = text_cfg["name"]
        self.text_cfg = text_cfg

    def oracle(self, config: FedGLCLConfig, dim: int) -> torch.Tensor:
        """The oracle targets (`text/oracle.py`): the held-out class means in `dim` dimensions."""
        from ..data.registry import load_from_config
        from ..text.oracle import held_out_class_means, oracle_targets, pca_keep_gram

        start = config.oracle_holdout_from
        start = int(start if start is not None else self.task.data["train_subset"])
        ds = load_from_config({**self.task.data, "train_subset": None})  # every image, the hold-out's
        means, counts = held_out_class_means(ds, start)
        vectors = pca_keep_gram(means, dim)
        self.oracle_info = {"oracle_holdout_from": start, "oracle_images": int(sum(counts))}
        return oracle_targets(config.targets, vectors, self.seed, self.task.coarse_groups)

    def objective_kwargs(self) -> dict[str, Any]:
        out = super().objective_kwargs() | {"text_dim": int(self.class_features.shape[1])}
        c = self.config
        if c.text_lora_rank:
            from ..text.encoders import resolved_text
            from ..text.feature_bank import prompts_for

            prompts = [p[0] for p in prompts_for(list(self.task.class_names), c.templates[0])]
            out["text_lora"] = {
                "text": resolved_text(self.text_cfg), "prompts": prompts, "rank": c.text_lora_rank,
                "alpha": c.text_lora_alpha, "target_modules": list(c.text_lora_targets), "seed": self.seed,
            }  # fmt: skip
        return out

    def broadcast(self, state: ServerState, rnd: int) -> GLCLBroadcast:
        return GLCLBroadcast(round=rnd, global_params=state.global_params, class_features=self.class_features)

    def resolved(self, model: nn.Module) -> dict[str, Any]:
        """`projector: auto` as the kind built on this backbone."""
        kind = projector_kind(self.config.projector, self.config.final_relu, has_batch_norm(model))
        return super().resolved(model) | {"method": {"projector": kind}}

    def summary(self) -> dict[str, Any]:
        return super().summary() | {
            "text_encoder": self.text_encoder,
            "text_dim": int(self.class_features.shape[1]),
        }

    def run_summary(self) -> dict[str, Any]:
        """The oracle's hold-out (where its images start, how many), in `summary.json`."""
        return super().run_summary() | self.oracle_info
