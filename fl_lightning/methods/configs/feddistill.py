"""FedDistill's config."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.method import METHODS, MethodConfig


@METHODS.register("feddistill")
@dataclass
class FedDistillConfig(MethodConfig):
    personalised = True
    single_label = "per-class mean logits, one class per example"
    gamma: float = 1.0  # weight of the distillation term (γ = 1 in FedTSP's baselines)
    weighting: str = "count"  # count | uniform (the HtFLlib code)
