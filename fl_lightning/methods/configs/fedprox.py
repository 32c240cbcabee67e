"""FedProx's config."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("fedprox")
@dataclass
class FedProxConfig(MethodConfig):
    mu: float = 0.001  # FedGLCL tuned mu in {1e-4, 1e-3, 1e-2, 1e-1}: 1e-3 for FMNIST/CIFAR-100
