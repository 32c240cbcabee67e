"""The config of fednova: no hyperparameters."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("fednova")
@dataclass
class FedNovaConfig(MethodConfig):
    """FedNova has no hyperparameters."""
