"""Name -> object registries (timm/open_clip style): register by decorator, look up by name.

The registry key is the public name everywhere: file name, yaml name, W&B `method` tag.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from .errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """`on_register(obj)` runs for every entry registered (METHODS: declares the method's
    checkpoint state classes, `core/state_classes.py`)."""

    def __init__(self, kind: str, on_register: Callable[[T], None] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._on_register = on_register

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._entries and self._entries[name] is not obj:
                raise KeyError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            if self._on_register is not None:
                self._on_register(obj)
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(self.names()) or '(none)'}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


#: the entry-point group under which installed packages name the modules of their methods
#: (`fl_lightning.methods` imports them; config reads the names without importing)
METHOD_ENTRY_POINTS = "fl_lightning.methods"
