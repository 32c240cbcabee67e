"""`Sampling`: how a run draws its clients beyond `clients_per_round`, one frozen value the
strategy receives at construction (the run config's `fl.fraction_range`, `fl.sampling` and
`fl.bn_stats`, decided by `runtime/build.py`), instead of attributes set after it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """Attributes:
    participation: (fewest, most) clients per round, drawn each round (`fl.fraction_range`);
        None: always `clients_per_round`.
    weights: each client's probability of being drawn (`fl.sampling=size`: its share of the
        training examples); None: uniform.
    local_bn: each client keeps its own batch-norm statistics (`fl.bn_stats=local`), so there
        is no one global model: evaluated as a personalised method is.
    poisson_rate: each client's own probability of joining a round (`fl.sampling=poisson`:
        the cohort's size varies, as the add/remove-one privacy accountants assume); None: a
        fixed number.
    """

    participation: tuple[int, int] | None = None
    weights: tuple[float, ...] | None = None
    local_bn: bool = False
    poisson_rate: float | None = None
