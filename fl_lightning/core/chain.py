"""The aggregation chain's names and the checks on a chain, torch-free (the config's checks
run before torch is imported). The steps themselves are in `core/aggregation.py`."""

from __future__ import annotations

from collections.abc import Sequence

from .errors import ConfigError

#: every registered step's name: the built-in ones, and those `register_step` adds (a step of
#: another package registers when its module is imported, as a method does)
STEP_NAMES: set[str] = {"clip_l2", "uniform", "gaussian"}


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
    if "gaussian" in names:
        before = names[: names.index("gaussian")]
        missing = [n for n in ("clip_l2", "uniform") if n not in before]
        if missing:
            raise ConfigError(
                f"aggregator.steps: gaussian noise of std σ·C/m needs {' and '.join(missing)} before it "
                f"(each update clipped to C and weighted 1), e.g. aggregator.steps=[clip_l2,uniform,gaussian]"
            )
