"""Executors decide *where* clients run; strategies never see them (fedjax's
ForEachClientBackend, Flower's Grid). Both yield results in completion order; the
round loop sorts them by client id before aggregating, so sums are order-independent.
"""
from __future__ import annotations

from typing import Iterator, Protocol

from ..core.messages import ClientEval, ClientUpdate, RoundPlan
from .host import ClientHost


class Executor(Protocol):
    def fit(self, plan: RoundPlan) -> Iterator[ClientUpdate]: ...

    def evaluate(self, plan: RoundPlan) -> Iterator[ClientEval]: ...

    def close(self) -> None: ...


class SerialExecutor:
    """All clients in the driver process, one after another. For debugging and tests."""

    def __init__(self, host: ClientHost) -> None:
        self.host = host
        self.failures: list[str] = []

    def fit(self, plan: RoundPlan) -> Iterator[ClientUpdate]:
        for payload in plan.payloads:
            yield self.host.fit(plan.broadcast, payload)

    def evaluate(self, plan: RoundPlan) -> Iterator[ClientEval]:
        for payload in plan.payloads:
            yield self.host.evaluate(plan.broadcast, payload)

    def close(self) -> None:
        pass
