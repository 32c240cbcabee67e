"""Configuration: compose `conf/` with command-line overrides, then validate.

    fl-lightning run method=fedavg data=fmnist fl.rounds=5 data.alpha=0.3 seed=1

`group=name` picks `conf/<group>/<name>.yaml`; `+experiment=name` applies the preset
`conf/experiment/<name>.yaml` (group choices under `defaults:` plus value overrides);
`a.b=value` overrides one value. Precedence, low to high: config.yaml, chosen group
files, experiment, command line. Every key is checked against a typed schema, so a
typo is an error, never silently ignored. This module imports no torch, Ray or W&B:
bad input is rejected in well under a second.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .core.errors import ConfigError
from .core.optim import OptimConfig

GROUPS = ("method", "data", "model", "text", "runtime", "logger")


def conf_dir() -> Path:
    """`$FL_LIGHTNING_CONF`, else the `conf/` folder next to the package."""
    env = os.environ.get("FL_LIGHTNING_CONF")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "conf"


@dataclass
class FLConfig:
    rounds: int = 10
    num_clients: int = 10
    clients_per_round: Optional[int] = None  # overrides `fraction` when set
    fraction: float = 1.0
    local_epochs: int = 1
    local_steps: Optional[int] = None  # caps optimizer steps per fit when set
    batch_size: int = 64
    max_client_failures: int = 0  # clients allowed to fail per round (dropped, logged)


@dataclass
class DataConfig:
    name: str = "fmnist"
    root: str = "${oc.env:FL_LIGHTNING_DATA,'~/.cache/fl_lightning/data'}"
    download: bool = False
    partition: str = "dirichlet"  # iid | dirichlet | dirichlet_balanced | shards | longtail | domain | ...
    alpha: float = 0.5  # Dirichlet concentration (dirichlet, dirichlet_balanced, longtail, multilabel_dirichlet)
    min_size: int = 10  # dirichlet: every client gets at least this many samples
    classes_per_client: int = 2  # shards: exactly this many classes per client
    imbalance_factor: float = 1.0  # long tail: max/min class count (cifar*_lt datasets, longtail partition)
    client_test_fraction: float = 0.0
    train_subset: Optional[int] = None  # first N training samples (quick runs, tests)
    test_subset: Optional[int] = None
    image_size: Optional[int] = None  # folder/HDF5 datasets: resize to this square size (default per dataset)
    domains: Optional[list[str]] = None  # domain datasets: which domains to load (default: all)
    fine_grained: bool = False  # flair: the 1,628 fine-grained labels instead of the 17 coarse ones
    max_users: Optional[int] = None  # flair: read only the first N training users
    cache_partitions: bool = True  # cache splits in <root>/.partitions/<hash>.npz


@dataclass
class EvalConfig:
    every: int = 1
    batch_size: int = 1000
    clients: bool = True  # also evaluate on each client's own test split, when it has one
    device: str = "auto"  # where the driver evaluates the global model: auto (cuda if any) | cpu | cuda


@dataclass
class RuntimeConfig:
    executor: str = "ray"  # ray | serial
    address: Optional[str] = None  # "auto" or host:port joins a cluster; null: $RAY_ADDRESS (a Ray job's cluster), else local
    placement: str = "auto"  # auto | per_client | pool
    num_actors: Optional[int] = None  # pool size; default: one per CPU (or GPU)
    num_cpus: Optional[int] = None  # size of a local Ray instance; default: all
    num_gpus: Optional[int] = None
    cpus_per_client: Optional[float] = None  # CPUs per actor; default: an even share
    gpus_per_client: Optional[float] = None  # default: 1 when GPUs exist
    threads_per_client: Optional[int] = None  # torch threads per fit; default: CPU share
    accelerator: str = "auto"  # auto | cpu | gpu
    placement_strategy: str = "PACK"  # GPU placement group: PACK | SPREAD | STRICT_PACK | STRICT_SPREAD
    schedule_timeout_s: Optional[float] = 120.0  # wait this long for the GPU bundles; null: forever


@dataclass
class LoggerConfig:
    backend: str = "wandb"  # wandb | none
    project: str = "fl_lightning"
    entity: Optional[str] = None
    group: Optional[str] = None  # default: the experiment name
    mode: str = "auto"  # auto (online with an API key, else offline) | online | offline | disabled
    tags: list[str] = field(default_factory=list)


@dataclass
class RootConfig:
    experiment: str = "default"
    seed: int = 0
    output_dir: str = "runs"
    run_id: Optional[str] = None
    method: Any = None
    data: DataConfig = field(default_factory=DataConfig)
    model: Any = None
    text: Any = None
    fl: FLConfig = field(default_factory=FLConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


def choices(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def _group_file(group: str, name: str) -> dict:
    path = conf_dir() / group / f"{name}.yaml"
    if not path.is_file():
        valid = ", ".join(choices(group)) or "(none)"
        raise ConfigError(f"unknown {'dataset' if group == 'data' else group} {name!r}; valid: {valid}")
    data = _read_yaml(path)
    if group in ("method", "data", "model", "text"):
        data.setdefault("name", name)  # the registry name
    return data


def _parse(overrides: list[str]) -> tuple[dict[str, str], str | None, list[str]]:
    groups: dict[str, str] = {}
    experiment = None
    dotted: list[str] = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"bad override {item!r}: expected key=value")
        key, value = item.split("=", 1)
        if key in ("+experiment", "experiment") and key.startswith("+"):
            experiment = value
        elif key in GROUPS:
            groups[key] = value
        elif key.lstrip("+") != key:
            raise ConfigError(f"bad override {item!r}: only +experiment=<name> takes a '+'")
        else:
            dotted.append(item)
    return groups, experiment, dotted


def _schema_errors(e: OmegaConfBaseException) -> ConfigError:
    key = getattr(e, "full_key", None) or getattr(e, "key", None)
    msg = str(e).splitlines()[0]
    if "not in struct" in msg or "Key '" in msg and "not" in msg:
        return ConfigError(f"unknown config key {key!r}")
    return ConfigError(f"bad value for {key!r}: {msg}" if key else msg)


def compose(overrides: list[str]) -> DictConfig:
    """Build the run config from `conf/` and overrides; raise ConfigError on any problem."""
    base = _read_yaml(conf_dir() / "config.yaml")
    defaults = dict(base.pop("defaults", {}) or {})
    groups, experiment, dotted = _parse(overrides)
    preset: dict = {}
    if experiment is not None:
        path = conf_dir() / "experiment" / f"{experiment}.yaml"
        if not path.is_file():
            raise ConfigError(f"unknown experiment {experiment!r}; valid: {', '.join(choices('experiment')) or '(none)'}")
        preset = _read_yaml(path)
        defaults.update(preset.pop("defaults", {}) or {})
        preset.setdefault("experiment", experiment)
    defaults.update(groups)
    missing = [g for g in GROUPS if g not in defaults]
    if missing:
        raise ConfigError(f"config.yaml names no default for: {', '.join(missing)}")
    try:
        cfg = OmegaConf.structured(RootConfig)
        OmegaConf.set_struct(cfg, False)
        cfg.merge_with({g: _group_file(g, defaults[g]) for g in GROUPS if g not in ("data",)})
        OmegaConf.set_struct(cfg, True)
        for g in ("method", "model", "text"):
            OmegaConf.set_struct(cfg[g], True)
        cfg.merge_with({"data": _group_file("data", defaults["data"])})
        cfg.merge_with(base)
        cfg.merge_with(preset)
        cfg.merge_with(OmegaConf.from_dotlist(dotted))
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise _schema_errors(e) from None
    validate(cfg)
    return cfg


def clients_per_round(cfg: DictConfig) -> int:
    fl = cfg.fl
    if fl.clients_per_round is not None:
        return int(fl.clients_per_round)
    return max(1, int(round(fl.fraction * fl.num_clients)))


def _check_kwargs(kind: str, name: str, fn: Any, given: dict) -> None:
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(given) - set(params))
    if unknown:
        raise ConfigError(f"unknown config key {kind}.{unknown[0]!r} for {kind} {name!r}; valid: {', '.join(k for k in params if k not in ('num_classes', 'in_channels', 'image_size'))}")


def validate(cfg: DictConfig) -> None:
    """Semantic checks that need no heavy imports."""
    fl, data, rt = cfg.fl, cfg.data, cfg.runtime

    def positive(key: str, value: Any) -> None:
        if value is not None and value <= 0:
            raise ConfigError(f"{key} must be > 0 (got {value})")

    for key in ("rounds", "num_clients", "local_epochs", "batch_size", "clients_per_round", "local_steps"):
        positive(f"fl.{key}", fl[key])
    positive("data.alpha", data.alpha)
    positive("eval.every", cfg.eval.every)
    positive("optim.lr", cfg.optim.lr)
    for key in ("train_subset", "test_subset"):
        positive(f"data.{key}", data[key])
    if not 0 < fl.fraction <= 1:
        raise ConfigError(f"fl.fraction must be in (0, 1] (got {fl.fraction})")
    if clients_per_round(cfg) > fl.num_clients:
        raise ConfigError(
            f"fl.clients_per_round={clients_per_round(cfg)} exceeds fl.num_clients={fl.num_clients}"
        )
    if fl.max_client_failures < 0:
        raise ConfigError(f"fl.max_client_failures must be >= 0 (got {fl.max_client_failures})")
    if not 0 <= data.client_test_fraction < 1:
        raise ConfigError(f"data.client_test_fraction must be in [0, 1) (got {data.client_test_fraction})")
    if data.min_size < 0:
        raise ConfigError(f"data.min_size must be >= 0 (got {data.min_size})")
    for key in ("classes_per_client", "image_size", "max_users"):
        positive(f"data.{key}", data[key])
    if data.imbalance_factor < 1:
        raise ConfigError(f"data.imbalance_factor must be >= 1 (got {data.imbalance_factor})")
    if data.partition == "longtail" and data.imbalance_factor <= 1:
        raise ConfigError("data.partition=longtail needs data.imbalance_factor > 1 (e.g. 10, 50, 100)")
    enums = {
        "runtime.executor": (rt.executor, ("ray", "serial")),
        "runtime.placement": (rt.placement, ("auto", "per_client", "pool")),
        "runtime.accelerator": (rt.accelerator, ("auto", "cpu", "gpu")),
        "runtime.placement_strategy": (rt.placement_strategy, ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")),
        "logger.backend": (cfg.logger.backend, ("wandb", "none")),
        "logger.mode": (cfg.logger.mode, ("auto", "online", "offline", "disabled")),
        "optim.name": (cfg.optim.name, ("sgd", "adam")),
        "eval.device": (cfg.eval.device, ("auto", "cpu", "cuda")),
    }
    for key, (value, valid) in enums.items():
        if value not in valid:
            raise ConfigError(f"{key}={value!r} is not one of: {', '.join(valid)}")
    for key in ("num_actors", "num_cpus", "cpus_per_client", "gpus_per_client", "threads_per_client", "schedule_timeout_s"):
        positive(f"runtime.{key}", rt[key])
    if rt.num_gpus is not None and rt.num_gpus < 0:
        raise ConfigError(f"runtime.num_gpus must be >= 0 (got {rt.num_gpus})")


def validate_registered(cfg: DictConfig) -> None:
    """Checks against the registries (imports the methods, models and datasets)."""
    from .data.datasets import DATASETS
    from .data.partition import PARTITIONERS
    from .methods import METHODS
    from .models import MODELS

    strategy = METHODS.get(cfg.method.name)
    try:
        OmegaConf.merge(OmegaConf.structured(strategy.config_cls), cfg.method)
    except OmegaConfBaseException as e:
        raise _schema_errors(e) from None
    model_kwargs = {k: v for k, v in cfg.model.items() if k != "name"}
    _check_kwargs("model", cfg.model.name, MODELS.get(cfg.model.name), model_kwargs)
    DATASETS.get(cfg.data.name)
    PARTITIONERS.get(cfg.data.partition)
    if cfg.text.name != "none":
        from .text import TEXT_ENCODERS

        text_kwargs = {k: v for k, v in cfg.text.items() if k != "name"}
        _check_kwargs("text", cfg.text.name, TEXT_ENCODERS.get(cfg.text.name), text_kwargs)


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


RESUMABLE = ("fl.rounds", "runtime.", "logger.", "eval.batch_size", "eval.device")


def load_run_config(run_dir: Path, overrides: list[str]) -> DictConfig:
    """The resolved config of an existing run, with the few overrides a resume may change."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" not in item or not any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESUMABLE):
            raise ConfigError(
                f"cannot change {key!r} on resume; only fl.rounds, runtime.*, logger.*, eval.batch_size and eval.device"
            )
    try:
        cfg = OmegaConf.structured(RootConfig)
        OmegaConf.set_struct(cfg, False)
        cfg.merge_with(_read_yaml(path))
        OmegaConf.set_struct(cfg, True)
        cfg.merge_with(OmegaConf.from_dotlist(overrides))
    except OmegaConfBaseException as e:
        raise _schema_errors(e) from None
    validate(cfg)
    return cfg
