"""A cold `runtime=ray` run overlaps its start-up steps (issue 18).

In order, a cold run pays the driver's imports (torch, Lightning: ~4.6 s on 2 cores), its
data (~0.3 s), `ray.init` (~2.8 s) and then its workers' own imports (~4.7 s, in parallel).
`early_start` starts the private local Ray in the main thread (Ray's signal handling wants
it there) while a thread imports the driver's modules, then creates the workers the run
will ask for (the same placement `Run._executor` computes, from Ray's resources); each
worker imports torch and Lightning in its constructor (`actor.py`), so that runs while the
driver finishes its imports and loads its data. (Importing in the main thread after the
workers were created, with no thread, was ~0.9 s slower on 2 cores: median of 4 alternating
cold runs; the thread costs `ray.init` some GIL time but overlaps it with the imports.) The
run's `RayExecutor` takes them (`take`); any it does not take are ended on the way out, and
so is the Ray started here.

GPU runs reserve their placement group here too and create their workers on its bundles,
as `RayExecutor` would, so each worker's imports and CUDA context (made in its constructor)
overlap the driver's imports and data; the executor takes the group with the workers. A run
that joins a cluster (`runtime.address`, `$RAY_ADDRESS`), runs serially, or has
`runtime.early_start=false` is left as it was.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .placement import end_workers  # light: neither torch nor Ray

if TYPE_CHECKING:
    from omegaconf import DictConfig

#: the driver's heavy modules, imported by a thread while Ray starts
DRIVER_MODULES = ("fl_lightning.runtime.runner",)


class _Early:
    def __init__(
        self, options: dict[str, Any], ctor: tuple[Any, ...], actors: list[Any], pg: Any, layout: Any
    ) -> None:
        self.options, self.ctor, self.actors, self.pg, self.layout = options, ctor, actors, pg, layout


_early: _Early | None = None  # workers created by `early_start`, not yet taken by a run


@contextlib.contextmanager
def early_start(cfg: DictConfig) -> Iterator[None]:
    """Around a `start_run` of `cfg`: Ray and its workers start while the driver imports."""
    from .local_ray import cluster_address

    rt = cfg.runtime
    if rt.executor != "ray" or not rt.early_start or cluster_address(rt.address):
        yield
        return
    errors: list[BaseException] = []

    def load() -> None:
        try:
            for name in DRIVER_MODULES:
                importlib.import_module(name)
        except BaseException as e:  # re-raised in the main thread
            errors.append(e)

    loader = threading.Thread(target=load, name="fl-imports", daemon=True)
    loader.start()
    from .local_ray import init_ray, ray_kept, stop_local_ray

    started = False
    try:
        started = init_ray(rt.address, rt.num_cpus, rt.num_gpus)
        _create_workers(cfg)
        loader.join()
        if errors:
            raise errors[0]
        yield
    finally:
        release()
        if started and not ray_kept():
            import ray

            ray.shutdown()
            stop_local_ray()


def _create_workers(cfg: DictConfig, check_cuda: bool = True) -> None:
    """The workers `RayExecutor` would create for `cfg` (`check_cuda` as its; off only for
    tests on declared GPUs), and on GPUs their placement group."""
    import ray

    from .actor import remote_actor
    from .placement import layout_key, on_bundle, placement_for, reserve_gpu_bundles

    global _early
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
    _early = _Early(options, ctor, actors, pg, layout_key(placement, rt.placement_strategy))


def take(options: dict[str, Any], ctor: tuple[Any, ...], n: int, layout: Any = None) -> tuple[list[Any], Any]:
    """Up to `n` early workers and their placement group, if they were created with these
    `options`, constructor arguments and (on GPUs) bundle layout; every other one is ended
    (it holds CPUs or GPUs the run may need). A placement group goes all or nothing."""
    global _early
    early, _early = _early, None
    if early is None:
        return [], None
    same = early.options == options and early.ctor == ctor and early.layout == layout
    if not same or (early.pg is not None and len(early.actors) != n):
        end_workers(early.actors, early.pg, quiet=True)
        return [], None
    end_workers(early.actors[n:], None, quiet=True)
    return early.actors[:n], early.pg


def release() -> None:
    """End the early workers (and their placement group) no run took."""
    global _early
    early, _early = _early, None
    if early is not None:
        end_workers(early.actors, early.pg, quiet=True)
