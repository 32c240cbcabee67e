"""FedGLCL's config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...core.checks import ORACLE_TARGETS, check_targets, nonnegative, one_of, positive
from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig
from . import require_coarse_groups

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


PROJECTORS = ("auto", "linear", "bn", "bn_relu")
CLASS_EMBEDDINGS = ("text", "random", "orthogonal")


def projector_kind(projector: str = "auto", final_relu: bool | None = None, backbone_bn: bool = False) -> str:
    """The projector actually built: `projector`, with `auto` resolved by the backbone
    (`bn_relu` with batch norm, `linear` without) and the legacy `final_relu` honoured."""
    if projector not in PROJECTORS:
        raise ConfigError(f"method.projector={projector!r} is not one of: {', '.join(PROJECTORS)}")
    if final_relu is not None:
        legacy = "bn_relu" if final_relu else "bn"
        if projector not in ("auto", legacy):
            raise ConfigError(
                f"method.final_relu={str(final_relu).lower()} means method.projector={legacy}, "
                f"not {projector}; set only method.projector"
            )
        return legacy
    if projector == "auto":
        return "bn_relu" if backbone_bn else "linear"
    return projector


@METHODS.register("fedglcl")
@dataclass
class FedGLCLConfig(MethodConfig):
    tau: float = 0.07
    templates: list[str] = field(default_factory=lambda: ["a photo of a {}"])  # or ["imagenet80"]
    class_embedding: str = "text"  # text | random | orthogonal (Table 10; legacy: see `targets`)
    targets: str = "text"  # text | permuted | orthogonal | uniform | centred (text/targets.py)
    # | oracle | oracle_permuted | oracle_permuted_within | oracle_half (text/oracle.py: class means
    # of held-out inputs, the positive control)
    #: the oracle's held-out images: training indices from here on (None: from data.train_subset,
    #: where the clients' images stop)
    oracle_holdout_from: int | None = None
    #: the projector to the text dimension: linear | bn (Linear -> BN1d) | bn_relu (Linear ->
    #: BN1d -> ReLU, the authors' AlexNet head) | auto: bn_relu when the backbone has batch norm,
    #: linear when it has none. The paper gives every method the same AlexNet-BN, so its BN
    #: projector is like for like; on a BN-free backbone (model=cnn) a BN projector is the only
    #: batch norm in the comparison, and under extreme label skew its averaged running
    #: statistics misdescribe the averaged model (measured: ~5x the real variance, -10 points).
    #: On cnn_bn with MiniLM texts, `bn` beat `bn_relu` by ~5 points at 2 classes per client
    #: (docs/results.md, 3 seeds).
    projector: str = "auto"
    final_relu: bool | None = None  # legacy: true = projector bn_relu, false = bn
    prox_mu: float = 0.0  # > 0: FedGLCL + FedProx
    moon_mu: float = 0.0  # > 0: FedGLCL + MOON
    moon_temperature: float = 0.5
    #: > 0: LoRA of this rank (peft) on the sentence encoder's attention projections (text=minilm
    #: or hf; `text/lora.py`): the class text goes through it in every step and its adapters are
    #: trained, uploaded and averaged with the image side; 0: frozen text features (the paper)
    text_lora_rank: int = 0
    text_lora_alpha: float = 8.0  # LoRA's scaling is alpha / rank
    text_lora_targets: list[str] = field(default_factory=lambda: ["query", "value"])  # BERT's W_q, W_v

    def check(self, run: RootConfig) -> None:
        positive(self, "tau", "moon_temperature")  # they divide the logits
        nonnegative(self, "prox_mu", "moon_mu")
        projector_kind(self.projector, self.final_relu)  # a bad value: ConfigError
        one_of(self, "class_embedding", CLASS_EMBEDDINGS)
        check_targets(self.targets, extra=ORACLE_TARGETS)
        if self.targets in ORACLE_TARGETS:
            self.check_oracle(run)
        if self.text_lora_rank:
            self.check_text_lora(run)
        if self.class_embedding != "text" and self.targets != "text":
            raise ConfigError(
                f"method.class_embedding={self.class_embedding} and method.targets={self.targets}: "
                "set only method.targets (class_embedding is the older switch)"
            )

    def check_text_lora(self, run: RootConfig) -> None:
        """LoRA on the text encoder: a BERT-style one, one template, the text itself as targets."""
        from ...text.lora import LORA_ENCODERS

        name = (run.text or {}).get("name", "none")
        why = ""
        if self.text_lora_rank < 0:
            why = "at least 0 (0: frozen text features)"
        elif name not in (*LORA_ENCODERS, "none"):
            why = f"LoRA goes on a Hugging Face sentence encoder: text=minilm or text=hf (not text={name})"
        elif self.targets != "text" or self.class_embedding != "text":
            why = "the targets are the adapted encoder's text features: method.targets=text"
        elif len(self.templates) != 1 or "{}" not in self.templates[0]:
            why = "one template with {} (the class prompts go through the encoder every step)"
        elif self.moon_mu > 0:
            why = "MOON's term would copy the sentence encoder twice a client: method.moon_mu=0"
        if why:
            raise ConfigError(f"method.text_lora_rank={self.text_lora_rank}: {why}")

    def check_oracle(self, run: RootConfig) -> None:
        """The oracle's images must be ones no client holds: from `oracle_holdout_from` (or
        `data.train_subset`) on, with the clients' images stopping at or before it."""
        sub = run.data.train_subset
        start = self.oracle_holdout_from if self.oracle_holdout_from is not None else sub
        if start is None:
            raise ConfigError(
                f"method.targets={self.targets} averages held-out training images: set data.train_subset "
                "(the clients' images stop there, the oracle's start) or method.oracle_holdout_from"
            )
        if start < 1 or sub is None or int(sub) > int(start):
            raise ConfigError(
                f"method.oracle_holdout_from={start}: clients would hold the oracle's images too; "
                f"set data.train_subset<={start} (got {sub})"
            )
        if self.targets == "oracle_permuted_within":
            require_coarse_groups(run, "method.targets=oracle_permuted_within")
