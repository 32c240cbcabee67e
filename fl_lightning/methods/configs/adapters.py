"""The shared config of the federated LoRA methods (FedIT, FFA-LoRA, FLoRA, HetLoRA): the model
they train adapters on (`model=clip_lora`), and the held-out images its aligned weights learn
from (the prompt learners' check, `PromptConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .prompting import PromptConfig

ADAPTER_MODEL = "clip_lora"


@dataclass
class AdapterConfig(PromptConfig):
    trained_model: ClassVar[str] = ADAPTER_MODEL
    trains: ClassVar[str] = "LoRA adapters"
