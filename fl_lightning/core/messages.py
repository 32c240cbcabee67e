"""Typed messages and state (fedjax-style explicit state, FLSim-style messages).

Methods add fields by subclassing, never by string keys. Everything here is plain data:
it is pickled across the actor boundary and checkpointed by `runtime.checkpoint`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from .params import nbytes
from .types import ClientId, Metrics, StateDict


def tensor_nbytes(obj: Any) -> int:
    """Bytes of every tensor reachable from `obj` (dataclass fields, dicts, lists)."""
    if isinstance(obj, torch.Tensor):
        return nbytes([obj])
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(tensor_nbytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    if isinstance(obj, dict):
        return sum(tensor_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_nbytes(v) for v in obj)
    return 0


@dataclass
class ServerState:
    """Everything the driver needs to continue a run (with the clients' own resident
    state, which the hosts keep and checkpoints collect from them).

    Attributes:
        round: last completed round (0 before the first).
        global_params: the global model, or None for methods that share no weights.
        aggregation: the aggregation chain's memory, one dict per step by name (adaptive
            clipping's bound, an accountant's history), and the last round's chain metrics
            under "metrics" (`core/aggregation.py`); checkpointed, so a resume continues it.
        schedule: the scheduler's state (`runtime/scheduler.py`): the virtual clock, the
            server's model version, and the clients in flight with the broadcast each started
            from; checkpointed, so a resume with clients in flight repeats what they would do.
            Empty for a synchronous run on no system model.
    """

    round: int
    global_params: StateDict | None
    aggregation: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)


@dataclass
class Broadcast:
    """What every client selected in a round receives; `ray.put` once per round.

    Attributes:
        round: the round being run.
        global_params: global weights to load, or None.
    """

    round: int
    global_params: StateDict | None = None

    def nbytes(self) -> int:
        return tensor_nbytes(self)


@dataclass
class ClientPayload:
    """The per-client part of a round.

    Attributes:
        client_id: which client to run.
        round: the round being run.
        seed: seeds this client's local training (derived from run seed, round, client id).
        evaluate: also evaluate the trained model on the client's own test split before it
            uploads (`eval.timing=trained`; set by the runner on evaluation rounds).
    """

    client_id: ClientId
    round: int
    seed: int
    evaluate: bool = False


@dataclass
class ClientEval:
    """A client's evaluation of the model it would use, on its own test split."""

    client_id: ClientId
    num_examples: int
    metrics: Metrics = field(default_factory=dict)


@dataclass
class ClientUpdate:
    """What a client returns after local training.

    Attributes:
        client_id: who sent it.
        num_examples: local training examples (FedAvg weight).
        params: updated shared weights, or None for methods that share none.
        metrics: local training metrics (loss terms, time); aggregated as `client/<name>`.
        evaluation: the trained model on the client's own test split, when the payload
            asked for it (`evaluate`); else None.
    """

    client_id: ClientId
    num_examples: int
    params: StateDict | None = None
    metrics: Metrics = field(default_factory=dict)
    evaluation: ClientEval | None = None

    def upload_nbytes(self) -> int:
        """Bytes this update sends over a real network: every tensor in it (the client's
        own state stays in its host and is never part of an update)."""
        return tensor_nbytes(self)


@dataclass
class RoundPlan:
    """What `Strategy.configure_round` returns: one broadcast, one payload per client."""

    round: int
    broadcast: Broadcast
    payloads: list[ClientPayload]

    @property
    def client_ids(self) -> list[ClientId]:
        return [p.client_id for p in self.payloads]


T = TypeVar("T")


def extend(base: Any, cls: type[T], **changes: Any) -> T:
    """`base` as an instance of its subclass `cls` (e.g. a method's ClientUpdate subclass),
    with `changes` applied: lets a method call `super()` and then add its fields."""
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return cls(**(fields | changes))
