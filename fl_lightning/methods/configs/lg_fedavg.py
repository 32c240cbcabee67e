"""LG-FedAvg: no hyperparameters; the body stays with each client."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("lg_fedavg")
@dataclass
class LGFedAvgConfig(MethodConfig):
    personalised = True
