"""A method's declaration: its config dataclass, registered by name. Imports no torch, so the
command line checks a run's method (its keys, values and `check`) in well under a second,
before Ray, torch or any data start.

    @METHODS.register("fedfoo")          # the name, once
    @dataclass
    class FedFooConfig(MethodConfig):    # the `method.*` keys and their defaults
        mu: float = 0.01

        def check(self, run: RootConfig) -> None:   # every refusal, one ConfigError line
            if self.mu < 0:
                raise ConfigError(f"method.mu must be >= 0 (got {self.mu})")

        def check_model(self, model: nn.Module, task: TaskInfo) -> None:  # what the built model shows
            ...

    class FedFoo(Strategy[FedFooConfig, ServerState, Broadcast]): ...   # found by its config

`METHODS.get(name)` is the strategy whose generic config argument is the registered class
(`Strategy.__init_subclass__` records it); `METHODS.config(name)` the config class alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from .run_config import RootConfig
    from .strategy import Strategy, TaskInfo


@dataclass
class MethodConfig:
    """The hyperparameters of a method (its `method.*` keys, with their defaults) and its one
    `check`. `name` and `personalised` are class attributes, not keys: the registry sets
    `name`; `personalised = True` declares a method without one global model (evaluated on
    each client's own test split, so the run needs `data.client_test_fraction`);
    `single_label = "<why>"` one that needs single-label data."""

    name: ClassVar[str] = "fedavg"
    personalised: ClassVar[bool] = False
    #: why the method needs one class per example ("class prototypes"); empty: any labels.
    #: Multi-label data is then refused in one line, from the dataset's registry entry.
    single_label: ClassVar[str] = ""
    #: keys a resume may change (`method.<key>=...`), none by default: only what does not change
    #: the numbers, or what lets an older run go on (SCAFFOLD's `allow_momentum`)
    resumable: ClassVar[tuple[str, ...]] = ()

    def check(self, run: RootConfig) -> None:
        """Refuse a run this method cannot do (a bad value, a dataset, model, optimiser or text
        encoder it cannot take) with one ConfigError line. Called on the typed run config
        before torch, Ray or any data start. Default: accept."""

    def check_model(self, model: nn.Module, task: TaskInfo) -> None:
        """Refuse a model this method cannot train (no batch norm for FedBN, no linear `head`
        for CReFF) with one ConfigError line: what only the built model shows. Called on the
        driver's model (client 0's architecture) once it is built, before the run directory
        exists or Ray starts (`runtime/build.py::prepare`), so a refused run leaves nothing
        behind. Default: accept."""

    def keeps_personal_models(self) -> bool:
        """Whether this run keeps personal models (`personalised`; a method whose keys decide
        it overrides this): such a run is refused without clients' own test splits."""
        return self.personalised


ConfigC = TypeVar("ConfigC", bound=type[MethodConfig])


def needs_test_split_error(name: str) -> str:
    return (
        f"{name} keeps personal models, evaluated on each client's own test split: "
        "set data.client_test_fraction=0.25 (or another fraction in (0, 1))"
    )


def implementation_module(config_cls: type) -> str:
    """Where a method's strategy lives: beside its config (one file), or, for a config in a
    `configs` package (`fl_lightning.methods.configs.fedprox`, torch-free), the sibling of that
    package with the same module name (`fl_lightning.methods.fedprox`)."""
    head, _, leaf = config_cls.__module__.rpartition(".")
    package, _, last = head.rpartition(".")
    return f"{package}.{leaf}" if last == "configs" else config_cls.__module__


class MethodRegistry:
    """Method name -> config class (registered) and -> strategy class (recorded by the
    strategy's definition). `load` (set by `fl_lightning.methods`) imports what may register
    a name not known yet: installed packages' entry points."""

    kind = "method"

    def __init__(self) -> None:
        self._configs: dict[str, type[MethodConfig]] = {}
        self._strategies: dict[type[MethodConfig], type[Strategy[Any, Any, Any]]] = {}
        self.on_strategy: Callable[[type[Strategy[Any, Any, Any]]], None] | None = None
        self.load: Callable[[str | None], None] = lambda name: None

    def register(self, name: str) -> Callable[[ConfigC], ConfigC]:
        """Declare method `name` by its config class (a `MethodConfig` dataclass)."""

        def deco(cls: ConfigC) -> ConfigC:
            if not (isinstance(cls, type) and issubclass(cls, MethodConfig)):
                raise TypeError(f"METHODS.register({name!r}) takes a MethodConfig subclass, not {cls!r}")
            known = self._configs.get(name)
            if known is not None and known.__qualname__ != cls.__qualname__:
                raise KeyError(f"method {name!r} is already registered")
            if "name" in vars(cls) and cls.name != name:  # one class, one method
                raise KeyError(f"{cls.__qualname__} is already registered as {cls.name!r}")
            cls.name = name
            self._configs[name] = cls
            return cls

        return deco

    def is_registered(self, config_cls: type) -> bool:
        """Whether `config_cls` itself is registered (not a base class of one)."""
        return self._configs.get(getattr(config_cls, "name", "")) is config_cls

    def add_strategy(self, config_cls: type[MethodConfig], strategy: type[Strategy[Any, Any, Any]]) -> None:
        """Record `strategy` as the one for `config_cls` (`Strategy.__init_subclass__`)."""
        self._strategies[config_cls] = strategy
        if self.on_strategy is not None:
            self.on_strategy(strategy)

    def config(self, name: str) -> type[MethodConfig]:
        """The config class of method `name` (no torch unless its module imports it)."""
        if name not in self._configs:
            self.load(name)
        try:
            return self._configs[name]
        except KeyError:
            raise ConfigError(
                f"unknown method {name!r}; valid: {', '.join(self.names()) or '(none)'}"
            ) from None

    def get(self, name: str) -> type[Strategy[Any, Any, Any]]:
        """The strategy class of method `name` (imports its module)."""
        cls = self.config(name)
        if cls not in self._strategies:
            importlib.import_module(implementation_module(cls))
        try:
            return self._strategies[cls]
        except KeyError:
            raise ConfigError(
                f"method {name!r} has no strategy: no Strategy[{cls.__qualname__}, ...] in "
                f"{implementation_module(cls)}"
            ) from None

    def names(self) -> list[str]:
        self.load(None)
        return sorted(self._configs)

    def registered(self) -> list[str]:
        """The names registered so far (imports nothing)."""
        return sorted(self._configs)

    def __contains__(self, name: object) -> bool:
        return name in self._configs


#: every method, in the package or outside it (`fl_lightning.methods` fills it)
METHODS = MethodRegistry()
