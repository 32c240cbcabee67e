"""FedPer: no hyperparameters; the head stays with each client."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("fedper")
@dataclass
class FedPerConfig(MethodConfig):
    personalised = True
