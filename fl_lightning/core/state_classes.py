"""The classes a checkpoint may rebuild: the state classes of registered methods, nothing else.

A checkpoint names each dataclass it holds (`module:QualName`). Importing the module it names
would run code a shared run directory chose (`fl_lightning.__main__` re-entered the CLI), so
nothing is imported when a checkpoint is read: a name is looked up here, and a name that no
registered method declared is refused. Registering a method (`METHODS.register`, also from a
package outside this one) registers its `state_cls` and every dataclass its fields' types name
(nested state such as per-class statistics), plus any it lists in `checkpoint_classes`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from .messages import Broadcast, ClientPayload, ServerState

_CLASSES: dict[str, type] = {}


def class_name(cls: type) -> str:
    """How a checkpoint names `cls`."""
    return f"{cls.__module__}:{cls.__qualname__}"


def _dataclasses_in(tp: Any, out: set[type]) -> None:
    """`tp` and the dataclasses its fields' types name, recursively (`X | None`, `dict[int, X]`)."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if tp in out:
            return
        out.add(tp)
        try:
            hints = typing.get_type_hints(tp)
        except Exception:  # a name only imported for type checking: its own fields still count
            hints = {}
        for f in dataclasses.fields(tp):
            _dataclasses_in(hints.get(f.name), out)
        return
    for arg in typing.get_args(tp):
        _dataclasses_in(arg, out)


def register_classes(*classes: Any) -> None:
    """Declare `classes` (and the dataclasses their fields name) rebuildable from checkpoints."""
    found: set[type] = set()
    for cls in classes:
        _dataclasses_in(cls, found)
    for cls in found:
        _CLASSES[class_name(cls)] = cls


def register_state_classes(strategy: Any) -> None:
    """Declare the classes checkpoints of `strategy` (a Strategy class) may hold; called for
    every method `METHODS` registers."""
    register_classes(
        getattr(strategy, "state_cls", None),
        getattr(strategy, "broadcast_cls", None),  # a checkpoint's clients in flight started from one
        *getattr(strategy, "checkpoint_classes", ()),
    )


def state_class(name: str) -> type | None:
    """The registered class a checkpoint names, or None: never an import."""
    return _CLASSES.get(name)


register_classes(ServerState, Broadcast, ClientPayload)  # payloads: a checkpoint's clients in flight
