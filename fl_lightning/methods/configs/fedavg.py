"""The config of fedavg: no hyperparameters."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("fedavg")
@dataclass
class FedAvgConfig(MethodConfig):
    """FedAvg has no hyperparameters."""
