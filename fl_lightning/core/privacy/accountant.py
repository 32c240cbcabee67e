"""Privacy accounting for a run, over Google's `dp-accounting` (user-level DP-FedAvg) and
Opacus' accountants (sample-level DP-SGD). Nothing here computes a privacy bound itself:
every ε and δ comes from one of those libraries; this module only states which mechanism ran
(the `DpEvent`), under which sampling model and adjacency, and keeps how many times it ran.

The sampling model decides the adjacency, and both are passed to the accountant:

* `without_replacement` (our default cohorts: `fl.clients_per_round` clients drawn uniformly
  without replacement): replace-one adjacency, `SampledWithoutReplacementDpEvent`, RDP only
  (dp-accounting has no PLD analysis of it). Replacing one client's data moves the sum of
  clipped updates by up to 2C, so the Gaussian the accountant sees has noise multiplier σ/2
  (dp-accounting's `noise_multiplier` is the noise std over the l2-sensitivity).
* `poisson` (`fl.sampling=poisson`: each client joins each round with probability q = m/N):
  add/remove adjacency, `PoissonSampledDpEvent`, RDP or PLD; sensitivity C, multiplier σ.

Every round runs the same mechanism, so an accountant's state is the number of rounds it has
composed: `state_dict()` is plain JSON data for the checkpoint, and a resumed run reports the
ε of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConfigError

if TYPE_CHECKING:
    import dp_accounting as dpa

__all__ = [
    "OPACUS_RDP_ORDERS",
    "Method",
    "SamplingKind",
    "Sampling",
    "UserLevelAccountant",
    "SampleLevelAccountant",
    "adaptive_noise_multipliers",
    "calibrate_noise_multiplier",
]

SamplingKind = Literal["without_replacement", "poisson"]
Method = Literal["rdp", "pld"]

#: Opacus' RDP orders (`opacus.accountants.RDPAccountant.DEFAULT_ALPHAS`), to reproduce its numbers
OPACUS_RDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


@dataclass(frozen=True)
class Sampling:
    """How each round's cohort is drawn: `cohort` of `population` clients (Poisson: expected).

    Attributes:
        kind: without_replacement (fixed size, replace-one adjacency) or poisson (add/remove).
        population: N, the clients that may be drawn.
        cohort: m, clients per round (Poisson: the expected number, q·N).
    """

    kind: SamplingKind
    population: int
    cohort: int

    def __post_init__(self) -> None:
        if not 1 <= self.cohort <= self.population:
            raise ConfigError(f"a cohort of {self.cohort} from {self.population} clients cannot be drawn")

    @property
    def rate(self) -> float:
        """q = m/N."""
        return self.cohort / self.population

    @property
    def adjacency(self) -> str:
        return "replace-one" if self.kind == "without_replacement" else "add/remove-one"

    def describe(self) -> str:
        if self.kind == "without_replacement":
            return (
                f"fixed cohorts of {self.cohort} of {self.population} clients drawn without replacement "
                "(replace-one adjacency)"
            )
        return (
            f"Poisson cohorts, each of {self.population} clients joining with probability "
            f"{self.rate:.4g} (add/remove-one adjacency)"
        )


def _dpa() -> Any:
    """dp-accounting, imported where an ε is computed: it brings scipy.signal (~0.5 s on 2
    cores), which every client worker and a run without DP would otherwise import (this module
    is on the path of `runtime/host.py` through DP-SGD's plan)."""
    import dp_accounting

    return dp_accounting


def _round_event(sampling: Sampling, noise_multiplier: float) -> dpa.DpEvent:
    """One round of DP-FedAvg: a subsampled Gaussian, as the sampling model says."""
    lib = _dpa()
    if sampling.kind == "poisson":
        return lib.PoissonSampledDpEvent(sampling.rate, lib.GaussianDpEvent(noise_multiplier))
    # replace-one: the sum's l2-sensitivity is 2C, so the multiplier per unit of sensitivity halves
    gaussian = lib.GaussianDpEvent(noise_multiplier / 2)
    return lib.SampledWithoutReplacementDpEvent(sampling.population, sampling.cohort, gaussian)


def _fresh(method: Method, sampling: Sampling, orders: tuple[float, ...] | None) -> dpa.PrivacyAccountant:
    lib = _dpa()
    from dp_accounting import pld, rdp

    relation = (
        lib.NeighboringRelation.REPLACE_ONE
        if sampling.kind == "without_replacement"
        else lib.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    if method == "pld":
        if sampling.kind == "without_replacement":
            raise ConfigError(
                "privacy.accountant=pld needs fl.sampling=poisson (dp-accounting's PLD has no analysis of "
                "fixed-size cohorts drawn without replacement); use privacy.accountant=rdp"
            )
        return pld.PLDAccountant(neighboring_relation=relation)
    return rdp.RdpAccountant(list(orders) if orders else None, neighboring_relation=relation)


class _Quiet:
    """dp-accounting logs (through absl) a warning for every RDP order it drops as numerically
    unstable (small fractional orders at some q, σ); the bound over the other orders is still
    valid, so those stay quiet."""

    def __enter__(self) -> None:
        self._absl = logging.getLogger("absl")
        self._level = self._absl.level
        self._absl.setLevel(logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        self._absl.setLevel(self._level)


@dataclass
class UserLevelAccountant:
    """User-level (ε, δ) of DP-FedAvg: `rounds` compositions of one round's subsampled Gaussian.

    Attributes:
        sampling: the cohorts' sampling model (and so the adjacency).
        noise_multiplier: σ, the noise std over the clip norm C on the sum of clipped updates
            (with adaptive clipping: the σ of the whole round, before it is split between the
            update and the clipped count, Andrew et al. Theorem 1).
        delta: δ at which ε is reported.
        method: rdp or pld (dp-accounting's).
        orders: RDP orders (None: dp-accounting's).
        rounds: rounds composed so far (the state a checkpoint keeps).
    """

    sampling: Sampling
    noise_multiplier: float
    delta: float
    method: Method = "rdp"
    orders: tuple[float, ...] | None = None
    rounds: int = 0

    def __post_init__(self) -> None:
        _fresh(self.method, self.sampling, self.orders)  # refuses PLD with fixed cohorts, early

    def event(self, rounds: int | None = None) -> dpa.DpEvent:
        n = self.rounds if rounds is None else rounds
        return _dpa().SelfComposedDpEvent(_round_event(self.sampling, self.noise_multiplier), n)

    def _accountant(self, rounds: int | None) -> dpa.PrivacyAccountant:
        n = self.rounds if rounds is None else rounds
        return _composed(self.method, self.sampling, self.orders, self.noise_multiplier, n)

    def epsilon(self, rounds: int | None = None) -> float:
        """ε at `delta` after `rounds` rounds (default: those composed); inf without noise."""
        n = self.rounds if rounds is None else rounds
        if n == 0:
            return 0.0
        if self.noise_multiplier <= 0:
            return math.inf
        return _epsilon_after(self.method, self.sampling, self.orders, self.noise_multiplier, n, self.delta)

    def delta_at(self, epsilon: float, rounds: int | None = None) -> float:
        """δ at `epsilon` after `rounds` rounds (default: those composed)."""
        with _Quiet():
            return float(self._accountant(rounds).get_delta(epsilon))

    def step(self, rounds: int = 1) -> float:
        """Compose `rounds` more rounds; ε after them."""
        self.rounds += rounds
        return self.epsilon()

    def state_dict(self) -> dict[str, Any]:
        """Plain data for the checkpoint: the mechanism is checked again on load."""
        return {
            "rounds": self.rounds,
            "noise_multiplier": self.noise_multiplier,
            "sampling": dataclasses.asdict(self.sampling),
            "delta": self.delta,
            "method": self.method,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`, refusing one of another mechanism (a resume that changed σ,
        the cohorts or the accountant would report an ε of neither run)."""
        mine = {k: v for k, v in self.state_dict().items() if k != "rounds"}
        theirs = {k: v for k, v in state.items() if k != "rounds"}
        if mine != theirs:
            changed = sorted(k for k in mine if mine[k] != theirs.get(k))
            raise ConfigError(
                f"the checkpoint's privacy accountant composed another mechanism ({', '.join(changed)} "
                "differ): resume with the run's own privacy settings"
            )
        self.rounds = int(state["rounds"])


@functools.lru_cache(maxsize=1024)
def _epsilon_after(
    method: Method,
    sampling: Sampling,
    orders: tuple[float, ...] | None,
    sigma: float,
    rounds: int,
    delta: float,
) -> float:
    """ε at `delta` after `rounds` rounds of multiplier `sigma`: a pure function of its
    arguments, kept. A run asks for the same ε several times a round (the round's metrics, the
    budget check, the summary and console line) and a PLD accountant composes the rounds anew
    each time (~0.5 s at 1,500 rounds on a core)."""
    with _Quiet():
        return float(_composed(method, sampling, orders, sigma, rounds).get_epsilon(delta))


def _composed(
    method: Method, sampling: Sampling, orders: tuple[float, ...] | None, sigma: float, rounds: int
) -> dpa.PrivacyAccountant:
    """A fresh accountant that composed `rounds` rounds of multiplier `sigma` (none without noise)."""
    acc = _fresh(method, sampling, orders)
    if rounds > 0 and sigma > 0:
        acc.compose(_round_event(sampling, sigma), rounds)
    return acc


# A pure function of its arguments, kept: the rows of a sweep (a claims file's fixed and adaptive
# rows at one ε) and a run's resume calibrate the same σ, each search composing ~10 accountants
# (a PLD one at 1,500 rounds ~9 s on a core). An error is raised again, never kept.
@functools.lru_cache(maxsize=256)
def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sampling: Sampling,
    rounds: int,
    method: Method = "rdp",
    tol: float = 1e-4,
) -> float:
    """The smallest σ (within `tol`) whose ε after `rounds` rounds is at most `target_epsilon`,
    found by dp-accounting's `calibrate_dp_mechanism` (which guarantees the bound is met, as
    Opacus' `get_noise_multiplier` does: never overshooting)."""
    if target_epsilon <= 0:
        raise ConfigError(f"privacy.target_epsilon must be > 0 (got {target_epsilon})")
    lib = _dpa()

    def account(sigma: float) -> dpa.DpEvent:
        return lib.SelfComposedDpEvent(_round_event(sampling, sigma), rounds)

    # the search starts above σ where the PLD's discretised loss range would not fit in memory
    # (dp-accounting sizes it ~1/σ²: 38 GB at σ = 1e-3); a target met below it is refused
    lowest = 0.3 if method == "pld" else 0.05
    with _Quiet():
        at_lowest = _fresh(method, sampling, None).compose(account(lowest)).get_epsilon(delta)
        if at_lowest <= target_epsilon:
            raise ConfigError(
                f"privacy.target_epsilon={target_epsilon:g} is met already at noise multiplier {lowest:g} "
                f"(ε {at_lowest:.3g}): set privacy.noise_multiplier instead"
            )
        sigma = lib.calibrate_dp_mechanism(
            lambda: _fresh(method, sampling, None),
            account,
            target_epsilon,
            delta,
            lib.LowerEndpointAndGuess(lowest, max(1.0, 2 * lowest)),
            tol=tol,
        )
    return float(sigma)


def adaptive_noise_multipliers(noise_multiplier: float, count_stddev: float) -> float:
    """σ_Δ, the update's noise multiplier under adaptive clipping, such that the update (σ_Δ)
    and the clipped count (std `count_stddev` = σ_b) together are the Gaussian mechanism of
    multiplier σ (Andrew et al. 2021, Theorem 1): σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2). Flower's
    `compute_adaptive_noise_params` and FLSim's privacy engine use the same formula."""
    if noise_multiplier == 0:
        return 0.0
    rest = noise_multiplier**-2 - (2 * count_stddev) ** -2
    if rest <= 0:
        raise ConfigError(
            f"privacy.clipped_count_stddev={count_stddev:g} is too small for noise multiplier "
            f"{noise_multiplier:g}: adaptive clipping needs 2·σ_b > σ"
        )
    return float(rest**-0.5)


@dataclass
class SampleLevelAccountant:
    """Sample-level (ε, δ) of DP-SGD in one client, through Opacus' own accountant (`rdp`,
    `prv` or `gdp`): each optimizer step is a Poisson-subsampled Gaussian of rate
    `sample_rate` (a batch over the client's examples) and multiplier `noise_multiplier`.

    Attributes:
        mechanism: Opacus' accountant name.
        steps: (noise_multiplier, sample_rate, count) runs composed so far, Opacus' history.
    """

    mechanism: Literal["rdp", "prv", "gdp"] = "rdp"
    steps: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)

    def _opacus(self) -> Any:
        from opacus.accountants import create_accountant

        acc = create_accountant(self.mechanism)
        acc.history = [tuple(s) for s in self.steps]
        return acc

    def step(self, noise_multiplier: float, sample_rate: float, count: int = 1) -> None:
        if self.steps and self.steps[-1][:2] == (noise_multiplier, sample_rate):
            sigma, q, n = self.steps[-1]
            self.steps[-1] = (sigma, q, n + count)
        else:
            self.steps.append((noise_multiplier, sample_rate, count))

    def epsilon(self, delta: float) -> float:
        if not self.steps:
            return 0.0
        return float(self._opacus().get_epsilon(delta))

    def state_dict(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "steps": [list(s) for s in self.steps]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mechanism = state["mechanism"]
        self.steps = [(float(s), float(q), int(n)) for s, q, n in state["steps"]]
