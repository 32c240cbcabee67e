"""`RayExecutor`: clients live in Ray actors that keep their data shards resident.

Per round the broadcast is `ray.put` once and each sampled client's payload goes to the
actor hosting it; results come back in completion order (`ray.wait`). A client whose
task raises, or whose actor dies, is retried once on a fresh actor, then dropped for the
round if `max_client_failures` allows, else the run stops with the client id and cause.
Clients' resident state lives in the actor that hosts them (sticky placement); an actor
that is restarted gets its clients' state back from `restore` (the last checkpoint).

GPU actors are created inside a placement group (one bundle per GPU, see `placement.py`):
the group is reserved atomically, so a request the cluster cannot meet ends with a
clear error after `schedule_timeout_s` instead of a half-started run that waits forever.
Ray sets CUDA_VISIBLE_DEVICES for each actor to the GPU it was given, so the Lightning
Trainer's `devices=1` trains on exactly that GPU.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError, RayTaskError

from ..core.errors import ClientFailure
from ..core.messages import Broadcast, ClientPayload, RoundPlan
from ..core.types import ClientId, ClientState
from ..data.registry import ArrayDataset
from .host import ClientSpec
from .placement import Placement
from .signals import held
from .workers import Idle, WorkerSource, new_worker

log = logging.getLogger(__name__)
#: seconds the client workers may take to start and set up before the run says what Ray has
#: free (it still waits: an autoscaling cluster adds nodes; on a fixed one, something holds them)
STARTUP_WARN_S = 120.0
_WINDOW = 4  # tasks in flight per actor (see `RayExecutor._run`)
_BROADCASTS = 64  # model versions `submit` keeps put (clients in flight start from these)


class RayExecutor:
    def __init__(
        self,
        spec: ClientSpec,
        dataset: ArrayDataset,
        train: list[np.ndarray],
        test: list[np.ndarray],
        placement: Placement,
        max_client_failures: int = 0,
        restore: Callable[[list[ClientId]], Iterable[tuple[ClientId, ClientState]]] | None = None,
        source: WorkerSource | None = None,
    ) -> None:
        """Clients on `placement`'s workers, taken from `source` where it holds idle ones made
        for it (early, or warm from a sweep's previous run), else new; `restore`: the last
        checkpoint's state of some clients (for a restarted actor)."""
        self.placement = placement
        self.max_client_failures = max_client_failures
        self._spec = placement.place(spec)  # its hosts' threads and accelerator
        self._restore = restore
        self._source = source if source is not None else WorkerSource()
        self.failures: list[str] = []
        self.retries: list[str] = []
        idle = self._source.take(placement)
        handles, self.pg = idle.actors, idle.pg
        self._dataset_ref = ray.put(dataset)  # once; actors read it zero-copy
        self._train, self._test = train, test
        self._setup: dict[int, Any] = {}
        self._broadcasts: dict[int, tuple[Broadcast, Any]] = {}  # `submit`'s, by identity
        self.reused = 0 if idle.early else len(handles)
        self.prestarted = len(handles) if idle.early else 0
        self.actors: list[Any] = []
        try:
            for a in range(placement.num_actors):
                # held: a signal between a worker's creation and its place in `actors` would
                # leave it out of the clean-up below, alive (and its CPUs taken) until the
                # traceback that holds its handle is collected; held, it raises once it is in
                with held():
                    self.actors.append(self._start(a, handles[a] if a < len(handles) else None))
        except BaseException:  # Ctrl-C, SIGTERM: what started ends with the run (a shared Ray stays up)
            Idle([*self.actors, *handles[len(self.actors) :]], self.pg).end()
            raise

    def _start(self, actor: int, handle: Any = None) -> Any:
        """Actor `actor` (a new worker, or an idle one) set up with its clients."""
        clients = self.placement.clients_of(actor)
        if handle is None:  # on its bundle: the same GPU on a restart
            handle = new_worker(self.placement, self.pg, actor)
        self._setup[actor] = handle.setup.remote(  # actor tasks run in order: later calls see it
            self._spec,
            self._dataset_ref,
            {c: self._train[c] for c in clients},
            {c: self._test[c] for c in clients} if self._test else {},
        )
        return handle

    def ready(self) -> list[dict[str, Any]]:
        """Wait until every actor is up and set up; returns where each one runs."""
        try:
            wait_for_workers(list(self._setup.values()), STARTUP_WARN_S)
            ray.get(list(self._setup.values()))  # a failed setup names its own cause
            return ray.get([a.info.remote() for a in self.actors])
        except (RayTaskError, RayActorError) as e:
            self.close()  # its actors and placement group, also on a cluster we only joined
            raise ClientFailure(f"a client actor failed to start: {_cause(e)}") from None
        except BaseException:  # Ctrl-C, SIGTERM while they start: they end with the run
            self.close()
            raise

    def _actor_of(self, payload: ClientPayload) -> Any:
        return self.actors[self.placement.assignment[payload.client_id]]

    def _run(self, plan: RoundPlan, method: str) -> Iterator[Any]:
        bref = ray.put(plan.broadcast)
        # Each actor gets its clients in plan order, at most `_WINDOW` submitted at a time: the
        # driver holds O(actors) tasks, not one per client (10,000 at a client evaluation of
        # 10,000 clients cost ~260 MB and a quadratic `ray.wait`), and an actor always has its
        # next client queued. Results do not depend on the order (each client's own seed).
        # runtime.batched=k: a task is k of the actor's clients, trained together (`fit_many`).
        k = self._spec.batched if method == "fit" else 0
        mine: dict[int, list[ClientPayload]] = defaultdict(list)
        for p in plan.payloads:
            mine[self.placement.assignment[p.client_id]].append(p)
        size = k or 1
        queues = {a: deque(ps[i : i + size] for i in range(0, len(ps), size)) for a, ps in mine.items()}
        pending: dict[Any, tuple[list[ClientPayload], int, Any]] = {}

        def submit(unit: list[ClientPayload], tries: int) -> None:
            actor = self._actor_of(unit[0])
            ref = actor.fit_many.remote(bref, unit) if k else getattr(actor, method).remote(bref, unit[0])
            pending[ref] = (unit, tries, actor)

        def refill(index: int) -> None:
            if queues[index]:
                submit(queues[index].popleft(), 0)

        for index in list(queues):
            for _ in range(_WINDOW):
                refill(index)
        dropped = 0
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            ref = done[0]
            unit, tries, actor = pending.pop(ref)
            index = self.placement.assignment[unit[0].client_id]
            try:
                result = ray.get(ref)
            except (RayTaskError, RayActorError) as e:
                cause = _cause(e)
                if isinstance(e, RayActorError) and self.actors[index] is actor:
                    self._restart(index)  # once per dead actor
                ids = ", ".join(str(p.client_id) for p in unit)
                if tries == 0:
                    log.warning("client %s failed (%s); retrying once", ids, cause)
                    self.retries += [f"round {plan.round}: client {p.client_id}: {cause}" for p in unit]
                    submit(unit, 1)
                    continue
                dropped += len(unit)
                msgs = [f"round {plan.round}: client {p.client_id} failed: {cause}" for p in unit]
                self.failures += msgs
                if dropped > self.max_client_failures:
                    raise ClientFailure(
                        f"{msgs[0]} (fl.max_client_failures={self.max_client_failures})"
                    ) from None
                log.warning("round %d: client %s failed: %s; dropped for this round", plan.round, ids, cause)
                refill(index)
                continue
            refill(index)
            if k:
                yield from result
            else:
                yield result

    def _restart(self, index: int) -> None:
        """A fresh actor in place of a dead one, with its clients' state from the last
        checkpoint (what they had then; a client that trained since repeats from there)."""
        self.actors[index] = self._start(index)
        if self._restore is not None:
            for cid, st in self._restore(self.placement.clients_of(index)):
                ray.get(self.actors[index].set_states.remote({cid: st}))

    def collect_states(self, client_ids: Iterable[ClientId]) -> Iterator[tuple[ClientId, ClientState]]:
        """One client at a time, so the driver holds one client's state at most."""
        for cid in client_ids:
            actor = self.actors[self.placement.assignment[cid]]
            yield from ray.get(actor.get_states.remote([cid])).items()

    def restore_states(self, states: Iterable[tuple[ClientId, ClientState]]) -> None:
        for cid, st in states:
            ray.get(self.actors[self.placement.assignment[cid]].set_states.remote({cid: st}))

    def fit(self, plan: RoundPlan) -> Iterator[Any]:
        return self._run(plan, "fit")

    def submit(self, broadcast: Broadcast, payload: ClientPayload) -> Any:
        """One client's fit on the actor hosting it, from `broadcast` (put once per broadcast:
        the clients of one model version share it). The handle: (payload, broadcast, tries, ref, actor)."""
        key = id(broadcast)
        if key not in self._broadcasts or self._broadcasts[key][0] is not broadcast:
            self._broadcasts[key] = (broadcast, ray.put(broadcast))
            while len(self._broadcasts) > _BROADCASTS:  # the oldest versions no job starts from now
                del self._broadcasts[next(iter(self._broadcasts))]
        actor = self._actor_of(payload)
        return (payload, broadcast, 0, actor.fit.remote(self._broadcasts[key][1], payload), actor)

    def first(self, handles: Sequence[Any]) -> int:
        """The index of a submitted fit that is done (or failed: `take` retries it), waiting for
        the first of them to finish."""
        refs = [h[3] for h in handles]
        done, _ = ray.wait(refs, num_returns=1)
        return refs.index(done[0])

    def take(self, handle: Any) -> Any:
        """The update of a submitted fit; a failed one is retried once (on a fresh actor if its
        actor died), then the run stops with the client and cause (an asynchronous run has no
        round to drop a client from)."""
        payload, broadcast, tries, ref, actor = handle
        try:
            return ray.get(ref)
        except (RayTaskError, RayActorError) as e:
            cause = _cause(e)
            index = self.placement.assignment[payload.client_id]
            if isinstance(e, RayActorError) and self.actors[index] is actor:
                self._restart(index)  # once per dead actor (its other jobs in flight fail too)
            if tries:
                msg = f"round {payload.round}: client {payload.client_id} failed: {cause}"
                self.failures.append(msg)
                raise ClientFailure(msg) from None
            log.warning("client %s failed (%s); retrying once", payload.client_id, cause)
            self.retries.append(f"round {payload.round}: client {payload.client_id}: {cause}")
            again = self.submit(broadcast, payload)
            return self.take((payload, broadcast, 1, *again[3:]))

    def evaluate(self, plan: RoundPlan) -> Iterator[Any]:
        return self._run(plan, "evaluate")

    def bn_stats(self, plan: RoundPlan) -> Iterator[Any]:
        return self._run(plan, "bn_stats")

    def close(self, reuse: bool = False) -> None:
        """End the actors (and the placement group), or (`reuse`) keep them warm in the
        source, their clients dropped, for the next run."""
        idle, self.actors, self.pg = Idle(self.actors, self.pg), [], None
        if reuse:
            for a in idle.actors:
                a.release.remote()
            self._source.put(self.placement, idle)
        else:
            idle.end()


def wait_for_workers(refs: list[Any], warn_after: float) -> None:
    """Wait for every one of `refs` (the workers' setups); once, after `warn_after` s with some
    still pending, say how many and what Ray has free: a run that waits for workers Ray does
    not place says so instead of sitting silent."""
    if not refs:
        return
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=warn_after)
    if pending:
        free, total = ray.available_resources(), ray.cluster_resources()
        log.warning(
            "%d of %d client workers not set up after %g s; Ray has %g of %g CPUs and %g of %g GPUs "
            "free (still waiting: `ray status` shows what holds them)",
            len(pending), len(refs), warn_after, free.get("CPU", 0), total.get("CPU", 0),
            free.get("GPU", 0), total.get("GPU", 0),
        )  # fmt: skip
        ray.wait(pending, num_returns=len(pending))


def _cause(e: Exception) -> str:
    init_error = getattr(e, "error_msg", "") or ""
    if not isinstance(e, RayTaskError) and "__init__" in init_error:  # the constructor raised
        lines = [ln.strip() for ln in init_error.strip().splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.split(":")[0].endswith(("Error", "Exception"))]
        return errors[-1] if errors else lines[-1]
    if isinstance(e, RayTaskError):
        inner = e.cause if getattr(e, "cause", None) is not None else e
        return f"{type(inner).__name__}: {str(inner).strip().splitlines()[-1] if str(inner).strip() else ''}"
    return f"actor died ({type(e).__name__})"
