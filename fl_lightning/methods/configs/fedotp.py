"""FedOTP's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from ...core.method import METHODS

if TYPE_CHECKING:
    from ...core.run_config import RootConfig
from .prompting import PromptConfig


@METHODS.register("fedotp")
@dataclass
class FedOTPConfig(PromptConfig):
    personalised = True  # each client's (global, local) pair, on its own test split
    top_percent: float = 0.8  # mass the prompts' side of the plan carries (COT)
    eps: float = 0.1  # entropic regularisation
    thresh: float = 1e-3  # stop when the mean change of v falls below
    max_iter: int = 100

    def check(self, run: RootConfig) -> None:
        if not 0 < self.top_percent <= 1 or self.eps <= 0 or self.max_iter < 1:
            raise ConfigError("method.top_percent must be in (0, 1], method.eps > 0, method.max_iter >= 1")
        super().check(run)
        if run.data.base_new:
            raise ConfigError(
                "method=fedotp takes no data.base_new: its clients' transport logits score every class, "
                "the new ones included, so nothing would be unseen (base-to-new: method=promptfl or fedtpg)"
            )
        import open_clip  # (only for this method: which architectures have patch tokens)

        from ...text.encoders import _register_open_clip_configs

        arch = str((run.model or {}).get("arch"))
        vision = (open_clip.get_model_config(_register_open_clip_configs(arch)) or {}).get("vision_cfg", {})
        if isinstance(vision.get("layers"), (list, tuple)) or vision.get("timm_model_name"):
            raise ConfigError(
                f"method=fedotp matches ViT patch tokens: model.arch={arch} is no open_clip ViT "
                "(use e.g. model.arch=ViT-B-16)",
                needs=("model.arch=ViT-B-16 or another open_clip ViT",),
            )
