"""Which actors exist, what each asks Ray for, and which clients each hosts.

Pure arithmetic over the cluster's resources, so it is tested without GPUs and the
serial executor can use the same thread count as the actors would (same numbers).

GPU actors go into a Ray placement group with one bundle per GPU used
(`{"GPU": 1, "CPU": <its actors' CPUs>}`); actor i lives in bundle i % bundles, so
fractional requests (`runtime.gpus_per_client=0.25`) fill every GPU evenly instead of
packing GPU 0 first, and one-GPU actors each get their own GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError

if TYPE_CHECKING:
    from ..config import RootConfig
    from .host import ClientSpec


@dataclass(frozen=True)
class Placement:
    """A run's workers, decided once (`prepare` on this machine's resources, else
    `Session.placement` on a joined cluster's): how many, what each asks Ray for
    and is made with, which clients each hosts; immutable."""

    num_actors: int
    cpus_per_actor: float
    gpus_per_actor: float
    threads: int  # torch intra-op threads per fit
    accelerator: str  # cpu | gpu
    assignment: tuple[int, ...]  # client id -> actor index (sticky: data loads once)
    gpu_bundles: int = 0  # placement-group bundles, one per GPU used; 0: no placement group
    mode: str = "pool"  # per_client | pool: `runtime.placement` with `auto` decided
    strategy: str = "PACK"  # runtime.placement_strategy: how the GPU bundles spread over nodes
    schedule_timeout_s: float | None = 120.0  # runtime.schedule_timeout_s: to reserve the bundles
    check_cuda: bool = True  # a GPU worker checks that CUDA works (off only for tests on declared GPUs)
    resources: tuple[float, float] = (0.0, 0.0)  # the (CPUs, GPUs) it was decided on

    def place(self, spec: ClientSpec) -> ClientSpec:
        """`spec` as this placement's hosts run it: their threads and accelerator."""
        return dataclasses.replace(spec, threads=self.threads, accelerator=self.accelerator)

    def worker_key(self) -> tuple[Any, ...]:
        """What makes workers interchangeable: the resources each holds and what it was made
        with; inside a placement group, the whole layout (bundles, which actor on which)."""
        layout = None
        if self.gpu_bundles:
            bundles = tuple(tuple(sorted(b.items())) for b in self.bundles())
            layout = (bundles, tuple(self.bundle_of(a) for a in range(self.num_actors)), self.strategy)
        return (self.cpus_per_actor, self.gpus_per_actor, self.accelerator, self.check_cuda, layout)

    def clients_of(self, actor: int) -> list[int]:
        return [c for c, a in enumerate(self.assignment) if a == actor]

    def bundle_of(self, actor: int) -> int:
        """Round-robin over the GPUs: actor i -> bundle i % bundles."""
        return actor % self.gpu_bundles

    def bundles(self) -> list[dict[str, float]]:
        """The placement group's bundles: one whole GPU each, with its actors' CPUs."""
        out = []
        for b in range(self.gpu_bundles):
            k = len(range(b, self.num_actors, self.gpu_bundles))
            out.append({"GPU": 1.0, "CPU": round(k * self.cpus_per_actor, 4)})
        return out


def bundles_fit(bundles: list[dict[str, float]], nodes: list[dict[str, float]]) -> str | None:
    """Whether each bundle fits on one node (a bundle cannot span nodes). Returns None when
    they fit (first-fit, largest bundles first), else a one-line reason."""
    free = [dict(n) for n in nodes]
    for i, bundle in sorted(enumerate(bundles), key=lambda x: -sum(x[1].values())):
        for node in free:
            if all(node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items()):
                for k, v in bundle.items():
                    node[k] = node.get(k, 0.0) - v
                break
        else:
            shape = ", ".join(f"{k} {v:g}" for k, v in bundle.items())
            per_node = "; ".join(
                f"node {j}: " + ", ".join(f"{k} {n.get(k, 0.0):g}" for k in bundle)
                for j, n in enumerate(nodes)
            )
            return (
                f"cannot place {len(bundles)} GPU bundles: bundle {i} ({shape}) fits on no node "
                f"once the others are placed ({per_node}); "
                "lower runtime.cpus_per_client or the number of clients"
            )
    return None


def plan_placement(
    num_clients: int,
    total_cpus: float,
    total_gpus: float,
    placement: str = "auto",
    accelerator: str = "auto",
    num_actors: int | None = None,
    cpus_per_client: float | None = None,
    gpus_per_client: float | None = None,
    threads_per_client: int | None = None,
    strategy: str = "PACK",
    schedule_timeout_s: float | None = 120.0,
) -> Placement:
    if accelerator == "auto":
        accelerator = "gpu" if total_gpus > 0 else "cpu"
    if accelerator == "gpu" and total_gpus <= 0:
        raise ConfigError("runtime.accelerator=gpu but Ray sees no GPUs; use runtime.accelerator=cpu")
    gpu = accelerator == "gpu"
    per_gpu = (gpus_per_client or 1.0) if gpu else 0.0
    if per_gpu > 1 or (gpu and per_gpu <= 0):
        raise ConfigError(f"runtime.gpus_per_client must be in (0, 1] (got {per_gpu})")
    whole_gpus = int(math.floor(total_gpus + 1e-9))
    per_device = int(math.floor(1.0 / per_gpu + 1e-9)) if gpu else 0  # actors sharing one GPU
    if gpu and whole_gpus < 1:
        raise ConfigError(
            f"Ray sees {total_gpus:g} GPUs; runtime.accelerator=gpu needs at least one whole GPU"
        )
    if gpu:
        slots = whole_gpus * per_device
    else:
        slots = max(1, int(total_cpus // (cpus_per_client or 1.0)))
    if placement == "auto":
        placement = "per_client" if num_clients <= slots else "pool"
    if placement == "per_client":
        n = num_clients
    else:
        n = min(num_clients, num_actors or slots)
    cpus = cpus_per_client or max(total_cpus / n, 0.01)
    if gpu and n * per_gpu > total_gpus + 1e-9:
        raise ConfigError(
            f"{n} client actors × {per_gpu} GPU need {n * per_gpu:g} GPUs but the cluster has "
            f"{total_gpus:g}; use runtime.placement=pool, fewer clients, or a smaller runtime.gpus_per_client"
        )
    if gpu and n > slots:
        raise ConfigError(
            f"{n} client actors × {per_gpu:g} GPU do not fit on {whole_gpus} GPUs "
            f"({per_device} per GPU at most); "
            f"use runtime.placement=pool, fewer clients, or runtime.gpus_per_client=1/k"
        )
    if n * cpus > total_cpus + 1e-6:
        raise ConfigError(
            f"{n} client actors × {cpus:g} CPUs need {n * cpus:g} CPUs but the cluster has "
            f"{total_cpus:g}; lower runtime.cpus_per_client or use runtime.placement=pool"
        )
    threads = threads_per_client or max(1, int(cpus))
    return Placement(
        num_actors=n,
        cpus_per_actor=math.floor(cpus * 1e4) / 1e4,  # floor: n shares must fit
        gpus_per_actor=per_gpu,
        threads=threads,
        accelerator=accelerator,
        assignment=tuple(c % n for c in range(num_clients)),
        gpu_bundles=min(whole_gpus, n) if gpu else 0,
        mode=placement,
        strategy=strategy,
        schedule_timeout_s=schedule_timeout_s,
        resources=(float(total_cpus), float(total_gpus)),
    )


def local_resources(cfg: RootConfig) -> tuple[float, float]:
    """This machine's CPUs and GPUs as the run declares or finds them (torch only to count GPUs
    the config leaves undeclared: `early.py` plans before the driver's imports)."""
    gpus = cfg.runtime.num_gpus
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count()
    return float(cfg.runtime.num_cpus or os.cpu_count() or 1), float(gpus)


def placement_for(cfg: RootConfig, cpus: float, gpus: float) -> Placement:
    """The run's placement on `cpus` and `gpus` (its `runtime` settings)."""
    rt = cfg.runtime
    threads = rt.threads_per_client if rt.threads_per_client is not None else env_threads()
    return plan_placement(
        cfg.fl.num_clients, cpus, gpus, rt.placement, rt.accelerator, rt.num_actors,
        rt.cpus_per_client, rt.gpus_per_client, threads, rt.placement_strategy,
        rt.schedule_timeout_s,
    )  # fmt: skip


def env_threads() -> int | None:
    """`$FL_LIGHTNING_THREADS_PER_CLIENT`: the torch threads of a client whose config leaves
    `runtime.threads_per_client` unset (a machine shared with other work; the test suite's
    workers set 1: a client's CPU share of two threads spins against theirs)."""
    value = os.environ.get("FL_LIGHTNING_THREADS_PER_CLIENT", "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"FL_LIGHTNING_THREADS_PER_CLIENT={value!r}: expected a whole number >= 1")
    return int(value)


# --- placement groups (Ray imported inside: `early.py` reads this module before Ray is up) ---
def reserve_gpu_bundles(placement: Placement) -> Any:
    """A placement group with one bundle per GPU, ready; a clear ConfigError when the
    bundles fit on no node, or when the cluster cannot grant them within
    `placement.schedule_timeout_s`."""
    import ray
    from ray.exceptions import GetTimeoutError
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles, strategy, timeout_s = placement.bundles(), placement.strategy, placement.schedule_timeout_s
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    reason = bundles_fit(bundles, nodes)
    if reason:
        raise ConfigError(reason)
    pg = placement_group(bundles, strategy=strategy)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except GetTimeoutError:
        remove_placement_group(pg)
        free = ray.available_resources()
        raise ConfigError(
            f"Ray could not reserve {len(bundles)} GPU bundles ({bundles[0]['CPU']:g} CPUs + 1 GPU each, "
            f"strategy {strategy}) within {timeout_s:g}s: {free.get('GPU', 0.0):g} GPUs and "
            f"{free.get('CPU', 0.0):g} CPUs are free now (other jobs hold the rest?); "
            "free them, ask for fewer, "
            "or raise runtime.schedule_timeout_s"
        ) from None
    return pg


def on_bundle(pg: Any, placement: Placement, actor: int) -> dict[str, Any]:
    """Actor options that put `actor` on its bundle of `pg` (none without a group)."""
    if pg is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=placement.bundle_of(actor))}  # fmt: skip


def end_workers(actors: list[Any], pg: Any, quiet: bool = False) -> None:
    """Kill `actors` and remove their placement group `pg` (if any). `quiet`: a failure to end
    one (Ray half down on the way out) is ignored and the rest are still ended."""
    if not actors and pg is None:
        return
    import ray
    from ray.util.placement_group import remove_placement_group

    guard = contextlib.suppress(Exception) if quiet else contextlib.nullcontext()
    for a in actors:
        with guard:
            ray.kill(a)
    if pg is not None:
        with guard:
            remove_placement_group(pg)
