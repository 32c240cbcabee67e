"""The clients' hardware on a virtual clock (`system=`, docs/async.md): how long each update
takes and who is online. Nothing here is timed: durations are drawn from (seed, client, the
update's dispatch key) alone, so the order of arrivals, and so every number of the run, is the
same on every executor and after a resume (FLSim's duration distributions, FedScale's traces).

A client's update takes `work × seconds_per_example × speed[c] × noise`: `work` is the examples
its fit sees (examples × epochs, or steps × batch size, as the host trains), `speed[c]` a factor
drawn once per run (tiers, log-normal) and `noise` a factor of mean 1 drawn per update
(constant, half-normal, exponential). With `speed=trace` a file gives each client's duration of
one update instead of work × seconds_per_example × speed.

`system.clock=wall` (the scheduler's `Arrivals`) measures the durations instead, on Ray, and
writes each arrival to the run's `arrivals.jsonl`; `system.replay=<that file>` gives a virtual
run those arrivals (`SystemModel.recorded`), so a wall-clock run can be repeated on the virtual
clock, bit for bit, on any executor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ClientFailure, ConfigError
from ..core.safe_json import UnsafeInput, loads, read_text
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
    #: `system.replay`: (dispatch key, client) -> (start, arrival) of a wall-clock run
    recorded: Mapping[tuple[int, ClientId], tuple[float, float]] | None = field(default=None, compare=False)

    @property
    def timeless(self) -> bool:
        """Every update takes no time (today's synchronous rounds)."""
        return self.recorded is None and not bool(np.any(self.base > 0))

    def dated(self, client_id: ClientId, key: int, start: float) -> tuple[float, float]:
        """(start, arrival) of the update of `client_id` dispatched under `key` when the clock
        reads `start`. Replayed: the recorded pair, exactly (a wall-clock run dispatches a little
        after its clock's last arrival, which is the replay's clock then: a recorded start before
        it is another run); an update the recording never received arrives at +inf (after the
        replay's end)."""
        if self.recorded is None:
            return start, start + self.duration(client_id, key)
        got = self.recorded.get((key, client_id))
        if got is None:
            return start, math.inf
        if got[0] < start:
            raise ClientFailure(
                f"system.replay: client {client_id} (dispatch {key}) started at {got[0]!r} in the recording, "
                f"before this run's clock ({start!r}): this run is not the recorded one (another seed, "
                "mode or setting?)"
            )
        return got

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
    recorded = read_arrivals(str(s.replay)) if s.replay else None
    return SystemModel(int(cfg.seed), base, str(s.noise), str(s.availability), float(s.online), recorded)


#: `arrivals.jsonl`: a few dozen bytes an arrival; this bounds what a replay reads
MAX_ARRIVALS_BYTES = 256 << 20


def read_arrivals(path: str) -> dict[tuple[int, ClientId], tuple[float, float]]:
    """A wall-clock run's `arrivals.jsonl` (one object an arrival: round, key, client, start,
    arrival; a torn last line is skipped), for `system.replay`; ConfigError for a file that
    cannot be read or holds none."""
    try:
        text = read_text(Path(path), MAX_ARRIVALS_BYTES)
    except (OSError, UnsafeInput) as e:
        raise ConfigError(f"system.replay: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    out: dict[tuple[int, ClientId], tuple[float, float]] = {}
    for line in text.splitlines():
        try:
            rec = loads(line)
            key, client, start, arrival = int(rec["key"]), int(rec["client"]), rec["start"], rec["arrival"]
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line (the run was killed while writing it)
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (start, arrival)):
            continue
        out[(key, client)] = (float(start), float(arrival))
    if not out:
        raise ConfigError(f"system.replay: {path} holds no arrivals (a wall-clock run's arrivals.jsonl)")
    return out
