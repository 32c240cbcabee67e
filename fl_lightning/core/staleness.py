"""Staleness weighting as a step of the aggregation chain (`core/aggregation.py`), so that
asynchronous and buffered server modes (FedBuff, FedAsync: `system.mode`) compose with every
method whose server step runs on the chain's mean (FedAvg, FedProx, FedAvgM, FedAdam, ...).

An update of staleness τ (server versions since the version it started from,
`ServerContext.staleness`) has its delta scaled by `mix · s(τ)`; its weight in the mean (its
example count) is unchanged, so a zero-weight update moves the model by nothing (FLSim's
check) instead of dividing by a total weight of zero:

- constant: s(τ) = 1;
- polynomial: s(τ) = 1 / (1 + τ)^a (FedBuff's choice, a = 0.5; FedAsync's polynomial);
- hinge: s(τ) = 1 if τ ≤ b, else 1 / (a (τ − b) + 1) (FedAsync's hinge).

`mix` is FedAsync's α (the mixing weight of one arrival); FedBuff's is 1, its server learning
rate and momentum being FedAvgM's (`method=fedavgm`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .aggregation import AggregationStep, Contribution, register_step

if TYPE_CHECKING:
    from .strategy import ServerContext


def staleness_weight(kind: str, tau: int, a: float, b: float) -> float:
    """s(τ) of the module docstring."""
    if tau < 0:
        raise ValueError(f"staleness must be >= 0 (got {tau})")
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((1.0 + tau) ** (-a))
    if kind == "hinge":
        return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)
    raise ValueError(f"unknown staleness weighting {kind!r} (constant, polynomial, hinge)")


@register_step("staleness")
@dataclass(frozen=True)
class Staleness(AggregationStep):
    """Each contribution's delta scaled by `mix · s(τ)` (module docstring)."""

    kind: str = "constant"
    a: float = 0.5
    b: float = 4.0
    mix: float = 1.0

    @classmethod
    def from_config(cls, cfg: Any) -> Staleness:
        s = cfg.system
        mix = float(s.mix) if s.mode == "fedasync" else 1.0
        return cls(kind=str(s.staleness), a=float(s.staleness_a), b=float(s.staleness_b), mix=mix)

    @property
    def needs_deltas(self) -> bool:
        # constant weights at mix 1 scale nothing: the chain then averages params, so FedBuff with
        # K = the cohort is synchronous FedAvg bit for bit
        return self.kind != "constant" or self.mix != 1.0

    def one(self, c: Contribution, memory: dict[str, Any], ctx: ServerContext | None) -> Contribution:
        tau = int(ctx.staleness.get(c.client_id, 0)) if ctx is not None else 0
        scale = self.mix * staleness_weight(self.kind, tau, self.a, self.b)
        metrics = {**c.metrics, "staleness/tau": float(tau), "staleness/scale": scale}
        if not self.needs_deltas:
            return dataclasses.replace(c, metrics=metrics)
        return dataclasses.replace(c, values={k: v * scale for k, v in c.values.items()}, metrics=metrics)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "a": self.a, "b": self.b, "mix": self.mix}
