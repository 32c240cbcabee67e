"""The scheduler: which clients train from which model version, and in which order their
updates reach the server, on a virtual clock (`system.py`). `run_rounds` asks it for each
server step's updates, aggregates them, and tells it the step is done.

- `Synchronous`: a round is "all of a cohort, then step" (today's rounds). With a system model
  each update arrives at the round's start plus its duration; `system.deadline` drops the
  updates that arrive later, `system.over_select` keeps the first K of a larger cohort (ties
  by client id). Without one (the default) it is today's loop, number for number.
- `Buffered`: FedBuff (Nguyen et al., AISTATS'22) and FedAsync (Xie et al. 2019, K = 1). M
  clients are in flight at all times, each started from the model version current when it was
  dispatched; updates are consumed in order of virtual arrival time, ties by client id, never
  by which worker answers first; the server steps when K are buffered. An update's staleness
  (versions since its start) weights it through the chain's `staleness` step
  (`core/staleness.py`); staler than `system.max_staleness` is dropped and counted.

Both modes date and take their updates through one `Arrivals`: on the virtual clock an update
arrives at its start plus its modelled duration (or the recorded one, `system.replay`);
with `system.clock=wall` (Ray) in the order the workers finish, on the run's wall clock, each
arrival written to `arrivals.jsonl` so that the run can be replayed on the virtual clock.

The in-flight work is part of `ServerState.schedule` (each job's client, version, dispatch
key, dispatch time, arrival time and payload, and the broadcast of every version a job
started from), so a checkpoint holds it and a resumed run submits the same jobs again: on the
virtual clock the same updates arrive in the same order as in the uninterrupted run (on the
wall clock they train again and arrive when they do). Ray trains the jobs in flight while the
server steps; the serial executor trains each one when it is submitted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from ..core.errors import ClientFailure
from ..core.files import open_new
from ..core.messages import Broadcast, ClientPayload, ClientUpdate, RoundPlan, ServerState
from ..core.strategy import Strategy
from ..core.types import ClientId, ClientState, StateDict
from ..tracking.loggers import read_jsonl
from .executor import Executor
from .host import fit_batches
from .system import SystemModel, system_model

if TYPE_CHECKING:
    from .build import Prepared

_PICK = 0xA5


@dataclass
class Collected:
    """One server step's input, as the scheduler decided it."""

    plan: RoundPlan  # what was dispatched for it (bytes down, the clients' evaluation)
    updates: list[ClientUpdate]  # to aggregate, client-id order
    staleness: dict[ClientId, int] = field(default_factory=dict)
    system: dict[str, float] = field(default_factory=dict)  # `system/<k>` of the round's line
    #: every client whose fit ended for this step, kept or dropped (their resident state changed:
    #: the checkpoint collects it); None: those of `updates`
    trained: list[ClientId] | None = None
    #: the resident state of each client whose fit ended, taken as its update was (asynchronous
    #: modes: by the next checkpoint the client may be in flight again, its state moving on)
    states: list[tuple[ClientId, ClientState]] | None = None
    #: how many of `updates` had staleness 0, 1, 2, ... (asynchronous modes; empty otherwise)
    staleness_hist: list[int] = field(default_factory=list)


class Scheduler(Protocol):
    def collect(
        self,
        state: ServerState,
        rnd: int,
        executor: Executor,
        configure: Callable[[ServerState, int], RoundPlan],
    ) -> Collected:
        """Round `rnd`'s updates; `configure` is the round's plan as the loop makes it (sampling,
        payloads, `eval.timing=trained`), for a scheduler that trains a cohort."""
        ...

    def stepped(self, state: ServerState, rnd: int) -> ServerState:
        """The state after the server's step `rnd`, its `schedule` brought up to date."""
        ...


def virtual_time(state: ServerState) -> float:
    return float(state.schedule.get("time", 0.0))


@dataclass
class Job:
    """A client in flight: the version it started from, when, and when its update arrives (on
    the wall clock: when it did, once it has; until then its start)."""

    client_id: ClientId
    version: int
    start: float
    arrival: float
    payload: ClientPayload
    key: int = 0  # its duration's key: its dispatch number (asynchronous modes) or its round

    def order(self) -> tuple[float, ClientId]:
        return (self.arrival, self.client_id)


#: the wall clock's arrivals are at least this far apart (seconds), in the order the server
#: took them: a replay, which orders by (arrival, client id), then takes them in the same order
#: whatever the rounding of a sum of clock readings
_TICK = 1e-6


class Arrivals:
    """When each update reaches the server, and which the server takes next: the one place both
    modes dispatch and take clients (module docstring).

    - virtual clock: an update's arrival is decided at its dispatch, its start plus its
      modelled duration (`SystemModel.dated`); the next one taken is the least (arrival, client
      id) of those in flight, never the first a worker returns;
    - wall clock (`wall`): the next one taken is the first whose fit is done (`Executor.first`:
      `ray.wait`), arriving now on the run's wall clock (seconds since the run began, continued
      from a checkpoint's clock on resume), `_TICK` after the previous arrival at least; every
      arrival is appended to `log` (`arrivals.jsonl`: round, key, client, start, arrival), the
      lines of the steps after a checkpoint dropped on resume.
    """

    def __init__(self, system: SystemModel, wall: bool = False, log: Path | None = None) -> None:
        self.system, self.wall, self.log = system, wall, log
        self.handles: dict[ClientId, Any] = {}
        self._base, self._offset, self._last = 0.0, 0.0, -math.inf

    def begin(self, state: ServerState) -> None:
        """The clock from `state`'s (a new run's 0, a checkpoint's on resume); the log as far as
        `state`'s step."""
        self._offset, self._base = virtual_time(state), time.perf_counter()
        self._last = self._offset
        if self.log is not None and (self.log.exists() or self.log.is_symlink()):
            kept = [r for r in read_jsonl(self.log) if int(r["round"]) <= state.round]
            tmp = self.log.with_suffix(".tmp")
            with open_new(tmp) as f:  # not through a link planted under this name
                f.write("".join(json.dumps(r) + "\n" for r in kept).encode())
            tmp.replace(self.log)

    def now(self) -> float:
        """The clock's reading (wall: seconds since `begin`, from `state`'s clock)."""
        return self._offset + (time.perf_counter() - self._base)

    def start(self, clock: float) -> float:
        """When a dispatch made now starts: `clock` (the scheduler's virtual clock), or on the
        wall clock now (never before the last arrival)."""
        return max(self.now(), self._last) if self.wall else clock

    def dated(self, client_id: ClientId, key: int, start: float) -> tuple[float, float]:
        """(start, arrival) of an update dispatched now (wall clock: the arrival is its start
        until it arrives)."""
        return (start, start) if self.wall else self.system.dated(client_id, key, start)

    def dispatch(self, executor: Executor, broadcast: Broadcast, job: Job) -> None:
        """Submit `job`'s fit from `broadcast` (its handle kept for `take`)."""
        self.handles[job.client_id] = executor.submit(broadcast, job.payload)

    def take(self, jobs: list[Job], executor: Executor, rnd: int) -> tuple[Job, ClientUpdate]:
        """The next job of `jobs` to arrive and its update (the job leaves `jobs`)."""
        if self.wall:
            job = jobs[executor.first([self.handles[j.client_id] for j in jobs])]
        else:
            job = min(jobs, key=Job.order)
            if math.isinf(job.arrival):
                raise ClientFailure(
                    f"system.replay: client {job.client_id} (dispatch {job.key}) never arrived in the "
                    "recorded run: this replay goes beyond it (fewer fl.rounds), or is another run"
                )
        jobs.remove(job)
        update = executor.take(self.handles.pop(job.client_id))
        if self.wall:
            job.arrival = self.arrived(rnd, job.key, job.client_id, job.start)
        return job, update

    def arrived(self, rnd: int, key: int, client_id: ClientId, start: float) -> float:
        """Wall clock: an update taken now, for step `rnd`: its arrival, logged."""
        arrival = max(self.now(), self._last + _TICK)
        self._last = arrival
        if self.log is not None:
            rec = {"round": rnd, "key": key, "client": int(client_id), "start": start, "arrival": arrival}
            with open(self.log, "a") as f:
                f.write(json.dumps(rec) + "\n")
        return arrival


class Synchronous:
    """All of a cohort, then step (module docstring). `arrivals`: how the round's updates are
    dated (default: the system model's virtual clock); None with no system model."""

    def __init__(
        self,
        system: SystemModel | None = None,
        keep: int | None = None,
        deadline: float | None = None,
        arrivals: Arrivals | None = None,
    ) -> None:
        self.system, self.keep, self.deadline = system, keep, deadline
        self.arrivals = arrivals if arrivals is not None or system is None else Arrivals(system)
        self._end = 0.0
        self._begun = False

    @property
    def timeless(self) -> bool:
        """Today's loop: no clock (every update takes no time, none recorded or measured)."""
        return self.arrivals is None or (self.arrivals.system.timeless and not self.arrivals.wall)

    @property
    def takes_every_update(self) -> bool:
        """Every update of the cohort goes to the server, in client-id order (no deadline,
        no over-selection, no clock, virtual or wall): the driver may sum them as they arrive."""
        return self.timeless and self.keep is None and self.deadline is None

    def collect(
        self,
        state: ServerState,
        rnd: int,
        executor: Executor,
        configure: Callable[[ServerState, int], RoundPlan],
    ) -> Collected:
        clock = self.arrivals
        if clock is not None and not self._begun:
            clock.begin(state)
            self._begun = True
        plan = configure(state, rnd)
        t0 = virtual_time(state) if clock is None else clock.start(virtual_time(state))
        wall = clock is not None and clock.wall
        # in completion order: the wall clock dates each update as it comes
        if clock is not None and clock.wall:
            got = [(u, clock.arrived(rnd, rnd, u.client_id, t0)) for u in executor.fit(plan)]
        else:
            got = [(u, t0) for u in executor.fit(plan)]
        # sorted, so the sums do not depend on the completion order
        updates = sorted((u for u, _ in got), key=lambda u: u.client_id)
        self._end = virtual_time(state)
        if clock is None or (self.timeless and self.keep is None and self.deadline is None):
            return Collected(plan, updates)
        if wall:
            when = {u.client_id: (t0, a) for u, a in got}
        else:
            when = {u.client_id: clock.dated(u.client_id, rnd, t0) for u in updates}
        start = min((w[0] for w in when.values()), default=t0)  # a replay's: the recorded round's
        order = sorted(updates, key=lambda u: (when[u.client_id][1], u.client_id))
        kept = order[: self.keep] if self.keep is not None else order
        over = len(order) - len(kept)
        # a replayed update the recording never received (its client failed there) is late
        deadline = math.inf if self.deadline is None else self.deadline
        late = [u for u in kept if not when[u.client_id][1] - start <= deadline]
        kept = [u for u in kept if u not in late]
        if not kept:
            first = min(w[1] for w in when.values()) - start
            raise ClientFailure(
                f"round {rnd}: every update arrived after system.deadline={self.deadline} "
                f"(the first after {first:.6g} s)"
            )
        end = max(when[u.client_id][1] for u in kept)
        if late and self.deadline is not None:  # the server waited until the deadline
            end = start + self.deadline
        self._end = end
        metrics = {"dropped_late": float(len(late)), "dropped_over_selected": float(over)}
        trained = [u.client_id for u in updates]
        return Collected(plan, sorted(kept, key=lambda u: u.client_id), {}, metrics, trained)

    def stepped(self, state: ServerState, rnd: int) -> ServerState:
        if self.timeless:
            return state  # today's state: nothing scheduled, no clock
        return dataclasses.replace(state, schedule={"time": self._end, "version": rnd})


class Buffered:
    """FedBuff and FedAsync (module docstring). `rebase`: FedBuff's update is the client's delta
    from the version it started from, applied to the current model; FedAsync mixes the client's
    model into the current one (its delta from the current model)."""

    def __init__(
        self,
        strategy: Strategy[Any, Any, Any],
        system: SystemModel,
        seed: int,
        concurrency: int,
        buffer: int,
        max_staleness: int | None = None,
        rebase: bool = True,
        arrivals: Arrivals | None = None,
    ) -> None:
        self.strategy, self.system, self.seed = strategy, system, seed
        self.concurrency, self.buffer = concurrency, buffer
        self.max_staleness, self.rebase = max_staleness, rebase
        self.arrivals = arrivals if arrivals is not None else Arrivals(system)
        self.jobs: list[Job] = []
        self.broadcasts: dict[int, Broadcast] = {}
        self.time, self.version, self.dispatched, self.dropped_stale = 0.0, 0, 0, 0
        self._loaded = False

    # --- state ------------------------------------------------------------------------
    def _load(self, state: ServerState, executor: Executor) -> None:
        """The schedule of `state` (a resumed run's jobs in flight: submitted again)."""
        s = state.schedule
        self.time, self.version = float(s.get("time", 0.0)), int(s.get("version", state.round))
        self.dispatched, self.dropped_stale = int(s.get("dispatched", 0)), int(s.get("dropped_stale", 0))
        self.broadcasts = dict(s.get("broadcasts", {}))
        self.jobs = [Job(**j) for j in s.get("jobs", [])]
        self.arrivals.begin(state)
        for job in self.jobs:  # in dispatch order, as they were first submitted
            self.arrivals.dispatch(executor, self.broadcasts[job.version], job)
        self._loaded = True

    def stepped(self, state: ServerState, rnd: int) -> ServerState:
        self.version = rnd
        used = {j.version for j in self.jobs}
        self.broadcasts = {v: b for v, b in self.broadcasts.items() if v in used}
        schedule = {
            "time": self.time,
            "version": self.version,
            "dispatched": self.dispatched,
            "dropped_stale": self.dropped_stale,
            "jobs": [dataclasses.asdict(j) | {"payload": j.payload} for j in self.jobs],
            "broadcasts": dict(self.broadcasts),
        }
        return dataclasses.replace(state, schedule=schedule)

    # --- dispatch ---------------------------------------------------------------------
    def _pick(self, busy: set[ClientId]) -> ClientId:
        """A free client, uniformly among those online, from (seed, dispatch number) alone."""
        n = self.strategy.num_clients
        free = np.ones(n, dtype=bool)
        free[list(busy)] = False
        for j in range(1000):  # nobody free online: the next draw of who is online
            ok = free & self.system.online(self.dispatched * 1000 + j)
            if ok.any():
                rng = np.random.default_rng([self.seed, self.dispatched, _PICK])
                return int(rng.choice(np.flatnonzero(ok)))
        online = self.system.online_fraction
        raise ClientFailure(f"no client free and online to dispatch (system.online={online})")

    def _fill(self, state: ServerState, rnd: int, executor: Executor, buffered: set[ClientId]) -> None:
        """Dispatch clients until M are in flight, from the current version."""
        while len(self.jobs) < self.concurrency:
            busy = {j.client_id for j in self.jobs} | buffered
            if len(busy) >= self.strategy.num_clients:
                break
            cid = self._pick(busy)
            if self.version not in self.broadcasts:
                self.broadcasts[self.version] = self.strategy.broadcast(state, rnd)
            payload = self.strategy.payload(state, rnd, cid)
            key = self.dispatched
            self.dispatched += 1
            start, arrival = self.arrivals.dated(cid, key, self.arrivals.start(self.time))
            job = Job(cid, self.version, start, arrival, payload, key)
            self.jobs.append(job)
            self.arrivals.dispatch(executor, self.broadcasts[self.version], job)

    def collect(
        self,
        state: ServerState,
        rnd: int,
        executor: Executor,
        configure: Callable[[ServerState, int], RoundPlan],
    ) -> Collected:
        if not self._loaded:
            self._load(state, executor)
        kept: list[tuple[Job, ClientUpdate]] = []
        dropped, in_flight, trained = 0, [], []
        states: list[tuple[ClientId, ClientState]] = []
        while len(kept) < self.buffer:
            self._fill(state, rnd, executor, {j.client_id for j, _ in kept})
            if not self.jobs:
                raise ClientFailure("no client in flight (fewer clients than system.buffer?)")
            in_flight.append(len(self.jobs))
            job, update = self.arrivals.take(self.jobs, executor, rnd)
            trained.append(job.client_id)
            # its state now: no other fit of this client is queued yet (it is dispatched again
            # only later), on any executor
            states += [(c, st) for c, st in executor.collect_states([job.client_id]) if st]
            self.time = job.arrival
            tau = self.version - job.version
            if self.max_staleness is not None and tau > self.max_staleness:
                dropped += 1
                continue
            kept.append((job, update))
        self.dropped_stale += dropped
        staleness = {j.client_id: self.version - j.version for j, _ in kept}
        current = self.broadcasts.get(self.version)
        updates = sorted((self._rebased(j, u, state) for j, u in kept), key=lambda u: u.client_id)
        taus = np.asarray(list(staleness.values()), dtype=np.int64)
        plan = RoundPlan(
            rnd,
            current if current is not None else self.strategy.broadcast(state, rnd),
            [j.payload for j, _ in sorted(kept, key=lambda k: k[0].client_id)],
        )
        metrics = {
            "staleness_mean": float(taus.mean()),
            "staleness_max": float(taus.max()),
            "dropped_stale": float(dropped),
            "dropped_stale_total": float(self.dropped_stale),
            "in_flight": float(np.mean(in_flight)),
            "version": float(self.version + 1),
        }
        hist = [int(c) for c in np.bincount(taus)]
        return Collected(plan, updates, staleness, metrics, trained, states, hist)

    def _rebased(self, job: Job, update: ClientUpdate, state: ServerState) -> ClientUpdate:
        """FedBuff: a stale update as the current model plus its delta from where it started
        (the chain's deltas from the current model are then the client's own); a fresh one as
        it is, bit for bit."""
        if not self.rebase or job.version == self.version or update.params is None:
            return update
        start: StateDict | None = self.broadcasts[job.version].global_params
        now: StateDict | None = state.global_params
        if start is None or now is None:
            return update
        params = {
            k: (now[k].to(torch.float64) + (v.to(torch.float64) - start[k].to(torch.float64))).to(v.dtype)
            if v.is_floating_point()
            else v
            for k, v in update.params.items()
        }
        return dataclasses.replace(update, params=params)


def client_work(prep: Prepared) -> list[int]:
    """Each client's examples seen per update (every phase, as the host trains them)."""
    from .plan import phase_lengths

    spec = prep.spec
    phases = phase_lengths(prep.objective, spec.local_epochs, spec.local_steps)
    return [
        sum(sum(fit_batches(len(t), spec.batch_size, e, st)) for e, st in phases) for t in prep.split.train
    ]


def scheduler_for(prep: Prepared, run_dir: Path | None = None) -> Scheduler:
    """The run's scheduler (`system=`): synchronous rounds unless `system.mode` says otherwise;
    `system.clock=wall` logs its arrivals to `<run_dir>/arrivals.jsonl`."""
    cfg = prep.cfg
    s = cfg.system
    system = system_model(cfg, client_work(prep))
    wall = s.clock == "wall"
    arrivals = Arrivals(system, wall, run_dir / "arrivals.jsonl" if wall and run_dir is not None else None)
    if s.mode == "sync":
        from ..config import clients_per_round

        keep = clients_per_round(cfg) if s.over_select != 1.0 else None
        deadline = None if s.deadline is None else float(s.deadline)
        return Synchronous(system, keep, deadline, arrivals)
    buffer = 1 if s.mode == "fedasync" else int(s.buffer)
    max_stale = None if s.max_staleness is None else int(s.max_staleness)
    rebase = s.mode == "fedbuff"
    return Buffered(
        prep.strategy, system, int(cfg.seed), int(s.concurrency), buffer, max_stale, rebase, arrivals
    )
