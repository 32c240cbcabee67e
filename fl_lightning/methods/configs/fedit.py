"""FedIT's config."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS
from .adapters import AdapterConfig


@METHODS.register("fedit")
@dataclass
class FedITConfig(AdapterConfig):
    pass  # FedAvg of A and B: the run's aggregation chain (example-weighted by default)
