"""FedTSP's config."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.checks import check_targets, nonnegative, positive, within
from ...core.errors import ConfigError
from ...core.method import METHODS, MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig


LN_100, LN_1000 = math.log(100.0), math.log(1000.0)  # as server_steps/prompt_tuning.py


@METHODS.register("fedtsp")
@dataclass
class FedTSPConfig(MethodConfig):
    single_label = "one text prototype per example's class"
    lam: float = 7.0  # λ: 7 cross-silo, 1 cross-device (paper)
    descriptions: bool = True  # false: handcrafted "a photo of a {class}." (Table 4, IDs 2 and 4)
    tune_prompts: bool = True  # false: frozen prompts (Table 4, IDs 2 and 3)
    #: the text prototypes' control (text/targets.py): text | permuted | centred (a fixed map
    #: on the prompts' output: tuning works through it) | orthogonal | uniform (fixed vectors:
    #: tune_prompts=false)
    targets: str = "text"
    ctx_init: str | None = (
        "a photo of a"  # the soft prompts start as these token embeddings (m = their count)
    )
    n_ctx: int | None = None  # with ctx_init=null: m random N(0, 0.02²) vectors (the authors' code)
    #: E_s, full-batch prompt steps per round: the paper's default ("we set E_s = 20 by default",
    #: Sec. 4.5; FedTSP-BERT improves with E_s, CLIP barely moves). MiniLM, like BERT, never saw
    #: images, so the BERT setting applies; 1 step at lr 0.01 moved the prototypes by < 1e-4.
    server_epochs: int = 20
    prompt_lr: float = 0.01  # the authors' code (SGD)
    prompt_momentum: float = 0.0  # > 0 keeps momentum buffers in the server state (the code has none)
    learn_logit_scale: bool = True
    logit_scale_init: float = LN_100  # s with τ = 1/exp(s) = 0.01 (the authors' code)
    logit_scale_lr: float = 0.01
    #: clamp on s after each server step (a guard against a runaway scale, τ >= 0.001: the
    #: authors' code has none; null: none). Must lie above `logit_scale_init`, so that s can
    #: rise as well as fall (a clamp at ln 100 pinned it: it could only fall).
    logit_scale_max: float | None = LN_1000
    direction: str = "image_to_text"  # image_to_text (code) | text_to_image (Eq. 7) | symmetric
    weighting: str = "count"  # image-prototype aggregation: count (Eq. 6) | uniform (the code)
    share_weights: bool = False  # model-homogeneous extension: FedAvg of all weights too
    finetune_after: int | None = None  # with share_weights: rounds after this one fine-tune only
    #   each client's classifier on the global extractor (the PFL protocol "-FT"), personal heads

    def keeps_personal_models(self) -> bool:
        # personal models unless weights are shared (and then again in the -FT rounds)
        return not self.share_weights or self.finetune_after is not None

    def check(self, run: RootConfig) -> None:
        nonnegative(self, "lam", "server_epochs", "prompt_momentum", "finetune_after")
        positive(self, "prompt_lr", "logit_scale_lr")
        within(self, "n_ctx", 1, 64)  # prompt tokens: CLIP's whole context is 77 (CoOp: 4 to 16)
        if self.direction not in ("image_to_text", "text_to_image", "symmetric"):
            raise ConfigError(
                f"method.direction={self.direction!r}: expected image_to_text, text_to_image or symmetric"
            )
        check_targets(self.targets)
        if self.targets in ("orthogonal", "uniform") and self.tune_prompts and self.server_epochs > 0:
            raise ConfigError(
                f"method.targets={self.targets} are fixed vectors with no prompt to tune: "
                "add method.tune_prompts=false"
            )
        if self.weighting not in ("count", "uniform"):
            raise ConfigError(f"method.weighting={self.weighting!r}: expected count or uniform")
        top = self.logit_scale_max
        if self.learn_logit_scale and top is not None and self.logit_scale_init >= top:
            raise ConfigError(
                f"method.logit_scale_init={self.logit_scale_init:g} must lie below "
                f"method.logit_scale_max={top:g}: started at its clamp, the logit scale could only fall"
            )
        if self.finetune_after is not None and not self.share_weights:
            raise ConfigError(
                "method.finetune_after (-FT) needs method.share_weights=true (a global model to fine-tune)"
            )
