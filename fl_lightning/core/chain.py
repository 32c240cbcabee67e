"""The aggregation chain's names and the checks on a chain, torch-free (the config's checks
run before torch is imported). The steps themselves are in `core/aggregation.py`."""

from __future__ import annotations

from collections.abc import Sequence

from .errors import ConfigError

#: every registered step's name: the built-in ones, and those `register_step` adds (a step of
#: another package registers when its module is imported, as a method does)
STEP_NAMES: set[str] = {"clip_l2", "uniform", "gaussian", "secagg_plus", "distributed_gaussian"}

#: steps whose `one` hook reads each update: under secure aggregation they run on the client,
#: so they must come before `secagg_plus`
PER_UPDATE_STEPS = ("clip_l2", "uniform", "distributed_gaussian")


def check_chain(names: Sequence[str]) -> None:
    """ConfigError for a chain that names an unknown step, repeats one, or adds noise whose
    scale would be wrong (σ·C/m needs clipped, uniformly weighted updates before it)."""
    names = list(names)
    for n in names:
        if n not in STEP_NAMES:
            raise ConfigError(
                f"aggregator.steps: unknown step {n!r} (known: {', '.join(sorted(STEP_NAMES))})"
            )
    if len(set(names)) != len(names):
        raise ConfigError(f"aggregator.steps names a step twice: {names}")
    for noise in ("gaussian", "distributed_gaussian"):
        if noise not in names:
            continue
        before = names[: names.index(noise)]
        missing = [n for n in ("clip_l2", "uniform") if n not in before]
        example = noise if noise == "gaussian" else f"{noise},secagg_plus"
        if missing:
            raise ConfigError(
                f"aggregator.steps: {noise} noise of std σ·C/m needs {' and '.join(missing)} before it "
                f"(each update clipped to C and weighted 1), e.g. "
                f"aggregator.steps=[clip_l2,uniform,{example}]"
            )
    if "distributed_gaussian" in names and "secagg_plus" not in names[names.index("distributed_gaussian") :]:
        raise ConfigError(
            "aggregator.steps: distributed_gaussian is each client's share of a secure sum's noise: "
            "secagg_plus must come after it, e.g. [clip_l2,uniform,distributed_gaussian,secagg_plus] "
            "(central noise without secure aggregation is `gaussian`)"
        )
    if "secagg_plus" in names:
        after = names[names.index("secagg_plus") + 1 :]
        for n in after:
            if n in PER_UPDATE_STEPS:
                raise ConfigError(
                    f"aggregator.steps: {n} after secagg_plus would read each client's update, which the "
                    f"server never sees: put it before secagg_plus (each client applies it to its own)"
                )
