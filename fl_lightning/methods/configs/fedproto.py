"""FedProto's config."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("fedproto")
@dataclass
class FedProtoConfig(MethodConfig):
    single_label = "class prototypes, one class per example"
    lam: float = 1.0  # weight of the prototype term (FedGLCL used mu = 1)
    share_weights: bool = False

    def keeps_personal_models(self) -> bool:
        return not self.share_weights  # one global model only when weights are shared
