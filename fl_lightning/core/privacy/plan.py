"""What a private run does, fixed before its first round (`PrivacyPlan`), and what it reports
after each round (`PrivacyPlan.report`): the noise multipliers (σ given, or calibrated for the
planned rounds), the sampling model and adjacency, the accountant, the budget stop, and the
plain statement of what the ε covers (docs/privacy.md, the console line, summary.json).

Every round of DP-FedAvg composes one subsampled Gaussian (an empty Poisson round too: its
noise is still released), so after round t the accountant has composed t rounds: a resumed run
reports the ε of an uninterrupted one from its round alone; the aggregation step's memory keeps
the count as well, and it is checked against the round on resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError
from .accountant import (
    Method,
    Sampling,
    SamplingKind,
    UserLevelAccountant,
    adaptive_noise_multipliers,
    calibrate_noise_multiplier,
)
from .channels import (
    ADAPTIVE_WITH_PROTOTYPES,
    OTHER_CHANNELS,
    PRIVATE_PROTOTYPES,
    channel_refusal,
    releases_of,
)
from .dp_sgd import DpSgdLedger

__all__ = [
    "OTHER_CHANNELS",
    "PRIVATE_PROTOTYPES",
    "BudgetSpent",
    "PrivacyPlan",
    "channel_refusal",
    "releases_of",
]


class BudgetSpent(Exception):
    """The next round would take ε past `privacy.max_epsilon`: the run stops before it."""


@dataclass(frozen=True)
class PrivacyPlan:
    """A private run's mechanism, as the run will carry it out.

    Attributes:
        name: dp_fedavg (user-level) or dp_sgd (sample-level; `ledger` accounts for it).
        clip: C (adaptive: the first round's).
        noise_multiplier: σ of the whole round (given, or calibrated for `rounds`).
        update_noise_multiplier: σ_Δ, the noise on the update (σ without adaptive clipping).
        count_stddev: σ_b of the clipped count (adaptive clipping); 0 without.
        sampling: the cohorts' sampling model.
        delta, method, max_epsilon, rounds, target_epsilon: as configured.
        adaptive, target_quantile, clip_lr: adaptive clipping's settings.
        releases: Gaussian releases of multiplier σ a round makes on its cohort (the model's;
            FedProto's and FedTSP's prototypes add two, core/privacy/prototypes.py): together
            one Gaussian of multiplier σ/√releases, which the accountant composes.
    """

    name: Literal["dp_fedavg", "dp_sgd"]
    clip: float
    noise_multiplier: float
    update_noise_multiplier: float
    count_stddev: float
    sampling: Sampling
    delta: float
    method: Method
    rounds: int
    max_epsilon: float | None = None
    target_epsilon: float | None = None
    adaptive: bool = False
    target_quantile: float = 0.5
    clip_lr: float = 0.2
    #: dp_sgd: the chain's record of each client's steps, and its accountant (per client)
    ledger: DpSgdLedger | None = None
    releases: int = 1

    @classmethod
    def of(cls, privacy: Any, fl: Any, cohort: int, releases: int = 1) -> PrivacyPlan:
        """The plan of `privacy` (a `PrivacyConfig`) for `fl`'s run, `cohort` clients a round
        (Poisson: expected), `releases` Gaussian releases a round (`releases_of`); σ calibrated
        here when `privacy.target_epsilon` is set (for the releases together: each gets √releases
        times the σ the accountant composes)."""
        kind: SamplingKind = "poisson" if fl.sampling == "poisson" else "without_replacement"
        sampling = Sampling(kind, int(fl.num_clients), int(cohort))
        method: Method = privacy.accountant
        sigma = privacy.noise_multiplier
        ledger = None
        if privacy.name == "dp_sgd":
            ledger = DpSgdLedger(
                float(sigma), int(fl.batch_size), int(fl.local_epochs), fl.local_steps, float(privacy.delta)
            )
        elif sigma is None:
            sigma = math.sqrt(releases) * calibrate_noise_multiplier(
                float(privacy.target_epsilon), float(privacy.delta), sampling, int(fl.rounds), method
            )
        if releases > 1 and privacy.adaptive:  # `check_method` refuses it first; a plan made otherwise too
            raise ConfigError(ADAPTIVE_WITH_PROTOTYPES)
        count_std, update_sigma = 0.0, float(sigma)
        if privacy.adaptive:
            # Andrew et al.'s (and Flower's) m/20; where that is not above σ/2 (small cohorts, large
            # σ) σ itself, which raises the update's noise by 15% (σ_Δ = σ/√(3/4))
            count_std = float(privacy.clipped_count_stddev or max(cohort / 20, float(sigma)))
            update_sigma = adaptive_noise_multipliers(float(sigma), count_std)
        return cls(
            name=privacy.name, clip=float(privacy.clip), noise_multiplier=float(sigma),
            update_noise_multiplier=update_sigma, count_stddev=count_std, sampling=sampling,
            delta=float(privacy.delta), method=method, rounds=int(fl.rounds),
            max_epsilon=privacy.max_epsilon, target_epsilon=privacy.target_epsilon,
            adaptive=bool(privacy.adaptive), target_quantile=float(privacy.target_quantile),
            clip_lr=float(privacy.clip_lr), ledger=ledger, releases=int(releases),
        )  # fmt: skip

    @property
    def accounted_noise_multiplier(self) -> float:
        """The multiplier of one round's releases together, σ/√releases: what the accountant composes."""
        return self.noise_multiplier / math.sqrt(self.releases)

    def accountant(self, rounds: int = 0) -> UserLevelAccountant:
        return UserLevelAccountant(
            self.sampling, self.accounted_noise_multiplier, self.delta, self.method, rounds=rounds
        )

    def epsilon(self, rounds: int, memory: dict[str, Any] | None = None) -> float:
        """ε after `rounds` rounds: DP-FedAvg's from the rounds alone, DP-SGD's (the largest
        over the clients) from the chain step's `memory`."""
        if self.ledger is not None:
            return self.ledger.epsilon(memory or {})
        return self.accountant().epsilon(rounds)

    def check_budget(self, next_round: int, memory: dict[str, Any] | None = None) -> None:
        """BudgetSpent when round `next_round` would take ε past `max_epsilon` (DP-SGD: were
        any client, the smallest fresh one included, to train in it)."""
        used = (memory or {}).get("noise_multiplier")
        if self.ledger is None and used is not None and used != self.noise_multiplier:
            raise ConfigError(
                f"the run's rounds so far used noise multiplier {used:.6g} and this one would use "
                f"{self.noise_multiplier:.6g} (σ is calibrated for fl.rounds: a resume that changed it, "
                "or the privacy settings): the accountant composes one mechanism; resume with the "
                f"run's settings, or privacy.noise_multiplier={used:.6g} privacy.target_epsilon=null"
            )
        if self.max_epsilon is None:
            return
        if self.ledger is not None:
            eps, done = self.ledger.epsilon(memory or {}, more=True), self.ledger.epsilon(memory or {})
        else:
            eps, done = self.epsilon(next_round), self.epsilon(next_round - 1)
        if eps > self.max_epsilon:
            raise BudgetSpent(
                f"privacy budget: round {next_round} would take ε from {done:.4g} to {eps:.4g}, past "
                f"privacy.max_epsilon={self.max_epsilon:g} (δ={self.delta:g}); stopped after round "
                f"{next_round - 1}"
            )

    def covers(self) -> str:
        """What the reported (ε, δ) covers, said plainly."""
        if self.ledger is not None:
            return (
                "sample-level (ε, δ) of DP-SGD in each client (Opacus): any one training example may "
                f"change; the largest ε over the clients; each example's gradient clipped to L2 norm "
                f"{self.clip:g} and noised in every local step, so the uploaded models are covered; "
                "accountant: Opacus RDP per client, batches of fixed size from a shuffle accounted as "
                "Poisson draws of rate batch/shard (the usual approximation), no amplification by "
                "client sampling counted. Not covered: which client holds how many examples, the "
                "logged training metrics and evaluations; the noise's generator is seeded "
                "(reproducible, not cryptographic)"
            )
        what = (
            f"the model updates only (every uploaded tensor clipped to L2 norm {self.clip:g}"
            f"{' adaptively' if self.adaptive else ''}, Gaussian noise on their uniform mean)"
        )
        if self.releases > 1:  # FedProto, FedTSP: the prototypes are a release of their own
            what = (
                "the uploads: the class prototypes (each client's clipped to L2 norm "
                f"{self.clip:g} as one matrix, Gaussian noise on their sum and on the count of holders "
                "per class: the example counts enter only as whether a client holds a class)"
                + (
                    " and the model updates (clipped, noise on their uniform mean)"
                    if self.releases > 2
                    else ""
                )
                + f", {self.releases} releases a round accounted as one of multiplier σ/√{self.releases}"
            )
        return (
            f"user-level (ε, δ) of DP-FedAvg: any one client's whole data may change; covers {what}, against "
            f"anyone who sees the released models, with a trusted server; cohorts: "
            f"{self.sampling.describe()}; accountant: dp-accounting {self.method.upper()}. Not covered: "
            "the clients' logged training metrics and evaluations, and the noise's generator is "
            "seeded (reproducible, not cryptographic)"
        )

    def report(self, rounds: int, memory: dict[str, Any], clip: float | None = None) -> dict[str, float]:
        """The `privacy/<k>` metrics after `rounds` rounds; `memory`: the chain step's (DP-FedAvg:
        the rounds it composed; DP-SGD: each client's steps); `clip`: the C this round clipped
        to (adaptive). DP-FedAvg's composed rounds that are not `rounds` (a checkpoint of a run
        without this mechanism in some round) are refused."""
        if self.ledger is None:
            composed = int(memory.get("rounds", 0))
            if composed != rounds:
                raise ConfigError(
                    f"the privacy accountant composed {composed} rounds by round {rounds}: the run's "
                    "checkpoints were not all made with privacy=dp_fedavg; its ε cannot be stated"
                )
        return {
            "epsilon": self.epsilon(rounds, memory),
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "clip": self.clip if clip is None else float(clip),
        }

    def summary(self, rounds: int, epsilon: float | None = None) -> dict[str, Any]:
        """summary.json's `privacy` block after `rounds` rounds (`epsilon`: DP-SGD's, as the
        last round reported it)."""
        eps = self.epsilon(rounds) if self.ledger is None else (epsilon or 0.0)
        out = {
            "mechanism": self.name,
            "epsilon": eps if math.isfinite(eps) else None,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "clip": self.clip,
            "max_epsilon": self.max_epsilon,
            "covers": self.covers(),
        }
        if self.ledger is not None:
            return {**out, "accountant": "opacus rdp", "level": "sample"}
        return {
            **out,
            "level": "user",
            "update_noise_multiplier": self.update_noise_multiplier,
            "releases": self.releases,
            "accounted_noise_multiplier": self.accounted_noise_multiplier,
            "clipped_count_stddev": self.count_stddev,
            "adaptive_clipping": self.adaptive,
            "target_epsilon": self.target_epsilon,
            "accountant": self.method,
            "sampling": self.sampling.kind,
            "adjacency": self.sampling.adjacency,
        }

    def console_line(self, rounds: int, epsilon: float | None = None) -> str:
        eps = self.epsilon(rounds) if self.ledger is None else (epsilon or 0.0)
        if self.ledger is not None:
            return (
                f"privacy: ε = {eps:.4g} at δ = {self.delta:g} after {rounds} rounds, the largest over the "
                f"clients (DP-SGD, σ = {self.noise_multiplier:.4g}, C = {self.clip:g}, Opacus RDP): "
                "sample-level, per client (docs/privacy.md)"
            )
        return (
            f"privacy: ε = {eps:.4g} at δ = {self.delta:g} after {rounds} rounds (σ = "
            f"{self.noise_multiplier:.4g}, C = {self.clip:g}{', adaptive' if self.adaptive else ''}; "
            f"{self.sampling.adjacency}, {self.method.upper()}): user-level, model updates only, "
            "trusted server (docs/privacy.md)"
        )
