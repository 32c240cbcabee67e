"""A cold `runtime=ray` run overlaps its start-up steps. (Measured in benchmarks/cold_start.py.)

In order, a cold run pays the driver's imports (torch, Lightning: ~4.6 s on 2 cores), its
data (~0.3 s), `ray.init` (~2.8 s) and then its workers' own imports (~4.7 s, in parallel).
`Session.early_start` starts the private local Ray in the main thread (Ray's signal handling wants
it there) while a thread imports the driver's modules (`DRIVER_MODULES`), then decides the
run's placement (`Session.placement`, from Ray's resources) and makes its workers
(`WorkerSource.make`, `workers.py`); each worker imports torch and Lightning in its constructor
(`actor.py`), so that runs while the driver finishes its imports and loads its data.
(Importing in the main thread after the workers were created, with no thread, was ~0.9 s
slower on 2 cores: median of 4 alternating cold runs; the thread costs `ray.init` some GIL time
but overlaps it with the imports.) The run's `RayExecutor` takes them from the session's
`WorkerSource`, which ends any it does not take, and the session the Ray started here.

GPU runs reserve their placement group here too and create their workers on its bundles,
as `RayExecutor` would, so each worker's imports and CUDA context (made in its constructor)
overlap the driver's imports and data; the executor takes the group with the workers. A run
that joins a cluster (`runtime.address`, `$RAY_ADDRESS`), runs serially, or has
`runtime.early_start=false` is left as it was.
"""

#: the driver's heavy modules, imported by a thread while Ray starts
DRIVER_MODULES = ("fl_lightning.runtime.runner",)


def import_driver() -> None:
    """Import `DRIVER_MODULES`: a process's first time with the collector paused and what they
    made frozen (`heavy_imports.py`), a no-op once they are imported."""
    from ..heavy_imports import import_heavy

    import_heavy(*DRIVER_MODULES)
