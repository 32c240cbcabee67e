"""A leaner `import torchmetrics` in the processes fl_lightning owns (issue 18: start-up).

Lightning imports torchmetrics (to read its version), and `import torchmetrics` imports every
metric it has, each with the optional backend it finds installed: transformers (BERTScore),
torchvision's model zoo (ARNIQA, FID), scipy.signal (audio) and matplotlib (`Metric.plot`).
None of our metrics needs them, yet they were ~2.3 s of a client worker's ~6.5 s of imports
on 2 cores, paid by the driver and again by every worker. Once `install()` has run,
torchmetrics is imported (whenever and by whichever thread that happens first) with those
four packages hidden from its availability checks only: the packages stay importable and
our own code uses them (sentence-transformers, torchvision's ResNets, matplotlib's plots);
torchmetrics' own metrics that need them are unavailable in the process and say which
package they want.

Installed by the CLI and by every client worker before anything imports Lightning; not by
`import fl_lightning` (a user's own process decides). Changes nothing when torchmetrics is
already imported, or with `FL_LIGHTNING_LEAN_IMPORTS=0` (a method that uses torchmetrics'
FID or BERTScore, say). Needs neither torch nor Lightning.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

#: torchmetrics' optional backends that our metrics never use
HIDDEN = frozenset({"transformers", "torchvision", "scipy", "matplotlib"})


def install() -> None:
    """Hide `HIDDEN` from torchmetrics' availability checks when it is first imported."""
    if os.environ.get("FL_LIGHTNING_LEAN_IMPORTS", "1") == "0" or "torchmetrics" in sys.modules:
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


@contextlib.contextmanager
def _hidden() -> Iterator[None]:
    """torchmetrics' flags are lightning_utilities RequirementCache objects (package metadata,
    then find_spec) and its __init__ calls package_available: both look these two names up
    in `lightning_utilities.core.imports`, so they are swapped there while it imports."""
    try:
        from importlib.metadata import PackageNotFoundError

        import lightning_utilities.core.imports as lui
    except ImportError:  # a torchmetrics without lightning_utilities: nothing to hide from
        yield
        return
    version, available = lui._version, lui.package_available

    def hidden_version(name: str) -> str:
        if name in HIDDEN:
            raise PackageNotFoundError(name)
        return version(name)

    def hidden_available(name: str) -> bool:
        return name.split(".")[0] not in HIDDEN and available(name)

    lui._version, lui.package_available = hidden_version, hidden_available  # type: ignore[assignment]
    try:
        yield
    finally:
        lui._version, lui.package_available = version, available  # package_available: lru_cached, untouched


class _Loader(importlib.abc.Loader):
    """torchmetrics' own loader, its package's code run inside `_hidden()`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.inner  # resources and reloads go to the real loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        with _hidden():
            self.inner.exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Answers once, for `torchmetrics` itself; stays in `sys.meta_path` (removing it while
    another thread walks the list could make that thread skip a finder)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torchmetrics" or self._done:
            return None
        with self._lock:
            if self._done:
                return None
            self._done = True
        for finder in sys.meta_path:  # the spec the rest of the chain would give
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None
