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

Lightning's progress-bar module likewise imports `rich` when it is installed (Flower, the
`bench` extra, brings it), though our Trainers draw no progress bar: rich is hidden from that
module's check the same way (`RICH_PROGRESS`), and stays importable.

Installed by the CLI and by every client worker before anything imports Lightning; not by
`import fl_lightning` (a user's own process decides). Changes nothing when torchmetrics is
already imported, or with `FL_LIGHTNING_LEAN_IMPORTS=0` (a method that uses torchmetrics'
FID or BERTScore, say). Needs neither torch nor Lightning.

It swaps two private names of lightning_utilities, so it is contained: it acts only for the
versions in `TESTED` (any other: torchmetrics imports as it comes), and any exception on its
way (a name renamed upstream, an import that fails with the backends hidden) makes it step
aside and torchmetrics import as it comes; only an error torchmetrics raises on its own is
raised. Delete this module once torchmetrics imports its optional backends lazily (upstream:
https://github.com/Lightning-AI/torchmetrics/issues/3457).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from importlib import metadata
from types import ModuleType
from typing import Any

#: torchmetrics' optional backends that our metrics never use
HIDDEN = frozenset({"transformers", "torchvision", "scipy", "matplotlib"})
#: Lightning's rich progress bar: `rich` (installed with Flower, the `bench` extra) is imported
#: there at Lightning's import, ~0.3-0.8 s on 2 cores in the driver and every worker, though
#: our Trainers draw no progress bar or model summary; hidden, Lightning's `_RICH_AVAILABLE`
#: (checked first in this module) is False in the process and rich stays importable
RICH_PROGRESS = "lightning.pytorch.callbacks.progress.rich_progress"
#: each watched module -> what its import does not see
HIDE = {"torchmetrics": HIDDEN, RICH_PROGRESS: frozenset({"rich"})}
#: the distributions (and versions) this was tested with: the private names it swaps are
#: lightning_utilities', read by torchmetrics' import and by Lightning's requirement checks
TESTED = {"torchmetrics": "1.9.0", "lightning-utilities": "0.15.3", "lightning": "2.6.6"}


def tested() -> bool:
    """Whether the installed torchmetrics and lightning_utilities are the `TESTED` versions
    (read from package metadata: nothing is imported)."""
    try:
        return all(metadata.version(dist) == want for dist, want in TESTED.items())
    except Exception:  # not installed, unreadable metadata: not what was tested
        return False


def install(target: str | None = None) -> None:
    """Hide `HIDE`'s packages from each watched module's availability checks when it is first
    imported (`target`: the one module to watch, for tests: it hides `HIDDEN`). Does nothing
    unless enabled and `tested()`, nor for a module imported already; never raises."""
    for name in [target] if target else list(HIDE):
        try:
            if os.environ.get("FL_LIGHTNING_LEAN_IMPORTS", "1") == "0" or name in sys.modules:
                continue
            if not tested() or any(isinstance(f, _Finder) and f.target == name for f in sys.meta_path):
                continue
            sys.meta_path.insert(0, _Finder(name, HIDE.get(name, HIDDEN)))
        except Exception:  # a speed-up only: whatever went wrong, imports stay as they come
            continue


@contextlib.contextmanager
def _hidden(names: frozenset[str] = HIDDEN) -> Iterator[None]:
    """torchmetrics' flags are lightning_utilities RequirementCache objects (package metadata,
    then find_spec) and its __init__ calls package_available: both look these two names up
    in `lightning_utilities.core.imports`, so they are swapped there while it imports. Where
    either name is missing (renamed upstream), nothing is swapped."""
    try:
        import lightning_utilities.core.imports as lui

        version, available = lui._version, lui.package_available
    except Exception:  # no lightning_utilities, or not the names we swap: nothing to hide
        yield
        return

    def hidden_version(name: str) -> str:
        if name in names:
            raise metadata.PackageNotFoundError(name)
        return version(name)

    def hidden_available(name: str) -> bool:
        return name.split(".")[0] not in names and available(name)

    lui._version, lui.package_available = hidden_version, hidden_available  # type: ignore[assignment]
    try:
        yield
    finally:
        lui._version, lui.package_available = version, available  # package_available: lru_cached, untouched


class _Loader(importlib.abc.Loader):
    """torchmetrics' own loader, its package's code run inside `_hidden()`."""

    def __init__(self, inner: Any, names: frozenset[str] = HIDDEN) -> None:
        self.inner, self.names = inner, names

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.inner  # resources and reloads go to the real loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        initial = set(vars(module))  # what the import system set: __spec__, __path__, ...
        try:
            with _hidden(self.names):
                self.inner.exec_module(module)
        except Exception:
            # Failed with the backends hidden (an upstream change we were not tested on, or
            # torchmetrics' own error): import it again as it comes, from a clean namespace and
            # with its submodules imported again. Its own error is raised from there.
            for name in set(vars(module)) - initial:
                delattr(module, name)
            prefix = module.__name__ + "."
            for name in [m for m in sys.modules if m.startswith(prefix)]:
                del sys.modules[name]
            self.inner.exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Answers once, for the `target` package itself (torchmetrics); stays in `sys.meta_path`
    (removing it while another thread walks the list could make that thread skip a finder).
    Any exception while it looks: it answers nothing and the usual finders import the package."""

    def __init__(self, target: str = "torchmetrics", names: frozenset[str] = HIDDEN) -> None:
        self.target, self.names = target, names
        self._lock = threading.Lock()
        self._done = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.target or self._done:
            return None
        with self._lock:
            if self._done:
                return None
            self._done = True
        try:
            for finder in sys.meta_path:  # the spec the rest of the chain would give
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader, self.names)
                    return spec
        except Exception:
            return None
        return None
