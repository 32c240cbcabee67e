"""`Session`: what outlives one run of a process: the Ray it started or joined (and that
Ray's lifecycle), and its idle workers (`WorkerSource`): those `early_start` made before the
run asked for them and (a sequential sweep) the warm workers of its finished runs. None of it
is module-level state: `runner.start_run` and `resume_run` take a session, by default a new one
that ends with them.

Light to import (no torch, no Ray at module level): the CLI enters a session before the
driver's heavy imports, so that Ray and the workers start meanwhile (`early_start`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple

from .early import import_driver
from .local_ray import RayConnection, cluster_address, init_ray
from .placement import Placement, local_resources, placement_for
from .workers import WorkerSource

if TYPE_CHECKING:
    from ..config import RootConfig
    from ..core.types import ClientId, ClientState
    from .build import Prepared
    from .executor import Executor


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
        self.source = WorkerSource()  # idle workers: made by `early_start`, or warm (`reuse_actors`)
        self.planned: Placement | None = None  # `early_start`'s: the placement of the run inside it

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
        """End the idle workers (early ones no run took, warm ones) and the Ray this session connected."""
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            self.source.clear()
        self.source = WorkerSource()
        conn, self.ray = self.ray, None
        if conn is not None:
            conn.shutdown()

    @contextlib.contextmanager
    def early_start(self, cfg: RootConfig) -> Iterator[None]:
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
                import_driver()
            except BaseException as e:  # re-raised in the main thread
                errors.append(e)

        loader = threading.Thread(target=load, name="fl-imports", daemon=True)
        loader.start()
        try:
            self.planned = self.placement(cfg)
            self.source.make(self.planned)
            loader.join()
            if errors:
                raise errors[0]
            yield
        finally:
            self.planned = None
            if not self.keep_ray:
                self.close()

    def placement(self, cfg: RootConfig, local: Placement | None = None) -> Placement:
        """Where run `cfg`'s clients run, decided once per run: `early_start`'s (it made the
        workers for it), else `local`, the one `prepare` decided on this machine's resources,
        wherever the run uses those (`runtime=serial`, a Ray with the same resources: one
        started here); on another Ray (a cluster joined, a Ray up before with other resources),
        from that Ray's resources, known only now."""
        if self.planned is not None:
            return self.planned
        rt = cfg.runtime
        if rt.executor == "serial":
            if local is not None:
                return local
            return placement_for(cfg, *local_resources(cfg))
        ray_up = "ray" in sys.modules and sys.modules["ray"].is_initialized()
        if local is None and rt.num_gpus is not None and not ray_up and not cluster_address(rt.address):
            # the private Ray about to start has the declared GPUs: an impossible placement is
            # one line before it starts (an undeclared count needs torch or Ray to find it)
            local = placement_for(cfg, *local_resources(cfg))
        self.connect(rt.address, rt.num_cpus, rt.num_gpus)
        import ray

        res = ray.cluster_resources()
        on = (float(res.get("CPU", 1.0)), float(res.get("GPU", 0.0)))
        return local if local is not None and local.resources == on else placement_for(cfg, *on)

    def workers(
        self, p: Prepared, restore: Callable[[list[ClientId]], Iterable[tuple[ClientId, ClientState]]]
    ) -> Workers:
        """The executor of run `p` on its placement: its clients in this process
        (`runtime=serial`), or in Ray workers (Ray started here, unless it is up)."""
        cfg = p.cfg
        if cfg.runtime.executor == "serial":
            from .executor import SerialExecutor
            from .host import ClientHost

            placement = self.placement(cfg, p.placement)
            train, test = dict(enumerate(p.split.train)), dict(enumerate(p.split.test))
            return Workers(
                SerialExecutor(ClientHost(placement.place(p.spec), p.dataset, train, test)), placement
            )
        connected = self.ray is None and not _ray_up()
        from .ray_executor import RayExecutor

        try:
            placement = self.placement(cfg, p.placement)
            ex = RayExecutor(
                p.spec, p.dataset, p.split.train, p.split.test, placement, cfg.fl.max_client_failures,
                restore=restore, source=self.source,
            )  # fmt: skip
            ex.ready()
        except BaseException:
            if connected and self.ray is not None:
                self.close()
            raise
        return Workers(ex, placement, ex.reused, ex.prestarted)

    def end_run(self, executor: Executor, completed: bool) -> None:
        """A run's workers are ended (or kept warm, `reuse_actors`, when it completed), and its
        Ray shut down unless `keep_ray`."""
        executor.close(reuse=completed and self.reuse_actors)
        if not self.keep_ray:
            self.close()


def _ray_up() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())
