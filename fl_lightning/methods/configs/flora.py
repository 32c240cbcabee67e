"""FLoRA's config."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS
from .adapters import AdapterConfig


@METHODS.register("flora")
@dataclass
class FLoRAConfig(AdapterConfig):
    weighted: bool = True  # p_k = n_k / n (the authors' stacking weights); false: 1 / K
