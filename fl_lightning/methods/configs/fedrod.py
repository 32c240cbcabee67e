"""FedRoD: no hyperparameters; the personal head stays with each client."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("fedrod")
@dataclass
class FedRoDConfig(MethodConfig):
    personalised = True
    single_label = "balanced softmax on class counts"
