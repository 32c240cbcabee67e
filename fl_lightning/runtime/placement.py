"""Which actors exist, what each asks Ray for, and which clients each hosts.

Pure arithmetic over the cluster's resources, so it is tested without GPUs and the
serial executor can use the same thread count as the actors would (same numbers).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.errors import ConfigError


@dataclass(frozen=True)
class Placement:
    num_actors: int
    cpus_per_actor: float
    gpus_per_actor: float
    threads: int  # torch intra-op threads per fit
    accelerator: str  # cpu | gpu
    assignment: tuple[int, ...]  # client id -> actor index (sticky: data loads once)

    def clients_of(self, actor: int) -> list[int]:
        return [c for c, a in enumerate(self.assignment) if a == actor]


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
) -> Placement:
    if accelerator == "auto":
        accelerator = "gpu" if total_gpus > 0 else "cpu"
    if accelerator == "gpu" and total_gpus <= 0:
        raise ConfigError("runtime.accelerator=gpu but Ray sees no GPUs; use runtime.accelerator=cpu")
    gpu = accelerator == "gpu"
    per_gpu = (gpus_per_client or 1.0) if gpu else 0.0
    if per_gpu > 1 or (gpu and per_gpu <= 0):
        raise ConfigError(f"runtime.gpus_per_client must be in (0, 1] (got {per_gpu})")
    if gpu:
        slots = max(1, int(math.floor(total_gpus / per_gpu + 1e-9)))
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
    )
