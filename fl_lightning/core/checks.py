"""Range checks of a method's hyperparameters, for its `check` (before torch or any data loads):
an absurd value (a negative temperature, a probability above 1) is one ConfigError line
naming `method.<key>`, not a traceback or a silently meaningless run."""

from __future__ import annotations

from typing import Any

from .errors import ConfigError


def positive(config: Any, *keys: str) -> None:
    """Each of `keys` (unset: None, skipped) must be > 0."""
    for key in keys:
        value = getattr(config, key)
        if value is not None and not value > 0:
            raise ConfigError(f"method.{key} must be > 0 (got {value})")


def nonnegative(config: Any, *keys: str) -> None:
    """Each of `keys` (unset: None, skipped) must be >= 0."""
    for key in keys:
        value = getattr(config, key)
        if value is not None and not value >= 0:
            raise ConfigError(f"method.{key} must be >= 0 (got {value})")


def within(
    config: Any, key: str, lo: float, hi: float, *, open_lo: bool = False, open_hi: bool = False
) -> None:
    """`key` (unset: None, skipped) must lie between `lo` and `hi`, each end closed unless opened."""
    value = getattr(config, key)
    if value is None:
        return
    above = value > lo if open_lo else value >= lo
    below = value < hi if open_hi else value <= hi
    if not (above and below):
        span = f"{'(' if open_lo else '['}{lo:g}, {hi:g}{')' if open_hi else ']'}"
        raise ConfigError(f"method.{key} must be in {span} (got {value})")


#: the class targets' controls of the text-using methods (`text/targets.py` builds them)
TARGETS = ("text", "permuted", "orthogonal", "uniform", "centred")
#: the oracle targets (`text/oracle.py`: class means of held-out inputs), FedGLCL's only so far
ORACLE_TARGETS = ("oracle", "oracle_permuted", "oracle_permuted_within", "oracle_half")
#: controls inside coarse groups (`text/targets.py`, E4's missing ones): the text deranged within
#: each group, and a table with the text's group structure and nothing inside a group; FedLGT's
GROUP_TARGETS = ("permuted_within", "group_only")


def check_targets(kind: str, key: str = "method.targets", extra: tuple[str, ...] = ()) -> None:
    """A bad value: one ConfigError line naming the key and the choices (`TARGETS` + `extra`,
    the kinds only some methods build)."""
    if kind not in TARGETS + extra:
        raise ConfigError(f"{key}={kind!r} is not one of: {', '.join(TARGETS + extra)}")


def one_of(config: Any, key: str, choices: tuple[str, ...]) -> None:
    """`key` must be one of `choices`."""
    value = getattr(config, key)
    if value not in choices:
        raise ConfigError(f"method.{key}={value!r} is not one of: {', '.join(choices)}")
