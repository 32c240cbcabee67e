"""Checks of the typed config against the registries (methods, models, datasets, text encoders:
imported here, lazily), and the config as a run records it (`resolved_config`)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ..core.errors import ConfigError
from ..core.method import MethodConfig
from ..core.run_config import RootConfig, client_tests, variant_of
from .typed import to_node, typed


def check_kwargs(kind: str, name: str, fn: Any, given: dict) -> None:
    """ConfigError naming the first key of `given` that `fn` (a registered builder) does not take."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(given) - set(params))
    if unknown:
        valid = ", ".join(k for k in params if k not in ("num_classes", "in_channels", "image_size"))
        raise ConfigError(f"unknown config key {kind}.{unknown[0]!r} for {kind} {name!r}; valid: {valid}")


def check_weights_file(cfg: RootConfig) -> None:
    """`model.weights` names an existing file (cheap, no torch: before Ray starts); what it
    holds is read safely in `validate_registered`, whether it fits once the model is built."""
    w = cfg.model.get("weights")
    if w and not Path(str(w)).expanduser().is_file():
        raise ConfigError(f"model.weights={w}: no such file (write one with `fl-lightning pretrain`)")


def validate_registered(cfg: RootConfig, trunk: str | None = None) -> MethodConfig:
    """Checks against the registries (imports the methods, models and datasets); the run's
    method config, checked. `trunk`: where `model.weights` is read from (a resumed run's own
    copy, `models.weights.KEPT`; default: the file it names)."""
    from ..data.partition import PARTITIONERS
    from ..data.registry import DATASETS
    from ..methods import METHODS
    from ..models import MODELS

    cfg.check()  # the sections' own checks again (cheap): a value set since it was composed
    method_cfg = check_method(cfg)  # again (cheap): also where no command line ran it
    name, model = type(method_cfg).name, str(cfg.model["name"])
    strategy = METHODS.get(name)
    if cfg.runtime.batched:  # before any data; the model's layers once it is built (`model_refusal`)
        from ..core.batched import batched_refusal
        from ..models import family

        why = batched_refusal(name, strategy.objective_cls, cfg.optim, cfg.runtime.precision,
                              family(model) is not None)  # fmt: skip
        if why:
            raise ConfigError(f"runtime.batched={cfg.runtime.batched}: {why}; use runtime.batched=0")
    from ..core.objective import ClientObjective

    if cfg.privacy.name == "dp_sgd" and strategy.objective_cls is not ClientObjective:
        raise ConfigError(
            f"privacy=dp_sgd computes per-example gradients of FedAvg's client loss; method {name}'s "
            "client objective adds its own terms, which Opacus would not clip: use a method that "
            "trains FedAvg's objective (fedavg, fedavgm, fedadam, ...)"
        )
    entry = DATASETS.get(cfg.data.name)  # what is known of the data before loading it
    if cfg.eval.timing == "trained" and not (client_tests(cfg.data) and cfg.eval.clients):
        raise ConfigError(
            "eval.timing=trained evaluates each client's trained model on its own test split: "
            "set data.client_test_fraction (and eval.clients=true)"
        )
    from ..models import family
    from ..models.weights import MODEL_GENERIC_KEYS, read_weights

    model_kwargs = {k: v for k, v in cfg.model.items() if k not in MODEL_GENERIC_KEYS}
    check_kwargs("model", model, MODELS.get(model), model_kwargs)
    own_check = getattr(MODELS.get(model), "check_config", None)  # a model's own value checks
    if own_check is not None:
        own_check(model_kwargs)
    flag = getattr(MODELS.get(model), "method_flag", None)  # a model some methods only train
    if flag and not getattr(strategy, flag, False):
        trainers = ", ".join(n for n in METHODS.names() if getattr(METHODS.get(n), flag, False))
        raise ConfigError(f"model={model} is trained by method={trainers} only (got method={name})")
    from ..models import traits

    takes = traits(model).inputs
    if takes != entry.inputs:  # an image model reads sentences' bytes as 1-pixel images, and trains
        fits = sorted(n for n in MODELS.names() if traits(n).inputs == entry.inputs)
        raise ConfigError(
            f"data={cfg.data.name} holds {entry.inputs}, and model={model} classifies {takes}: "
            f"use a model for {entry.inputs} ({' | '.join(f'model={n}' for n in fits) or 'none registered'})"
        )
    size = cfg.data.image_size if cfg.data.image_size is not None else entry.image_size
    if size is not None:  # (the channel count is not known yet; sizes do not depend on it)
        from ..models import check_image_size

        num_classes = len(entry.class_names) if entry.class_names else 10
        try:
            check_image_size(model, num_classes, 3, int(size), **model_kwargs)
        except ConfigError:
            if cfg.data.image_size is not None:
                raise
            raise ConfigError(  # the dataset's own size: data.image_size is no way out
                f"data={cfg.data.name} holds {size}x{size} images (frozen features): model={model} cannot "
                "take them; use a model for feature vectors (model=mlp or mlp3)"
            ) from None
    if cfg.model.get("weights"):  # readable and safe now; whether it fits, once the model is built
        if family(model) is not None:
            raise ConfigError(f"model.weights loads one trunk; model {model} is a family of architectures")
        read_weights(trunk or str(cfg.model["weights"]))
    DATASETS.get(cfg.data.name)
    PARTITIONERS.get(cfg.data.partition)
    if cfg.text["name"] != "none":
        from ..text import TEXT_ENCODERS

        text_kwargs = {k: v for k, v in cfg.text.items() if k != "name"}
        check_kwargs("text", cfg.text["name"], TEXT_ENCODERS.get(cfg.text["name"]), text_kwargs)
    return method_cfg


def check_method(cfg: RootConfig) -> MethodConfig:
    """The run's method config, checked: its own `check` on the run config, and the data it
    needs (clients' own test splits for personal models, single-label data where it says so).
    Torch-free for a method whose config module is (every method of this package): the command
    line calls it before Ray starts."""
    from ..core.method import needs_test_split_error
    from ..data.registry import DATASETS

    method_cfg: MethodConfig = cfg.method
    cls = type(method_cfg)
    method_cfg.check(cfg)  # its own values first: the refusal names what the user set
    if cfg.privacy.name == "dp_fedavg":  # a release the mechanism would leave without noise
        from ..core.privacy.channels import adaptive_refusal, channel_refusal

        why = channel_refusal(cls.name, method_cfg)
        if why is None and cfg.privacy.adaptive:
            why = adaptive_refusal(cls.name, method_cfg)
        if why:
            raise ConfigError(why)
    # clients' own test splits come from the data config alone (data/federated.py)
    if method_cfg.keeps_personal_models() and not client_tests(cfg.data):
        raise ConfigError(needs_test_split_error(cls.name))
    if cls.single_label and DATASETS.get(cfg.data.name).multilabel:  # known before loading
        raise ConfigError(
            f"{cls.name} needs single-label data ({cls.single_label}); data={cfg.data.name} is multi-label"
        )
    return method_cfg


def resolved_config(
    cfg: RootConfig, chosen: dict[str, Any], model: str, model_kwargs: dict[str, Any]
) -> RootConfig:
    """The typed config with the choices made while building written in as values, so that
    config.yaml and W&B hold what runs and a run from config.yaml builds the same: the method's
    (`chosen`: `Strategy.resolved`, e.g. FedGLCL's projector, the text encoder a text method
    fell back to), the backbone's keyword arguments as built (`model_kwargs`: FedTSP and CLIP2FL
    set the feature dimension to the text's), the W&B group (the experiment when unset) and the
    variant (`variant_of`). The run id and the placement are written when they are known
    (`runtime/runner.py`)."""
    from ..text.encoders import resolved_text

    out = to_node(cfg)  # a copy: every method key, its dataclass's defaults too
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
