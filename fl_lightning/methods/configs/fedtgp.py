"""FedTGP's config."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("fedtgp")
@dataclass
class FedTGPConfig(MethodConfig):
    personalised = True
    single_label = "class prototypes, one class per example"
    lam: float = 1.0  # λ of the client's prototype term
    margin_threshold: float = 100.0  # cap of the adaptive margin
    server_epochs: int = 100  # passes over the uploaded prototypes per round
    server_batch_size: int = 100
    server_lr: float = 0.01  # SGD, rebuilt every round
