"""The Ray actor that hosts clients: `ClientActor`, and its remote class (`remote_actor`).

Kept apart from `ray_executor.py` and light to import (Ray, no torch or Lightning at module
level): a driver can create workers before it has imported torch and Lightning itself
(`early.py`), and each worker pays those imports in its constructor, in parallel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ray

if TYPE_CHECKING:
    import numpy as np

    from ..core.bn_stats import BNStats
    from ..core.messages import Broadcast, ClientEval, ClientPayload, ClientUpdate
    from ..core.types import ClientId, ClientState
    from ..data.registry import ArrayDataset
    from .host import ClientHost, ClientSpec


class ClientActor:
    """A stateful worker hosting one or more clients (a worker is not a client: the
    client's identity arrives as data in each payload). Built bare, then `setup` gives it
    a run's clients; between the runs of a sequential sweep a worker is kept warm
    (`reuse_actors`) and set up again instead of paying a new process and its imports."""

    def __init__(self, accelerator: str, check_cuda: bool = True) -> None:
        import contextlib
        import os

        from ..heavy_imports import import_heavy
        from ..lean_imports import install

        install()  # a worker's Lightning imports torchmetrics without its optional backends
        # the worker's imports start now, not at its first setup, with the collector paused (a
        # quarter of their CPU) and then frozen (`heavy_imports.py`)
        import_heavy("torch", f"{__package__}.host")
        import torch

        from .local_ray import WORKER_CWD_ENV

        # A local Ray's processes start in an empty folder (`local_ray._private_cwd`: the
        # driver's working directory is never on a worker's sys.path); relative paths in the
        # config are the driver's, so go there now that the imports are done. sys.path holds
        # no relative entry, so this imports nothing from there.
        cwd = os.environ.get(WORKER_CWD_ENV)
        if cwd:
            with contextlib.suppress(OSError):
                os.chdir(cwd)

        if accelerator == "gpu" and check_cuda and not torch.cuda.is_available():
            raise RuntimeError(
                f"Ray gave this actor GPU {[str(g) for g in ray.get_gpu_ids()]} but CUDA is not usable in it "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                "a GPU declared with num_gpus needs a real device, or use runtime.accelerator=cpu"
            )
        if accelerator == "gpu" and torch.cuda.is_available():
            torch.zeros(1, device="cuda")  # the CUDA context now, beside the driver's start, not in round 1
        self._host: ClientHost | None = None

    def setup(
        self,
        spec: ClientSpec,
        dataset: ArrayDataset,
        train: dict[ClientId, np.ndarray],
        test: dict[ClientId, np.ndarray],
    ) -> None:
        import torch

        from .host import ClientHost

        if spec.threads:
            torch.set_num_threads(spec.threads)
        self._host = None  # the previous run's clients go before the next run's arrive
        self._host = ClientHost(spec, dataset, train, test)

    def release(self) -> None:
        """Drop the run's clients (state, shards, objective); the worker stays warm."""
        import gc

        self._host = None
        gc.collect()

    @property
    def host(self) -> ClientHost:
        assert self._host is not None, "setup() first"
        return self._host

    def fit(self, broadcast: Broadcast, payload: ClientPayload) -> ClientUpdate:
        return self.host.fit(broadcast, payload)

    def fit_many(self, broadcast: Broadcast, payloads: list[ClientPayload]) -> list[ClientUpdate]:
        return self.host.fit_many(broadcast, payloads)

    def evaluate(self, broadcast: Broadcast, payload: ClientPayload) -> ClientEval:
        return self.host.evaluate(broadcast, payload)

    def bn_stats(self, broadcast: Broadcast, payload: ClientPayload) -> BNStats:
        return self.host.bn_stats(broadcast, payload)

    def get_states(self, client_ids: list[ClientId]) -> dict[ClientId, ClientState]:
        return self.host.get_states(client_ids)

    def set_states(self, states: dict[ClientId, ClientState]) -> None:
        self.host.set_states(states)

    def info(self) -> dict[str, Any]:
        import os

        ctx = ray.get_runtime_context()
        return {
            "node_ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "clients": self.host.client_ids,
            "pid": os.getpid(),
            "actor_id": ctx.get_actor_id(),
        }


#: `ray.remote(ClientActor)`: made once, at import (it needs no running Ray)
RemoteClientActor: Any = ray.remote(ClientActor)


def remote_actor() -> Any:
    """The remote class of `ClientActor`."""
    return RemoteClientActor
