"""Checks against the registries (methods, models, datasets, text encoders: imported here, lazily)
and the typed config the rest of the package reads (`typed`), with its two plain forms
(`tree`: W&B's run config; `to_yaml`: a run's config.yaml)."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..core.errors import ConfigError
from ..core.optim import OptimConfig
from .composition import _bool_keys, _nonfinite, _schema_errors, check_bools, method_modules, sections
from .schema import RootConfig, client_tests, variant_of


def check_kwargs(kind: str, name: str, fn: Any, given: dict) -> None:
    """ConfigError naming the first key of `given` that `fn` (a registered builder) does not take."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(given) - set(params))
    if unknown:
        valid = ", ".join(k for k in params if k not in ("num_classes", "in_channels", "image_size"))
        raise ConfigError(f"unknown config key {kind}.{unknown[0]!r} for {kind} {name!r}; valid: {valid}")


def check_weights_file(cfg: DictConfig) -> None:
    """`model.weights` names an existing file (cheap, no torch: before Ray starts); what it
    holds is read safely in `validate_registered`, whether it fits once the model is built."""
    w = cfg.model.get("weights")
    if w and not Path(str(w)).expanduser().is_file():
        raise ConfigError(f"model.weights={w}: no such file (write one with `fl-lightning pretrain`)")


def validate_registered(cfg: DictConfig, trunk: str | None = None) -> Any:
    """Checks against the registries (imports the methods, models and datasets); the run's
    method config (`method_config`), checked. `trunk`: where `model.weights` is read from
    (a resumed run's own copy, `models.weights.KEPT`; default: the file it names)."""
    from ..data.partition import PARTITIONERS
    from ..data.registry import DATASETS
    from ..methods import METHODS, import_methods
    from ..models import MODELS

    import_methods(method_modules(cfg.methods))
    strategy = METHODS.get(cfg.method.name)
    method_cfg = method_config(cfg)
    optim_cfg = sections(cfg).optim
    check_method(strategy, method_cfg, optim_cfg, cfg)
    if cfg.runtime.batched:  # before any data; the model's layers once it is built (`model_refusal`)
        from ..core.batched import batched_refusal
        from ..models import family

        why = batched_refusal(cfg.method.name, strategy.objective_cls, optim_cfg, cfg.runtime.precision,
                              family(cfg.model.name) is not None)  # fmt: skip
        if why:
            raise ConfigError(f"runtime.batched={cfg.runtime.batched}: {why}; use runtime.batched=0")
    entry = DATASETS.get(cfg.data.name)  # what is known of the data before loading it
    # clients' own test splits come from data.client_test_fraction alone (data/federated.py)
    if strategy.keeps_personal_models(method_cfg) and not client_tests(cfg.data):
        raise ConfigError(strategy.needs_test_split_error())
    if cfg.eval.timing == "trained" and not (client_tests(cfg.data) and cfg.eval.clients):
        raise ConfigError(
            "eval.timing=trained evaluates each client's trained model on its own test split: "
            "set data.client_test_fraction (and eval.clients=true)"
        )
    from ..models import family
    from ..models.weights import MODEL_GENERIC_KEYS, read_weights

    model_kwargs = {k: v for k, v in cfg.model.items() if k not in MODEL_GENERIC_KEYS}
    check_kwargs("model", cfg.model.name, MODELS.get(cfg.model.name), model_kwargs)
    flag = getattr(MODELS.get(cfg.model.name), "method_flag", None)  # a model some methods only train
    if flag and not getattr(strategy, flag, False):
        trainers = ", ".join(n for n in METHODS.names() if getattr(METHODS.get(n), flag, False))
        raise ConfigError(
            f"model={cfg.model.name} is trained by method={trainers} only (got method={cfg.method.name})"
        )
    if cfg.data.image_size is not None:  # (the channel count is not known yet; sizes do not depend on it)
        from ..models import check_image_size

        num_classes = len(entry.class_names) if entry.class_names else 10
        check_image_size(cfg.model.name, num_classes, 3, int(cfg.data.image_size), **model_kwargs)
    if cfg.model.get("weights"):  # readable and safe now; whether it fits, once the model is built
        if family(cfg.model.name) is not None:
            raise ConfigError(
                f"model.weights loads one trunk; model {cfg.model.name} is a family of architectures"
            )
        read_weights(trunk or str(cfg.model.weights))
    DATASETS.get(cfg.data.name)
    PARTITIONERS.get(cfg.data.partition)
    if cfg.text.name != "none":
        from ..text import TEXT_ENCODERS

        text_kwargs = {k: v for k, v in cfg.text.items() if k != "name"}
        check_kwargs("text", cfg.text.name, TEXT_ENCODERS.get(cfg.text.name), text_kwargs)
    return method_cfg


def check_method(strategy: Any, method_cfg: Any, optim: OptimConfig, cfg: DictConfig) -> None:
    """The method's own checks of the run, before any data: an optimiser its algorithm does not
    hold under (SCAFFOLD: momentum; `check_optim`, where it has one) and a run it cannot do
    (CLIP2FL's teacher=clip without CLIP weights; `check_run`). One call, so that the method
    API decides alone what a method declares."""
    from ..data.registry import DATASETS

    check_optim = getattr(strategy, "check_optim", None)
    if callable(check_optim):
        check_optim(method_cfg, optim)
    run = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(run, dict)
    entry = DATASETS.get(cfg.data.name)  # what is known of the data before loading it
    known = {"multilabel": entry.multilabel, "class_names": entry.class_names}
    strategy.check_run(method_cfg, {str(k): v for k, v in run.items()} | {"dataset": known})


def method_config(cfg: DictConfig) -> Any:
    """The run's method config: its dataclass (the one source of its defaults) with the keys
    the conf file, a preset and the command line set; ConfigError naming a bad value. The
    method must be registered (`validate_registered` imports the modules)."""
    from ..methods import METHODS

    cls = METHODS.get(cfg.method.name).config_cls
    if dataclasses.is_dataclass(cls):  # cfg.method is untyped: its raw values
        check_bools({"method": OmegaConf.to_container(cfg.method, resolve=False)}, _bool_keys(cls, "method."))
    try:
        method_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), cfg.method))
    except OmegaConfBaseException as e:
        raise _schema_errors(e) from None
    if dataclasses.is_dataclass(method_cfg) and not isinstance(method_cfg, type):
        bad = _nonfinite(dataclasses.asdict(method_cfg), "method")
        if bad is not None:  # e.g. method.mu=nan: a string until the method's schema types it
            raise ConfigError(f"{bad} must be a finite number (got {cfg.method[bad.split('.', 1)[1]]})")
    return method_cfg


def with_method_defaults(cfg: DictConfig) -> DictConfig:
    """`cfg` with every key of its method written out: the dataclass's defaults under what was
    set. What `fl-lightning config` prints and a run's config.yaml records, so that a default
    changed later does not change what `run --from` or a resume of that run does."""
    from ..methods import import_methods

    import_methods(method_modules(cfg.methods))
    values = OmegaConf.structured(method_config(cfg))
    out = copy.deepcopy(cfg)
    OmegaConf.set_struct(out, False)
    out.method = OmegaConf.create(OmegaConf.to_container(values, resolve=True))
    OmegaConf.set_struct(out, True)
    return out


def typed(cfg: DictConfig) -> RootConfig:
    """The composed tree turned once into the typed `RootConfig` the runtime reads (mypy checks
    every read of it): `method` the method's own config dataclass; `model` and `text` stay
    mappings, since each builder takes keys of its own (`name` plus its arguments)."""
    run = OmegaConf.to_object(cfg)
    assert isinstance(run, RootConfig)
    run.method = method_config(cfg)
    return run


def tree(cfg: DictConfig | RootConfig) -> dict[str, Any]:
    """A config as plain data (W&B's run config)."""
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)
    out = OmegaConf.to_container(node, resolve=True)
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}


def to_yaml(cfg: DictConfig | RootConfig) -> str:
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)
    return OmegaConf.to_yaml(node, resolve=True)


def resolved_config(
    cfg: DictConfig, chosen: dict[str, Any], model: str, model_kwargs: dict[str, Any]
) -> RootConfig:
    """The typed config with the choices made while building written in as values, so that
    config.yaml and W&B hold what runs and a run from config.yaml builds the same: the method's
    (`chosen`: `Strategy.resolved`, e.g. FedGLCL's projector, the text encoder a text method
    fell back to), the backbone's keyword arguments as built (`model_kwargs`: FedTSP and CLIP2FL
    set the feature dimension to the text's), the W&B group (the experiment when unset) and the
    variant (`variant_of`). The run id and the placement are written when they are known
    (`runtime/runner.py`)."""
    from ..text.encoders import resolved_text

    out = copy.deepcopy(with_method_defaults(cfg))  # every method key, its dataclass's defaults too
    OmegaConf.set_struct(out, False)
    OmegaConf.set_struct(out.method, False)  # a key the method file leaves to its schema
    if "text" in chosen:  # the whole group: an encoder's keys are not `none`'s
        out.text = OmegaConf.create(chosen["text"])
    out.merge_with({k: v for k, v in chosen.items() if k != "text"})
    # the builder's arguments as built, and the pretrained trunk the initial weights came from
    out.model = OmegaConf.create({"name": model, **model_kwargs, "weights": cfg.model.get("weights")})
    if out.logger.group is None:
        out.logger.group = out.experiment
    out.variant = variant_of(out)
    out.data.root = os.path.expanduser(out.data.root)  # the folder read, not `~/...`
    if out.text.name != "none":  # the encoder's files and device as used (path null, device auto)
        text = OmegaConf.to_container(out.text, resolve=True)
        assert isinstance(text, dict)
        out.text = OmegaConf.create(resolved_text({str(k): v for k, v in text.items()}))
    for node in (out, out.method, out.model, out.text):
        OmegaConf.set_struct(node, True)
    return typed(out)
