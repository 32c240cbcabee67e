"""Class prototypes under `privacy=dp_fedavg` (FedProto, FedTSP): the prototype channel
privatised as the model's is, and composed in the same accountant.

Per client k (client-id order), its prototype matrix P_k [C, D] (the rows of classes it does
not hold zeroed) is clipped as one tensor to Frobenius norm C (`privacy.clip`), and its holder
indicator h_k = 1[n_kc > 0] ∈ {0, 1}^C is taken in place of its counts (which have no bound).
The server releases two noised sums over the cohort,

    S = Σ_k clip(P_k) + N(0, (σC)²)          (sensitivity C per client)
    H = Σ_k h_k + N(0, (σ√C_classes)²)        (sensitivity √C_classes per client)

and per class the mean S_c / max(H_c, 1), zero where the rounded H_c is < 1; the rounded H is
the released `proto_counts`. Each is a Gaussian mechanism of multiplier σ; with the model's
own release (`share_weights=true`: DP-FedAvg's noised mean) a round releases k = 2 or 3 of
them on one cohort, which together are one Gaussian mechanism of multiplier σ/√k (their RDP
adds: α/2σ² each). `PrivacyPlan.releases` = k, and the accountant composes σ/√k per round.
The raw counts and unclipped prototypes never leave `private_class_means`.

The noise comes from the round's `ServerContext.generator` (tag: this release), so serial ==
Ray and resume stay exact; a round in which the chain did not run (no shared weights, or a
round with no prototypes) is still counted in the step's memory: the accountant composes every
round (what nothing was released in is over-counted, never under).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ..aggregation import Aggregator, step_tag
from ..messages import ServerState
from .steps import NAME, DpFedAvgStep

if TYPE_CHECKING:
    from ..strategy import ServerContext

__all__ = ["PROTOTYPE_TAG", "count_round", "private_class_means", "private_prototypes", "privacy_step"]

#: the prototype release's generator tag (`ctx.generator(step_tag(PROTOTYPE_TAG))`)
PROTOTYPE_TAG = f"{NAME}/prototypes"

S = TypeVar("S", bound=ServerState)


def privacy_step(aggregator: Aggregator) -> DpFedAvgStep | None:
    """The run's DP-FedAvg step in `aggregator`'s chain, or None (no privacy)."""
    return next((s for s in aggregator.steps if isinstance(s, DpFedAvgStep)), None)


def private_class_means(
    means: Sequence[torch.Tensor],
    counts: Sequence[torch.Tensor],
    step: DpFedAvgStep,
    ctx: ServerContext | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The noised per-class mean over holders [C, D] (float32) and the noised holder counts [C]
    of the clients' class means and counts, in the order given (client-id order: the sums are
    then the same on every executor). Module docstring."""
    if ctx is None:
        raise RuntimeError("privatised prototypes need the round's ServerContext (its generator)")
    plan = step.plan
    clip, sigma = plan.clip, plan.update_noise_multiplier
    classes, dim = means[0].shape
    sums = torch.zeros(classes, dim, dtype=torch.float64)
    holders = torch.zeros(classes, dtype=torch.float64)
    for p, n in zip(means, counts, strict=True):
        held = (n > 0).double()
        p = p.double() * held[:, None]  # a class it does not hold contributes nothing
        norm = float(p.norm())
        sums += p * (min(1.0, clip / norm) if norm > 0 else 1.0)
        holders += held
    gen = ctx.generator(step_tag(PROTOTYPE_TAG))
    sums += sigma * clip * torch.randn(sums.shape, generator=gen, dtype=torch.float64)
    holders += sigma * math.sqrt(classes) * torch.randn(classes, generator=gen, dtype=torch.float64)
    released = holders.round().clamp(min=0)
    mean = torch.where((released >= 1)[:, None], sums / holders.clamp(min=1)[:, None], torch.zeros_like(sums))
    return mean.float(), released.long()


def count_round(before: ServerState, after: S, step: DpFedAvgStep) -> S:
    """`after` with the round counted in the privacy step's memory, where the chain (which
    counts the rounds it runs, and sets the round's metrics) did not run this round: the
    prototypes were released anyway."""
    old = int(before.aggregation.get(NAME, {}).get("rounds", 0))
    memory: dict[str, Any] = dict(after.aggregation.get(NAME, {}))
    if int(memory.get("rounds", 0)) > old:
        return after
    memory.update(rounds=old + 1, noise_multiplier=step.plan.noise_multiplier)
    return dataclasses.replace(after, aggregation={**after.aggregation, NAME: memory, "metrics": {}})


def private_prototypes(
    before: ServerState,
    after: S,
    means: Sequence[torch.Tensor],
    counts: Sequence[torch.Tensor],
    step: DpFedAvgStep,
    ctx: ServerContext | None,
) -> tuple[S, torch.Tensor | None, torch.Tensor | None]:
    """A prototype method's round under privacy: `after` (the chain's state) with the round
    counted and the release's noise in its metrics (`server/dp_fedavg/prototype_sum_std`,
    `holder_count_std`), and the noised class means and holder counts of the clients' `means`
    and `counts` (None, None without any)."""
    after = count_round(before, after, step)
    if not means:
        return after, None, None
    protos, held = private_class_means(means, counts, step, ctx)
    sigma, clip = step.plan.update_noise_multiplier, step.plan.clip
    metrics = {
        **after.aggregation.get("metrics", {}),
        f"{NAME}/prototype_sum_std": sigma * clip,
        f"{NAME}/holder_count_std": sigma * math.sqrt(len(held)),
    }
    return dataclasses.replace(after, aggregation={**after.aggregation, "metrics": metrics}), protos, held
