"""`Session`: what outlives one run of a process: the Ray it started or joined (and that
Ray's lifecycle), the workers `early_start` made before the run asked for them, and (a
sequential sweep) the warm workers of its finished runs. None of it is module-level state:
`runner.start_run` and `resume_run` take a session, by default a new one that ends with them.

Light to import (no torch, no Ray at module level): the CLI enters a session before the
driver's heavy imports, so that Ray and the workers start meanwhile (`early_start`).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple

from .early import DRIVER_MODULES, EarlyWorkers, create_workers
from .local_ray import RayConnection, cluster_address, init_ray
from .placement import Placement, placement_for

if TYPE_CHECKING:
    from ..config import Composed
    from ..core.types import ClientId, ClientState
    from .build import Prepared
    from .executor import Executor
    from .ray_executor import ActorPool


class Workers(NamedTuple):
    """A run's executor, where its clients run, and how many of its Ray workers it found
    already started (warm from a sweep's previous run; made while the driver imported)."""

    executor: Executor
    placement: Placement
    reused: int = 0
    prestarted: int = 0


class Session:
    """What one process keeps between its runs. `keep_ray`: a Ray a run starts or joins stays
    up for the next run (a sequential sweep starts it once); `reuse_actors`: a finished run's
    client workers stay up for the next run that asks for the same CPUs and GPUs per worker.
    On `close` (or leaving the `with` block) everything it started is ended; a Ray that was
    up before is left as it was."""

    def __init__(self, keep_ray: bool = False, reuse_actors: bool = False) -> None:
        self.keep_ray, self.reuse_actors = keep_ray, reuse_actors
        self.ray: RayConnection | None = None  # the Ray this session connected (None: none, or one found up)
        self.early: EarlyWorkers | None = None  # workers made by `early_start`, until a run takes them
        self.pool: ActorPool | None = None  # `reuse_actors`: idle warm workers

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def connect(self, address: str | None, num_cpus: int | None, num_gpus: int | None) -> bool:
        """Start a private local Ray, or join a cluster, unless Ray is up; True if this call
        connected (see `local_ray.init_ray`)."""
        conn = init_ray(address, num_cpus, num_gpus)
        if conn is None:
            return False
        self.ray = conn
        return True

    def close(self) -> None:
        """End the early workers no run took, the warm ones, and the Ray this session connected."""
        if self.early is not None:
            self.early.end()
            self.early = None
        ray = sys.modules.get("ray")
        if self.pool is not None and ray is not None and ray.is_initialized():
            self.pool.clear()
        self.pool = None
        conn, self.ray = self.ray, None
        if conn is not None:
            conn.shutdown()

    @contextlib.contextmanager
    def early_start(self, cfg: Composed) -> Iterator[None]:
        """Around a `start_run` of `cfg` in this session: Ray and the run's workers start while
        the driver imports (`early.py`). A serial run, one that joins a cluster, or
        `runtime.early_start=false` is left as it was."""
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
        try:
            self.connect(rt.address, rt.num_cpus, rt.num_gpus)
            self.early = create_workers(cfg)
            loader.join()
            if errors:
                raise errors[0]
            yield
        finally:
            if self.early is not None:
                self.early.end()
                self.early = None
            if not self.keep_ray:
                self.close()

    def workers(
        self, p: Prepared, restore: Callable[[list[ClientId]], Iterable[tuple[ClientId, ClientState]]]
    ) -> Workers:
        """The executor of run `p`: its clients in this process (`runtime=serial`), or in Ray
        workers (started here, unless Ray is up)."""
        from .build import local_resources

        cfg = p.cfg
        if cfg.runtime.executor == "serial":
            from .executor import SerialExecutor
            from .host import ClientHost

            placement = placement_for(cfg, *local_resources(cfg))
            p.spec.threads, p.spec.accelerator = placement.threads, placement.accelerator
            train, test = dict(enumerate(p.split.train)), dict(enumerate(p.split.test))
            return Workers(SerialExecutor(ClientHost(p.spec, p.dataset, train, test)), placement)
        rt = cfg.runtime
        connected = self.connect(rt.address, rt.num_cpus, rt.num_gpus)
        import ray

        from .ray_executor import ActorPool, RayExecutor

        try:
            res = ray.cluster_resources()
            placement = placement_for(cfg, res.get("CPU", 1.0), res.get("GPU", 0.0))
            p.spec.threads, p.spec.accelerator = placement.threads, placement.accelerator
            if self.reuse_actors and self.pool is None:
                self.pool = ActorPool()
            ex = RayExecutor(
                p.spec, p.dataset, p.split.train, p.split.test, placement, cfg.fl.max_client_failures,
                rt.placement_strategy, rt.schedule_timeout_s, restore=restore, pool=self.pool,
                early=self.early,
            )  # fmt: skip
            ex.ready()
        except BaseException:
            if connected:
                self.close()
            raise
        return Workers(ex, placement, ex.reused, ex.prestarted)

    def end_run(self, executor: Executor, completed: bool) -> None:
        """A run's workers are ended (or kept warm, `reuse_actors`, when it completed), and its
        Ray shut down unless `keep_ray`."""
        executor.close(reuse=completed)
        if not self.keep_ray:
            self.close()
