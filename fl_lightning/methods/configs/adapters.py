"""The shared config of the federated LoRA methods (FedIT, FFA-LoRA, FLoRA, HetLoRA): the model
they train adapters on (`model=clip_lora`), and the held-out images its aligned weights learn
from (the prompt learners' check, `PromptConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ...core.errors import ConfigError
from .prompting import PromptConfig

if TYPE_CHECKING:
    from ...core.run_config import RootConfig

ADAPTER_MODEL = "clip_lora"
#: the language tasks' model (models/hf_lora.py: LoRA on a Hugging Face encoder, a classifier head)
TEXT_ADAPTER_MODEL = "hf_lora"


@dataclass
class AdapterConfig(PromptConfig):
    trained_model: ClassVar[str] = ADAPTER_MODEL
    trains: ClassVar[str] = "LoRA adapters"

    def check(self, run: RootConfig) -> None:
        from ...data.glue import TEXT_DATASETS

        model, text = (run.model or {}).get("name"), run.data.name in TEXT_DATASETS
        if model == TEXT_ADAPTER_MODEL and not text:  # it would read pixels as bytes
            raise ConfigError(
                f"model={TEXT_ADAPTER_MODEL} classifies sentences: use a text dataset "
                f"(data={' | '.join(TEXT_DATASETS)}), not data={run.data.name}"
            )
        if text and model != TEXT_ADAPTER_MODEL:
            raise ConfigError(
                f"method={self.name} on data={run.data.name} (sentences) trains model={TEXT_ADAPTER_MODEL} "
                f"(got model={model})"
            )
        if model == TEXT_ADAPTER_MODEL:
            return  # no aligned stand-in to check: the encoder comes from its folder
        super().check(run)
