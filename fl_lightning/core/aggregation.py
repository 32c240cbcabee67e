"""Aggregation as a chain of steps: the seam between "a client's update exists" and "the
method takes its server step" (pfl-research's postprocessors, Flower's strategy wrappers,
fedjax's aggregator with its running sum).

`Strategy.average` runs the chain; every method that overrides `aggregate` calls it and then
takes its own server step (FedAvgM's momentum, FedAdam's optimiser, SCAFFOLD's control
variates). A cross-cutting mechanism (clipping and noise for central DP, staleness weights,
secure aggregation) is therefore a step here, chosen by configuration, and composes with every
such method instead of being a strategy subclass that composes with none.

How the chain runs, per round:

1. `Aggregator.start`: an empty running sum, the params the updates started from (`base`),
   and each step's memory from `ServerState.aggregation` (so resume is exact).
2. `Aggregator.add`, once per update in client-id order (enforced: sums are then the same on
   every executor): the update becomes a `Contribution` (its weight, by default its example
   count; its floating tensors, as deltas `params − base` when a step needs them (clipping,
   noise), else as params), each step's `one` transforms it in chain order (clip, reweight),
   and it is added to a float64 running sum. The driver holds one sum, not every update: the
   runner adds each update as it arrives (`runtime/summing.py`, a `Summed` in the round's
   `ServerContext`) and drops its params; a method whose server step reads each update
   (`Strategy.reads_each_update`, or `aggregates_through_chain` False) gets the list whole.
3. `Aggregator.result`: the weighted mean becomes an `Aggregate`; each step's `server` hook
   transforms it in reverse chain order (noise last added, first applied: pfl's order); the new
   global params are `base + mean` (deltas) or `mean` (params). Integer buffers
   (`num_batches_tracked`) are the rounded weighted mean of the uploaded values, as before.

With no step the chain is FedAvg's example-weighted mean of params, Σ w_k θ_k / Σ w_k,
accumulated in float64 in client-id order.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch

from .chain import STEP_NAMES
from .messages import ClientUpdate, ServerState
from .types import ClientId, Metrics, StateDict

if TYPE_CHECKING:
    from .strategy import ServerContext

__all__ = [
    "AGGREGATION_STEPS",
    "Aggregate",
    "AggregationStep",
    "Aggregator",
    "ClipL2",
    "Summed",
    "Contribution",
    "GaussianNoise",
    "Uniform",
    "l2_norm",
    "make_aggregator",
    "register_step",
    "summed_away",
]


@dataclass
class Contribution:
    """One client's update as the chain sees it.

    Attributes:
        client_id: who sent it.
        weight: its weight in the mean (its example count unless a step changes it).
        values: its floating tensors: deltas (uploaded params − the params it started from)
            when a step of the chain needs them, else the params themselves.
        metrics: what steps measured of it (averaged over the round's contributions and
            logged as `server/<step>/<name>`).
    """

    client_id: ClientId
    weight: float
    values: StateDict
    metrics: Metrics = field(default_factory=dict)


@dataclass
class Aggregate:
    """The round's weighted mean, as the chain's `server` hooks see it.

    Attributes:
        values: Σ w_k v_k / Σ w_k over the contributions' values (float64).
        count: contributions in it (the cohort that arrived).
        weight: their total weight.
        metrics: what steps measured of the aggregate (`server/<step>/<name>`).
    """

    values: StateDict
    count: int
    weight: float
    metrics: Metrics = field(default_factory=dict)


class AggregationStep:
    """One step of the chain. `one` sees each contribution (client-id order), `server` the
    weighted mean; `memory` is the step's own dict in `ServerState.aggregation[name]`, carried
    from round to round and checkpointed (adaptive clipping's bound, an accountant's history):
    change it in place. Randomness comes from `ctx.generator(...)`, seeded by (seed, round,
    tag), never from global state, so serial == Ray and resume stay exact."""

    name: ClassVar[str] = ""

    @property
    def needs_deltas(self) -> bool:
        """The step works on deltas (update − the params it started from): clipping, noise. A
        chain of steps that do not (reweighting, a clip of infinity, noise of σ = 0) averages
        params, as FedAvg does, bit for bit."""
        return True

    @property
    def runs_on_empty(self) -> bool:
        """The step's `server` runs also when no update arrived (on a zero mean): central DP
        with Poisson cohorts releases its noise whoever was drawn."""
        return False

    def one(self, c: Contribution, memory: dict[str, Any], ctx: ServerContext | None) -> Contribution:
        return c

    def server(self, a: Aggregate, memory: dict[str, Any], ctx: ServerContext | None) -> Aggregate:
        return a

    def describe(self) -> dict[str, Any]:
        """The step's settings, as `summary()` and W&B record them."""
        return {"name": self.name}

    def build(self, steps: tuple[AggregationStep, ...]) -> Aggregator | None:
        """A step that changes how the chain sums (secure aggregation: the server holds only
        the sum) returns the Aggregator that runs `steps`; None: the plain running sum."""
        return None


def make_aggregator(steps: Sequence[AggregationStep] = ()) -> Aggregator:
    """The chain of `steps`: the Aggregator a step builds (`AggregationStep.build`), else the
    plain one."""
    steps = tuple(steps)
    for s in steps:
        agg = s.build(steps)
        if agg is not None:
            return agg
    return Aggregator(steps)


#: name -> a factory of the step from the run config (`aggregator.*`, and what other groups
#: such as `privacy` add). `register_step` adds one; steps of other packages register too.
AGGREGATION_STEPS: dict[str, Callable[[Any], AggregationStep]] = {}


def register_step(name: str) -> Callable[[type[AggregationStep]], type[AggregationStep]]:
    """Class decorator: the step `name`, built from the run config by `from_config(cfg)`
    (a classmethod) or, without one, by calling the class with no argument."""

    def deco(cls: type[AggregationStep]) -> type[AggregationStep]:
        cls.name = name
        STEP_NAMES.add(name)
        factory = getattr(cls, "from_config", None)
        AGGREGATION_STEPS[name] = factory if factory is not None else (lambda cfg: cls())
        return cls

    return deco


def l2_norm(values: StateDict) -> float:
    """The L2 norm over every tensor of `values` together (float64)."""
    return math.sqrt(sum(float(v.detach().to(torch.float64).pow(2).sum()) for v in values.values()))


@register_step("clip_l2")
@dataclass(frozen=True)
class ClipL2(AggregationStep):
    """Each update's delta (every floating tensor it uploads, together) scaled to L2 norm at
    most `clip` (McMahan et al. 2018's per-user clipping; Flower's fixed clipping)."""

    clip: float = 1.0

    @classmethod
    def from_config(cls, cfg: Any) -> ClipL2:
        return cls(clip=float(cfg.aggregator.clip))

    @property
    def needs_deltas(self) -> bool:
        return math.isfinite(self.clip)

    def one(self, c: Contribution, memory: dict[str, Any], ctx: ServerContext | None) -> Contribution:
        norm = l2_norm(c.values)
        scale = min(1.0, self.clip / norm) if norm > 0 else 1.0
        values = c.values if scale == 1.0 else {k: v * scale for k, v in c.values.items()}
        metrics = {**c.metrics, "clip_l2/norm": norm, "clip_l2/clipped": float(scale < 1.0)}
        return dataclasses.replace(c, values=values, metrics=metrics)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "clip": self.clip}


@register_step("uniform")
class Uniform(AggregationStep):
    """Every update weighs the same (user-level DP's sensitivity needs it: an example-weighted
    mean lets one large client move it by more than C/m)."""

    @property
    def needs_deltas(self) -> bool:
        return False

    def one(self, c: Contribution, memory: dict[str, Any], ctx: ServerContext | None) -> Contribution:
        return dataclasses.replace(c, weight=1.0)


@register_step("gaussian")
@dataclass(frozen=True)
class GaussianNoise(AggregationStep):
    """N(0, (σ·C/m)²) added to every coordinate of the mean of m clipped, uniformly weighted
    updates (Flower's `compute_stdv`; the Gaussian mechanism on a sum of sensitivity C, divided
    by m). Drawn from a generator seeded by (seed, round, this step), in key order."""

    noise_multiplier: float = 0.0
    clip: float = 1.0

    @classmethod
    def from_config(cls, cfg: Any) -> GaussianNoise:
        return cls(noise_multiplier=float(cfg.aggregator.noise_multiplier), clip=float(cfg.aggregator.clip))

    @property
    def needs_deltas(self) -> bool:
        return self.noise_multiplier > 0

    def std(self, count: int) -> float:
        return self.noise_multiplier * self.clip / max(count, 1)

    def server(self, a: Aggregate, memory: dict[str, Any], ctx: ServerContext | None) -> Aggregate:
        if self.noise_multiplier == 0.0:
            return a
        if not self.needs_deltas or ctx is None:
            raise RuntimeError(
                "the gaussian aggregation step needs the round's ServerContext (its generator)"
            )
        std = self.std(a.count)
        gen = ctx.generator(step_tag(self.name))
        values = {
            k: v + std * torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in a.values.items()
        }
        return dataclasses.replace(a, values=values, metrics={**a.metrics, "gaussian/std": std})

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "noise_multiplier": self.noise_multiplier, "clip": self.clip}


def step_tag(name: str) -> int:
    """A stable integer for a step's name (its generator's seed component)."""
    return zlib.crc32(name.encode())


@dataclass
class Accumulator:
    """The running state of one round's aggregation (`Aggregator.start` .. `result`)."""

    base: StateDict | None
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    weight: float = 0.0
    count: int = 0
    last_client: ClientId = -1
    ints: set[str] = field(default_factory=set)  # integer buffers: averaged as params, rounded
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)  # each key's as uploaded
    metrics: dict[str, float] = field(default_factory=dict)  # sums over contributions
    memory: dict[str, dict[str, Any]] = field(default_factory=dict)


class Aggregator:
    """The chain: `start`, `add` per update in client-id order, `result` (module docstring)."""

    def __init__(self, steps: Sequence[AggregationStep] = ()) -> None:
        self.steps = tuple(steps)

    @property
    def on_deltas(self) -> bool:
        """Steps see deltas from the params the updates started from where one needs them;
        otherwise the chain averages params (the bare mean: FedAvg's arithmetic)."""
        return any(s.needs_deltas for s in self.steps)

    def after(self, step: AggregationStep) -> Aggregator:
        """This chain with `step` first (a method's own weighting, before the run's steps);
        a chain that already has a step of that name is returned as it is."""
        if any(s.name == step.name for s in self.steps):
            return self
        return make_aggregator((step, *self.steps))

    def describe(self) -> list[dict[str, Any]]:
        return [s.describe() for s in self.steps]

    def upload(
        self, state: ServerState, updates: Sequence[ClientUpdate], ctx: ServerContext | None = None
    ) -> list[ClientUpdate]:
        """The clients' last act before their updates reach the server (the runner calls it
        after the fit, before anything of the server's reads them): nothing for the plain
        chain; secure aggregation masks each update here (`core/secagg.py`)."""
        return list(updates)

    def start(self, state: ServerState, ctx: ServerContext | None = None) -> Accumulator:
        memory = {s.name: dict(state.aggregation.get(s.name, {})) for s in self.steps}
        return Accumulator(base=state.global_params, memory=memory)

    def add(self, acc: Accumulator, update: ClientUpdate, ctx: ServerContext | None = None) -> Accumulator:
        if update.params is None or not update.params:
            return acc
        if update.client_id <= acc.last_client:
            raise ValueError(
                f"updates must be added in increasing client-id order (got {update.client_id} after "
                f"{acc.last_client}): the sums must not depend on the order results arrive in"
            )
        acc.last_client = update.client_id
        for k, v in update.params.items():
            acc.dtypes.setdefault(k, v.dtype)
        floats = {k: v for k, v in update.params.items() if v.is_floating_point()}
        if self.on_deltas:
            if acc.base is None:
                raise ValueError(
                    "aggregation steps need the params the updates started from (no global params)"
                )
            floats = {
                k: v.detach().to(torch.float64) - acc.base[k].detach().to(torch.float64)
                for k, v in floats.items()
            }
        c = Contribution(update.client_id, float(update.num_examples), floats)
        for s in self.steps:
            c = s.one(c, acc.memory[s.name], ctx)
        if c.weight < 0:
            raise ValueError(f"a contribution's weight must be >= 0 (client {c.client_id}: {c.weight})")
        for k, v in c.values.items():
            term = v.detach().to("cpu", torch.float64) * c.weight
            acc.sums[k] = acc.sums[k] + term if k in acc.sums else term
        for k, v in update.params.items():  # integer buffers: their weighted mean, rounded
            if not v.is_floating_point():
                acc.ints.add(k)
                term = v.detach().to("cpu", torch.float64) * c.weight
                acc.sums[k] = acc.sums[k] + term if k in acc.sums else term
        for k, m in c.metrics.items():
            acc.metrics[k] = acc.metrics.get(k, 0.0) + float(m)
        acc.weight += c.weight
        acc.count += 1
        return acc

    def result(
        self, acc: Accumulator, state: ServerState, ctx: ServerContext | None = None
    ) -> tuple[StateDict | None, dict[str, dict[str, Any]], Metrics]:
        """The new global params (None: no update had params: keep the state's), the steps'
        memory for `ServerState.aggregation`, and the round's metrics."""
        if acc.count == 0:
            if acc.base is None or not any(s.runs_on_empty for s in self.steps):
                return state.global_params, acc.memory, {}
            return self._empty(acc, ctx)
        if acc.weight <= 0:
            raise ValueError("the round's contributions have zero total weight")
        ref = acc.base or {}
        floats = {k: v / acc.weight for k, v in acc.sums.items() if k not in acc.ints}
        agg = Aggregate(floats, acc.count, acc.weight, {k: v / acc.count for k, v in acc.metrics.items()})
        for s in reversed(self.steps):
            agg = s.server(agg, acc.memory[s.name], ctx)
        out: StateDict = {}
        for k, total in acc.sums.items():
            dtype = acc.dtypes[k]
            if k in acc.ints:
                out[k] = (total / acc.weight).round().to(dtype)
            else:
                v = agg.values[k]
                if self.on_deltas:
                    v = ref[k].detach().to(torch.float64) + v
                out[k] = v.to(dtype)
        params = {**(state.global_params or {}), **out}
        return params, acc.memory, {**agg.metrics}

    def _empty(
        self, acc: Accumulator, ctx: ServerContext | None
    ) -> tuple[StateDict | None, dict[str, dict[str, Any]], Metrics]:
        """A round without updates where a step still releases something (`runs_on_empty`):
        the steps' `server` hooks on a zero mean of deltas over the floating params."""
        assert acc.base is not None
        base = acc.base
        zeros = {
            k: torch.zeros(v.shape, dtype=torch.float64) for k, v in base.items() if v.is_floating_point()
        }
        agg = Aggregate(zeros, 0, 0.0, {})
        for s in reversed(self.steps):
            agg = s.server(agg, acc.memory[s.name], ctx)
        out = {k: (base[k].detach().to(torch.float64) + agg.values[k]).to(base[k].dtype) for k in zeros}
        return {**base, **out}, acc.memory, {**agg.metrics}


def summed_away(update: ClientUpdate) -> ClientUpdate:
    """`update` once its params are in the round's running sum: the same object, its params
    now meta tensors (the keys, shapes and dtypes, no storage), so the driver no longer holds
    them while byte counts (`upload_nbytes`) and `if u.params` read what was uploaded. Reading
    a value from one fails loudly: a server step that reads each update's params declares
    `Strategy.reads_each_update`, and the driver then keeps them (`runtime/summing.py`)."""
    if update.params:
        update.params = {k: v.to("meta") for k, v in update.params.items()}
    return update


@dataclass
class Summed:
    """A round's updates already added to the chain's running sum by the driver as they
    arrived, in client-id order, each dropped once added (`summed_away`; fedjax's
    `delta_params_sum`): `Strategy.average` finishes this sum (`aggregate_chain`) instead of
    adding the updates again. The arithmetic is the same, in the same order, as `average`
    over the list: the result is bit for bit the same. Taken once (`result` changes the
    steps' memory in place)."""

    aggregator: Aggregator
    acc: Accumulator
    taken: bool = False

    def take(
        self, aggregator: Aggregator, state: ServerState, updates: Sequence[ClientUpdate]
    ) -> Accumulator:
        """The running sum, for `aggregator` over `updates` from `state`; RuntimeError where it
        is not that sum (another chain, another state, other updates, a second `average`)."""
        sent = sum(1 for u in updates if u.params)
        why = (
            "it was taken already (average runs once a round)" if self.taken
            else "another aggregator summed it" if aggregator is not self.aggregator
            else "it started from other global params" if self.acc.base is not state.global_params
            else f"it holds {self.acc.count} updates, not these {sent}" if self.acc.count != sent
            else ""
        )  # fmt: skip
        if why:
            raise RuntimeError(f"the round's running sum cannot be used: {why}")
        self.taken = True
        return self.acc


S = TypeVar("S", bound=ServerState)


def aggregate_chain(
    aggregator: Aggregator, state: S, updates: Sequence[ClientUpdate], ctx: ServerContext | None
) -> S:
    """`updates` through `aggregator`, in client-id order: the state with the new global params,
    the steps' memory and the round's metrics (`aggregation["metrics"]`, logged by the runner).
    Where the driver summed the updates as they arrived (`ctx.summed`), that sum is finished."""
    if state.global_params is None:  # a method that shares no weights: nothing to average
        return state
    summed = ctx.summed if ctx is not None else None
    if summed is not None:
        acc = summed.take(aggregator, state, updates)
    else:
        acc = aggregator.start(state, ctx)
        for u in sorted(updates, key=lambda u: u.client_id):
            acc = aggregator.add(acc, u, ctx)
    params, memory, metrics = aggregator.result(acc, state, ctx)
    aggregation = {**state.aggregation, **memory, "metrics": metrics}
    return dataclasses.replace(state, global_params=params, aggregation=aggregation)
