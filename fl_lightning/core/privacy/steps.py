"""`privacy=dp_fedavg` as one step of the aggregation chain (`core/aggregation.py`), so it
composes with every method that aggregates through the chain (FedAvg, FedProx, FedAvgM's and
FedAdam's server optimisers, ...), never a strategy subclass.

Per update (`one`): its delta (every floating tensor it uploads, together) clipped to L2 norm
C_t, its weight set to 1, and whether it was within C_t (adaptive clipping's bit). On the mean
(`server`): the mean of m clipped updates gets N(0, (σ_Δ·C_t/m)²) per coordinate; with
adaptive clipping (Andrew et al. 2021, as Flower's and FLSim's) the count of updates within
C_t gets N(0, σ_b²) and C_{t+1} = C_t·exp(−η(b̃/m − γ)). The noise of the update uses C_t, the
bound the updates were clipped to (Flower's server-side wrapper noises with C_{t+1}).

Poisson cohorts (`fl.sampling=poisson`) divide by the expected cohort m = qN rather than the
count that arrived (McMahan et al. 2018's fixed-denominator estimator: the sum's sensitivity
is then C/m whatever the cohort), and an empty cohort still releases its noise.

The step's memory (`ServerState.aggregation["dp_fedavg"]`, checkpointed) holds C_t and the
rounds the accountant has composed, so a resumed run continues both exactly.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..aggregation import Aggregate, AggregationStep, Contribution, l2_norm, step_tag
from ..chain import STEP_NAMES
from .plan import PrivacyPlan

if TYPE_CHECKING:
    from ..strategy import ServerContext

__all__ = ["DpFedAvgStep"]

NAME = "dp_fedavg"
STEP_NAMES.add(NAME)  # a name the chain knows (it is built from `privacy=`, not `aggregator.steps`)


@dataclass(frozen=True)
class DpFedAvgStep(AggregationStep):
    """User-level DP-FedAvg's clip, uniform weight and noise, with adaptive clipping (module
    docstring). `plan`: the mechanism, σ calibrated."""

    name: ClassVar[str] = NAME
    plan: PrivacyPlan

    @property
    def needs_deltas(self) -> bool:
        # σ = 0 and C = ∞ is the uniform mean of params, as FedAvg computes it, bit for bit
        return self.plan.update_noise_multiplier > 0 or math.isfinite(self.plan.clip) or self.plan.adaptive

    @property
    def runs_on_empty(self) -> bool:
        """An empty Poisson cohort still releases the noise (else "nobody was drawn" would show)."""
        return self.plan.sampling.kind == "poisson" and self.needs_deltas

    def bound(self, memory: dict[str, Any]) -> float:
        """C_t: the first round's `privacy.clip`, then what adaptive clipping made of it."""
        return float(memory.get("clip", self.plan.clip))

    def one(self, c: Contribution, memory: dict[str, Any], ctx: ServerContext | None) -> Contribution:
        clip = self.bound(memory)
        norm = l2_norm(c.values)
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
        values = c.values if scale == 1.0 else {k: v * scale for k, v in c.values.items()}
        metrics = {**c.metrics, f"{NAME}/norm": norm, f"{NAME}/unclipped": float(norm <= clip)}
        return dataclasses.replace(c, weight=1.0, values=values, metrics=metrics)

    def server(self, a: Aggregate, memory: dict[str, Any], ctx: ServerContext | None) -> Aggregate:
        plan, clip = self.plan, self.bound(memory)
        m = float(plan.sampling.cohort) if plan.sampling.kind == "poisson" else float(max(a.count, 1))
        values = a.values
        if plan.sampling.kind == "poisson" and a.count != m:  # the sum over the expected cohort
            values = {k: v * (a.count / m) for k, v in values.items()}
        std = plan.update_noise_multiplier * clip / m
        # the updates' own norms and bits stay out of the logs: only what was noised is released
        metrics = {k: v for k, v in a.metrics.items() if not k.startswith(f"{NAME}/")}
        metrics.update({f"{NAME}/clip": clip, f"{NAME}/std": std})
        if std > 0:
            if ctx is None:
                raise RuntimeError("privacy=dp_fedavg needs the round's ServerContext (its generator)")
            gen = ctx.generator(step_tag(NAME))
            values = {
                k: values[k] + std * torch.randn(values[k].shape, generator=gen, dtype=torch.float64)
                for k in sorted(values)
            }
        if plan.adaptive:  # the noised count of updates within C_t moves C toward the quantile
            inside = a.metrics.get(f"{NAME}/unclipped", 0.0) * a.count
            if ctx is None:
                raise RuntimeError("adaptive clipping needs the round's ServerContext (its generator)")
            gen = ctx.generator(step_tag(f"{NAME}/count"))
            noised = inside + plan.count_stddev * float(torch.randn((), generator=gen, dtype=torch.float64))
            memory["clip"] = clip * math.exp(-plan.clip_lr * (noised / m - plan.target_quantile))
            metrics[f"{NAME}/unclipped_noised"] = noised / m
        memory["rounds"] = int(memory.get("rounds", 0)) + 1  # the accountant's composed rounds
        memory["noise_multiplier"] = plan.noise_multiplier  # a resume must keep composing this one
        return dataclasses.replace(a, values=values, metrics=metrics)

    def describe(self) -> dict[str, Any]:
        p = self.plan
        return {
            "name": NAME, "clip": p.clip, "noise_multiplier": p.noise_multiplier,
            "update_noise_multiplier": p.update_noise_multiplier, "adaptive": p.adaptive,
            "sampling": p.sampling.kind,
        }  # fmt: skip
