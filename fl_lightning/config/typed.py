"""The typed config: the composed tree turned once into `RootConfig` (`typed`), the only form of
a run's config that leaves this package, and its two plain forms (`tree`: W&B's run config;
`to_yaml`: a run's config.yaml). `method` is the method's own config dataclass (its `name` a
class attribute); `model` and `text` stay mappings, since each builder takes keys of its own
(`name` plus its arguments)."""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..core.errors import ConfigError
from ..core.method import MethodConfig
from ..core.run_config import RootConfig
from .composition import (
    _bool_keys,
    _nonfinite,
    _schema_errors,
    check_bools,
    compose_tree,
    method_modules,
    schema,
    sections,
)


def compose(overrides: list[str]) -> RootConfig:
    """The run config from `conf/` and `overrides` (`key=value`, `group=name`,
    `+experiment=name`), checked and typed; ConfigError (one line) on any problem. Torch-free
    for every method of the package; a method from another module (`methods=`) is imported."""
    return typed(compose_tree(overrides))


def typed(cfg: DictConfig) -> RootConfig:
    """A checked tree (`compose_tree`, a saved config.yaml) as the typed `RootConfig`, its
    `method` the method's config dataclass with every key (its defaults under what was set),
    so that config.yaml records them all and a default changed later does not change what
    `run --from` or a resume of that run does."""
    from ..methods import import_methods

    import_methods(method_modules(cfg.methods))
    run = sections(cfg)
    run.method = method_config(cfg)
    return run


def method_config(cfg: DictConfig) -> MethodConfig:
    """The run's method config: its dataclass (the one source of its defaults) with the keys
    the conf file, a preset and the command line set; ConfigError naming a bad value. The
    method's modules must be imported (`typed` does)."""
    from ..methods import METHODS

    cls = METHODS.config(cfg.method.name)
    raw = OmegaConf.to_container(cfg.method, resolve=True)
    assert isinstance(raw, dict)
    keys = {k: v for k, v in raw.items() if k != "name"}  # the registered name: not a key of the dataclass
    check_bools({"method": keys}, _bool_keys(cls, "method."))  # cfg.method is untyped: its raw values
    try:
        values = OmegaConf.create(keys)
        method_cfg = OmegaConf.to_object(OmegaConf.merge(schema(cls, shared=True), values))  # merge copies it
    except OmegaConfBaseException as e:
        raise _schema_errors(e) from None
    assert isinstance(method_cfg, MethodConfig)
    bad = _nonfinite(dataclasses.asdict(method_cfg), "method")
    if bad is not None:  # e.g. method.mu=nan: a string until the method's schema types it
        raise ConfigError(f"{bad} must be a finite number (got {cfg.method[bad.split('.', 1)[1]]})")
    return method_cfg


def to_node(cfg: RootConfig) -> DictConfig:
    """A copy of `cfg` as an OmegaConf tree, its method config with its registered `name` back
    (a class attribute of the dataclass, a key of config.yaml)."""
    node = OmegaConf.structured(cfg)
    if isinstance(cfg.method, MethodConfig):
        method = OmegaConf.to_container(node.method, resolve=True)
        assert isinstance(method, dict)
        OmegaConf.set_struct(node, False)
        node.method = OmegaConf.create({"name": type(cfg.method).name, **method})
        OmegaConf.set_struct(node, True)
    return node


def tree(cfg: RootConfig) -> dict[str, Any]:
    """A config as plain data (W&B's run config)."""
    out = OmegaConf.to_container(to_node(cfg), resolve=True)
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}


def to_yaml(cfg: RootConfig) -> str:
    """A config as config.yaml holds it."""
    return OmegaConf.to_yaml(to_node(cfg), resolve=True)
