"""The clients' hardware on a virtual clock (`system=`, docs/async.md): how long each update
takes and who is online. Nothing here is timed: durations are drawn from (seed, client, the
update's dispatch key) alone, so the order of arrivals, and so every number of the run, is the
same on every executor and after a resume (FLSim's duration distributions, FedScale's traces).

A client's update takes `work × seconds_per_example × speed[c] × noise`: `work` is the examples
its fit sees (examples × epochs, or steps × batch size, as the host trains), `speed[c]` a factor
drawn once per run (tiers, log-normal) and `noise` a factor of mean 1 drawn per update
(constant, half-normal, exponential). With `speed=trace` a file gives each client's duration of
one update instead of work × seconds_per_example × speed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from ..core.types import ClientId

_SPEED, _NOISE, _ONLINE = 0x5BEED, 0xD0CE, 0x0471


@dataclass(frozen=True)
class SystemModel:
    """Durations and availability of a run's clients (module docstring)."""

    seed: int
    base: np.ndarray  # each client's noiseless duration of one update, seconds
    noise: str = "constant"
    availability: str = "always"
    online_fraction: float = 1.0

    @property
    def timeless(self) -> bool:
        """Every update takes no time (today's synchronous rounds)."""
        return not bool(np.any(self.base > 0))

    def duration(self, client_id: ClientId, key: int) -> float:
        """Seconds of the update of `client_id` dispatched under `key` (its round, or its
        dispatch number in an asynchronous run)."""
        base = float(self.base[client_id])
        if base == 0.0 or self.noise == "constant":
            return base
        rng = np.random.default_rng([self.seed, key, client_id, _NOISE])
        if self.noise == "half_normal":  # |N(0,1)| has mean sqrt(2/pi)
            return base * abs(float(rng.standard_normal())) * math.sqrt(math.pi / 2)
        return base * float(rng.exponential(1.0))

    def online(self, key: int) -> np.ndarray:
        """Which clients are online at `key` (a boolean per client)."""
        n = len(self.base)
        if self.availability == "always":
            return np.ones(n, dtype=bool)
        return np.random.default_rng([self.seed, key, _ONLINE]).random(n) < self.online_fraction


def speeds(cfg: Any, num_clients: int) -> np.ndarray:
    """Each client's speed factor, drawn once per run from the seed (`system.speed`)."""
    s, rng = cfg.system, np.random.default_rng([int(cfg.seed), _SPEED])
    if s.speed == "tiers":
        return np.asarray(s.tiers, dtype=np.float64)[rng.integers(0, len(s.tiers), size=num_clients)]
    if s.speed == "lognormal":
        return np.exp(float(s.sigma) * rng.standard_normal(num_clients))
    return np.ones(num_clients)


def read_trace(path: str, num_clients: int) -> np.ndarray:
    """Per-client durations of one update (seconds, one a line; `#` comments), for
    `system.speed=trace`; ConfigError for a file that does not give one for every client."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"system.trace: cannot read {path}: {e.strerror}") from None
    try:
        values = [float(ln.split("#")[0]) for ln in lines if ln.split("#")[0].strip()]
    except ValueError:
        raise ConfigError(f"system.trace: {path} must hold one duration in seconds a line") from None
    if len(values) < num_clients or any(not math.isfinite(v) or v < 0 for v in values):
        raise ConfigError(
            f"system.trace: {path} gives {len(values)} durations (finite, >= 0); "
            f"the run has {num_clients} clients"
        )
    return np.asarray(values[:num_clients], dtype=np.float64)


def system_model(cfg: Any, work: Sequence[int]) -> SystemModel:
    """The run's system model; `work`: each client's examples seen per update."""
    s, n = cfg.system, len(work)
    if s.speed == "trace":
        base = read_trace(str(s.trace), n)
    else:
        base = np.asarray(work, dtype=np.float64) * float(s.seconds_per_example) * speeds(cfg, n)
    return SystemModel(int(cfg.seed), base, str(s.noise), str(s.availability), float(s.online))
