"""A cold `runtime=ray` run overlaps its start-up steps. (Measured in benchmarks/cold_start.py.)

In order, a cold run pays the driver's imports (torch, Lightning: ~4.6 s on 2 cores), its
data (~0.3 s), `ray.init` (~2.8 s) and then its workers' own imports (~4.7 s, in parallel).
`Session.early_start` starts the private local Ray in the main thread (Ray's signal handling wants
it there) while a thread imports the driver's modules, then creates the workers the run
will ask for (`create_workers`: the placement `Session.workers` computes, from Ray's resources); each
worker imports torch and Lightning in its constructor (`actor.py`), so that runs while the
driver finishes its imports and loads its data. (Importing in the main thread after the
workers were created, with no thread, was ~0.9 s slower on 2 cores: median of 4 alternating
cold runs; the thread costs `ray.init` some GIL time but overlaps it with the imports.) The
run's `RayExecutor` takes them (`EarlyWorkers.take`); any it does not take are ended on the
way out, and so is the Ray started here.

GPU runs reserve their placement group here too and create their workers on its bundles,
as `RayExecutor` would, so each worker's imports and CUDA context (made in its constructor)
overlap the driver's imports and data; the executor takes the group with the workers. A run
that joins a cluster (`runtime.address`, `$RAY_ADDRESS`), runs serially, or has
`runtime.early_start=false` is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .placement import end_workers  # light: neither torch nor Ray

if TYPE_CHECKING:
    from ..config import Composed

#: the driver's heavy modules, imported by a thread while Ray starts
DRIVER_MODULES = ("fl_lightning.runtime.runner",)


@dataclass
class EarlyWorkers:
    """Workers `create_workers` made for a run before it asked for them (and on GPUs their
    placement group), with what they were made with."""

    options: dict[str, Any]
    ctor: tuple[Any, ...]
    actors: list[Any] = field(default_factory=list)
    pg: Any = None
    layout: Any = None

    def take(
        self, options: dict[str, Any], ctor: tuple[Any, ...], n: int, layout: Any = None
    ) -> tuple[list[Any], Any]:
        """Up to `n` workers and their placement group, if they were created with these
        `options`, constructor arguments and (on GPUs) bundle layout; every other one is ended
        (it holds CPUs or GPUs the run may need). A placement group goes all or nothing."""
        actors, pg, self.actors, self.pg = self.actors, self.pg, [], None
        same = self.options == options and self.ctor == ctor and self.layout == layout
        if not same or (pg is not None and len(actors) != n):
            end_workers(actors, pg, quiet=True)
            return [], None
        end_workers(actors[n:], None, quiet=True)
        return actors[:n], pg

    def end(self) -> None:
        """End the workers (and their placement group) no run took."""
        actors, pg, self.actors, self.pg = self.actors, self.pg, [], None
        end_workers(actors, pg, quiet=True)


def create_workers(cfg: Composed, check_cuda: bool = True) -> EarlyWorkers:
    """The workers `RayExecutor` would create for `cfg` (`check_cuda` as its; off only for
    tests on declared GPUs), and on GPUs their placement group."""
    import ray

    from .actor import remote_actor
    from .placement import layout_key, on_bundle, placement_for, reserve_gpu_bundles

    rt = cfg.runtime
    res = ray.cluster_resources()
    placement = placement_for(cfg, res.get("CPU", 1.0), res.get("GPU", 0.0))
    options = dict(num_cpus=placement.cpus_per_actor, num_gpus=placement.gpus_per_actor)
    ctor = (placement.accelerator, check_cuda)  # RayExecutor's (accelerator, check_cuda)
    pg = None
    if placement.gpu_bundles:  # a request the cluster cannot meet: one line, before the driver's work
        pg = reserve_gpu_bundles(placement, rt.placement_strategy, rt.schedule_timeout_s)
    actors = [
        remote_actor().options(**options, **on_bundle(pg, placement, a)).remote(*ctor)
        for a in range(placement.num_actors)
    ]
    return EarlyWorkers(options, ctor, actors, pg, layout_key(placement, rt.placement_strategy))
