"""`RayExecutor`: clients live in Ray actors that keep their data shards resident.

Per round the broadcast is `ray.put` once and each sampled client's payload goes to the
actor hosting it; results come back in completion order (`ray.wait`). A client whose
task raises, or whose actor dies, is retried once on a fresh actor, then dropped for the
round if `max_client_failures` allows, else the run stops with the client id and cause.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

import numpy as np
import ray
from ray.exceptions import RayActorError, RayTaskError

from ..core.errors import ClientFailure
from ..core.messages import ClientPayload, RoundPlan
from ..core.types import ClientId
from ..data.datasets import ArrayDataset
from .host import ClientHost, ClientSpec
from .placement import Placement

log = logging.getLogger(__name__)


class ClientActor:
    """A stateful worker hosting one or more clients (a worker is not a client: the
    client's identity arrives as data in each payload)."""

    def __init__(
        self,
        spec: ClientSpec,
        dataset: ArrayDataset,
        train: dict[ClientId, np.ndarray],
        test: dict[ClientId, np.ndarray],
    ) -> None:
        import torch

        if spec.threads:
            torch.set_num_threads(spec.threads)
        self.host = ClientHost(spec, dataset, train, test)

    def fit(self, broadcast, payload):
        return self.host.fit(broadcast, payload)

    def evaluate(self, broadcast, payload):
        return self.host.evaluate(broadcast, payload)

    def info(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "node_ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "clients": self.host.client_ids,
            "actor_id": ctx.get_actor_id(),
        }


class RayExecutor:
    def __init__(
        self,
        spec: ClientSpec,
        dataset: ArrayDataset,
        train: list[np.ndarray],
        test: list[np.ndarray],
        placement: Placement,
        max_client_failures: int = 0,
    ) -> None:
        self.placement = placement
        self.max_client_failures = max_client_failures
        self._dataset_ref = ray.put(dataset)  # once; actors read it zero-copy
        self._spec = spec
        self._train, self._test = train, test
        self._remote = ray.remote(ClientActor).options(
            num_cpus=placement.cpus_per_actor, num_gpus=placement.gpus_per_actor
        )
        self.actors = [self._start(a) for a in range(placement.num_actors)]
        self.failures: list[str] = []

    def _start(self, actor: int):
        clients = self.placement.clients_of(actor)
        return self._remote.remote(
            self._spec,
            self._dataset_ref,
            {c: self._train[c] for c in clients},
            {c: self._test[c] for c in clients} if self._test else {},
        )

    def ready(self) -> list[dict[str, Any]]:
        """Wait until every actor is up; returns where each one runs."""
        return ray.get([a.info.remote() for a in self.actors])

    def _actor_of(self, payload: ClientPayload) -> Any:
        return self.actors[self.placement.assignment[payload.client_id]]

    def _run(self, plan: RoundPlan, method: str) -> Iterator[Any]:
        bref = ray.put(plan.broadcast)
        submit: Callable[[ClientPayload], Any] = lambda p: getattr(self._actor_of(p), method).remote(bref, p)
        pending = {submit(p): (p, 0, self._actor_of(p)) for p in plan.payloads}
        dropped = 0
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            ref = done[0]
            payload, tries, actor = pending.pop(ref)
            try:
                yield ray.get(ref)
            except (RayTaskError, RayActorError) as e:
                cause = _cause(e)
                index = self.placement.assignment[payload.client_id]
                if isinstance(e, RayActorError) and self.actors[index] is actor:
                    self.actors[index] = self._start(index)  # once per dead actor
                if tries == 0:
                    log.warning("client %d failed (%s); retrying once", payload.client_id, cause)
                    pending[submit(payload)] = (payload, 1, self._actor_of(payload))
                    continue
                dropped += 1
                msg = f"round {plan.round}: client {payload.client_id} failed: {cause}"
                self.failures.append(msg)
                if dropped > self.max_client_failures:
                    raise ClientFailure(
                        f"{msg} (fl.max_client_failures={self.max_client_failures})"
                    ) from None
                log.warning("%s; dropped for this round", msg)

    def fit(self, plan: RoundPlan) -> Iterator[Any]:
        return self._run(plan, "fit")

    def evaluate(self, plan: RoundPlan) -> Iterator[Any]:
        return self._run(plan, "evaluate")

    def close(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []


def _cause(e: Exception) -> str:
    if isinstance(e, RayTaskError):
        inner = e.cause if getattr(e, "cause", None) is not None else e
        return f"{type(inner).__name__}: {str(inner).strip().splitlines()[-1] if str(inner).strip() else ''}"
    return f"actor died ({type(e).__name__})"
