"""FedBN: no hyperparameters; batch norm stays with each client."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("fedbn")
@dataclass
class FedBNConfig(MethodConfig):
    personalised = True
