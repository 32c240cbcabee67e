"""One file per method; importing this package registers every method in `METHODS`.

A method registers by being imported (`@METHODS.register("name")` on its strategy):

- every module of this package is imported here, so a new file in `methods/` is registered
  without editing this one;
- an installed package registers its own methods by naming their modules under the entry-point
  group `fl_lightning.methods`, imported here as well (in the driver and in every worker):

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
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from ..core.errors import ConfigError
from ..core.registry import METHOD_ENTRY_POINTS, Registry
from ..core.state_classes import register_state_classes

if TYPE_CHECKING:
    from ..core.strategy import Strategy


class _MethodRegistry(Registry["type[Strategy]"]):  # a string: Strategy is imported for typing only
    """A strategy that does not set `name` itself is called by its registered name (not its
    base class's: summaries, W&B and messages name it)."""

    def register(self, name: str) -> Callable[[type[Strategy]], type[Strategy]]:
        deco = super().register(name)

        def named(strategy: type[Strategy]) -> type[Strategy]:
            if "name" not in vars(strategy):
                strategy.name = name
            return deco(strategy)

        return named


# a method's state classes are what its checkpoints may rebuild (nothing is imported then)
METHODS: Registry[type[Strategy]] = _MethodRegistry("method", on_register=register_state_classes)

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
        mine = [n for n in METHODS.names() if _within(METHODS.get(n).__module__, module)]
        if not mine:
            raise ConfigError(f"{what}={module} registers no method (no @METHODS.register in it)")
        found += mine
    return found


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _import_package_modules() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def _import_entry_points() -> None:
    """A package whose module fails to import is one warning, and its methods are unknown: a
    broken plugin must not stop runs of every other method (nor `fl-lightning list`)."""
    for ep in entry_points(group=METHOD_ENTRY_POINTS):
        try:
            ep.load()  # importing the module registers its methods
        except Exception as e:
            logging.getLogger("fl_lightning").warning(
                "entry point %s = %s (group %s) failed to import, its methods are not registered: %s: %s",
                ep.name, ep.value, METHOD_ENTRY_POINTS, type(e).__name__, e,
            )  # fmt: skip


_import_package_modules()
_import_entry_points()
