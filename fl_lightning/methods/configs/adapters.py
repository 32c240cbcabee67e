"""The shared config of the federated LoRA methods (FedIT, FFA-LoRA, FLoRA, HetLoRA): the model
they train adapters on (`model=clip_lora`), and the held-out images its aligned weights learn
from (the prompt learners' check, `PromptConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .prompting import PromptConfig

if TYPE_CHECKING:
    from ...config import RootConfig

ADAPTER_MODEL = "clip_lora"
#: the language tasks' model (models/hf_lora.py: LoRA on a Hugging Face encoder, a classifier head)
TEXT_ADAPTER_MODEL = "hf_lora"


@dataclass
class AdapterConfig(PromptConfig):
    trained_model: ClassVar[str] = ADAPTER_MODEL
    trains: ClassVar[str] = "LoRA adapters (model=clip_lora, or model=hf_lora on text)"

    def check(self, run: RootConfig) -> None:
        if (run.model or {}).get("name") == TEXT_ADAPTER_MODEL:
            return  # no aligned stand-in to check: the encoder comes from its folder
        super().check(run)
