"""Where a run's Ray workers come from: one `WorkerSource` per session, holding idle workers by
what they were made for (`Placement.worker_key`), and `new_worker`, the one way a worker is
made. Idle workers are either made before the run asked for them (`Session.early_start`: they
import torch and Lightning, and on a GPU make their CUDA context, while the driver imports and
loads its data) or kept warm from a finished run of the same session (`reuse_actors`, a
sequential sweep). A run takes those made for its own placement; any other idle worker is
ended then (it holds CPUs or GPUs the run may need).

Light to import (Ray only inside the functions): `session.py` reads it before Ray is up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .placement import Placement, end_workers, on_bundle, reserve_gpu_bundles


def new_worker(placement: Placement, pg: Any, actor: int) -> Any:
    """A new worker for actor `actor` of `placement` (on its bundle of `pg`, if any)."""
    from .actor import remote_actor

    options = dict(num_cpus=placement.cpus_per_actor, num_gpus=placement.gpus_per_actor)
    return (
        remote_actor()
        .options(**options, **on_bundle(pg, placement, actor))
        .remote(placement.accelerator, placement.check_cuda)
    )


@dataclass
class Idle:
    """Workers with no run, and their placement group (GPU runs: reserved while they are kept)."""

    actors: list[Any] = field(default_factory=list)
    pg: Any = None
    early: bool = False  # made before a run asked (else warm from a finished run)

    def end(self) -> None:
        actors, pg, self.actors, self.pg = self.actors, self.pg, [], None
        end_workers(actors, pg, quiet=True)


class WorkerSource:
    """A session's idle workers, by `Placement.worker_key`."""

    def __init__(self) -> None:
        self._idle: dict[tuple[Any, ...], Idle] = {}

    def make(self, placement: Placement) -> None:
        """Workers for `placement` now (on GPUs in their placement group, reserved first: a
        request the cluster cannot meet is one line, before the driver's work), idle until
        the run takes them."""
        pg = reserve_gpu_bundles(placement) if placement.gpu_bundles else None
        actors = [new_worker(placement, pg, a) for a in range(placement.num_actors)]
        self.put(placement, Idle(actors, pg, early=True))

    def take(self, placement: Placement) -> Idle:
        """The idle workers made for `placement` (up to its number; inside a placement group
        all of them or none) and their group, reserved now if none came with them; every
        other idle worker is ended."""
        mine = self._idle.pop(placement.worker_key(), None)
        self.clear()
        n = placement.num_actors
        if mine is not None and mine.pg is not None and len(mine.actors) != n:
            mine.end()
        if mine is None or (not mine.actors and mine.pg is None):
            mine = Idle()
        end_workers(mine.actors[n:], None, quiet=True)
        mine.actors = mine.actors[:n]
        if mine.pg is None and placement.gpu_bundles:
            mine.pg = reserve_gpu_bundles(placement)
        return mine

    def put(self, placement: Placement, idle: Idle) -> None:
        """Keep `idle` for the next run of `placement`'s workers."""
        old = self._idle.pop(placement.worker_key(), None)
        if old is not None:  # not expected (one executor per run); keep one set
            old.end()
        self._idle[placement.worker_key()] = idle

    def __len__(self) -> int:
        """How many idle workers it holds."""
        return sum(len(i.actors) for i in self._idle.values())

    def clear(self) -> None:
        """End every idle worker."""
        idle, self._idle = list(self._idle.values()), {}
        for i in idle:
            i.end()
