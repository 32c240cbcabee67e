"""One file per method; importing this package registers every method in `METHODS`.

A method registers by its config class (`@METHODS.register("name")`, `core/method.py`):

- every method of this package has its config in `methods/configs/<file>.py` (torch-free: the
  command line checks a run against it before torch or Ray start) and its strategy and
  objective in `methods/<file>.py`, imported when the strategy is asked for; a new file in
  `methods/` holding its config too (`METHODS.register` in it) is imported whole;
- an installed package registers its own methods by naming their modules under the entry-point
  group `fl_lightning.methods` (imported when a name is not known yet, or all are listed):

      # the package's pyproject.toml
      [project.entry-points."fl_lightning.methods"]
      fedfoo = "mypkg.fedfoo"

- a run may name further modules with `methods=mypkg.fedfoo` (comma-separated for several):
  `import_methods` imports them before the method is looked up.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import re
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path

from ..core.errors import ConfigError
from ..core.method import METHODS, MethodConfig, implementation_module
from ..core.registry import METHOD_ENTRY_POINTS

__all__ = ["METHODS", "MethodConfig", "import_methods"]

#: a module name as `methods=` takes it: dotted identifiers, nothing else (no paths)
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def import_methods(modules: Iterable[str], what: str = "methods") -> list[str]:
    """Import `modules` (dotted names) so that the methods they define register; returns the
    names of the methods each registered. ConfigError, one line, if a name is not a module
    name, cannot be imported, or registers no method (a module imported for nothing is a typo)."""
    found: list[str] = []
    for module in modules:
        if not MODULE_NAME.fullmatch(module):
            raise ConfigError(f"{what}={module!r} is not a module name (dotted identifiers: mypkg.fedfoo)")
        try:
            importlib.import_module(module)
        except ConfigError:
            raise
        except Exception as e:  # the user's module: its failure is theirs, said in one line
            raise ConfigError(f"{what}={module}: cannot import it ({type(e).__name__}: {e})") from None
        mine = [
            n
            for n in METHODS.registered()
            if any(
                _within(m, module)
                for m in (METHODS.config(n).__module__, implementation_module(METHODS.config(n)))
            )
        ]
        if not mine:
            raise ConfigError(f"{what}={module} registers no method (no @METHODS.register in it)")
        found += mine
    return found


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def import_all() -> None:
    """Import every method's strategy (`fl-lightning list`, tests over all methods)."""
    for name in METHODS.names():
        importlib.import_module(implementation_module(METHODS.config(name)))


def _import_package_configs() -> None:
    """The configs of this package's methods (torch-free), and, whole, a method file that
    declares its config itself (one file: `METHODS.register` in it)."""
    here = Path(__path__[0])
    for info in pkgutil.iter_modules([str(here / "configs")]):
        importlib.import_module(f"{__name__}.configs.{info.name}")
    for info in pkgutil.iter_modules(__path__):
        if not info.ispkg and "METHODS.register(" in (here / f"{info.name}.py").read_text():
            importlib.import_module(f"{__name__}.{info.name}")


_LOADED: set[str | None] = set()


def _import_entry_points(name: str | None) -> None:
    """Installed packages' methods named `name` (None: all). A package whose module fails to
    import is one warning, and its methods are unknown: a broken plugin must not stop runs of
    every other method (nor `fl-lightning list`)."""
    if None in _LOADED or name in _LOADED:
        return
    _LOADED.add(name)
    for ep in entry_points(group=METHOD_ENTRY_POINTS):
        if name is not None and ep.name != name:
            continue
        try:
            ep.load()  # importing the module registers its methods
        except Exception as e:
            logging.getLogger("fl_lightning").warning(
                "entry point %s = %s (group %s) failed to import, its methods are not registered: %s: %s",
                ep.name, ep.value, METHOD_ENTRY_POINTS, type(e).__name__, e,
            )  # fmt: skip


METHODS.load = _import_entry_points
_import_package_configs()
