"""FFA-LoRA's config."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS
from .adapters import AdapterConfig


@METHODS.register("ffa_lora")
@dataclass
class FFALoRAConfig(AdapterConfig):
    pass  # A frozen at the model's seeded init (model.seed), B through the run's aggregation chain
