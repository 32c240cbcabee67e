"""The shared config of the CLIP prompt learners (PromptFL, FedOTP, zero-shot CLIP): the model
they train prompts on, and the held-out images its aligned weights learn from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ...core.errors import ConfigError
from ...core.method import MethodConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig

PROMPT_MODEL = "clip_prompt"


@dataclass
class PromptConfig(MethodConfig):
    #: the one model the method trains, and what it trains on it (the refusal's words)
    trained_model: ClassVar[str] = PROMPT_MODEL
    trains: ClassVar[str] = "CLIP prompts"

    def check(self, run: RootConfig) -> None:
        model = run.model or {}
        if model.get("name") != self.trained_model:
            raise ConfigError(
                f"method={self.name} trains {self.trains}: use model={self.trained_model} "
                f"(got {model.get('name')})"
            )
        if model.get("align_holdout_from") is not None:
            hi = run.data.train_subset
            if hi is None or int(hi) > int(model["align_holdout_from"]):
                raise ConfigError(
                    f"model.align_holdout_from={model['align_holdout_from']}: clients would hold those "
                    f"images too; set data.train_subset<={model['align_holdout_from']}"
                )
