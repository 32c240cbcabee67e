"""FedLC's config."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("fedlc")
@dataclass
class FedLCConfig(MethodConfig):
    tau: float = 1.0
