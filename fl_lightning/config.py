"""Configuration: compose `conf/` with command-line overrides, then validate.

    fl-lightning run method=fedavg data=fmnist fl.rounds=5 data.alpha=0.3 seed=1

`group=name` picks `conf/<group>/<name>.yaml`; `+experiment=name` applies the preset
`conf/experiment/<name>.yaml` (group choices under `defaults:` plus value overrides);
`a.b=value` overrides one value. Precedence, low to high: config.yaml, chosen group
files, the method's defaults, experiment, command line.

A method file may carry `optim:` and `fl:` blocks: the method's own defaults for the
client optimiser and local training (its paper's or its authors' code's), e.g.

    # conf/method/scaffold.yaml
    name: scaffold
    optim:
      momentum: 0.0      # option-II control variates assume plain SGD

They apply above config.yaml and below an experiment preset and the command line, are
checked against the same schema (a typo is an error naming the file), and show in
`fl-lightning config method=<name>`. `optim` and `fl` are therefore never method keys.

Every key is checked against a typed schema, so a typo is an error, never silently
ignored. This module imports no torch, Ray or W&B: bad input is rejected in well under
a second. (One exception: a `method.<key>` is checked against the method's config dataclass,
the one source of its defaults, which imports the methods, and torch with them.)
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import os
import re
import sys
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .core.augment import AUGMENTATIONS
from .core.errors import ConfigError
from .core.optim import OptimConfig
from .core.registry import METHOD_ENTRY_POINTS

GROUPS = ("method", "data", "model", "text", "runtime", "logger")


def conf_dir() -> Path:
    """`$FL_LIGHTNING_CONF`, else the `conf/` folder next to the package."""
    env = os.environ.get("FL_LIGHTNING_CONF")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "conf"


@dataclass
class FLConfig:
    rounds: int = 10
    num_clients: int = 10
    clients_per_round: int | None = None  # overrides `fraction` when set
    fraction: float = 1.0
    #: [lo, hi]: unstable participation, each round int(J * num_clients) clients with J drawn
    #: uniformly, as PFLlib's random_join_ratio (the FedDTR paper's J ~ U[0.1, 1]); null: fixed
    fraction_range: list[float] | None = None
    local_epochs: int = 1
    local_steps: int | None = None  # caps optimizer steps per fit when set
    batch_size: int = 64
    max_client_failures: int = 0  # clients allowed to fail per round (dropped, logged)
    #: batch-norm running statistics of the global model: averaged (FedAvg of the clients'),
    #: recompute (pooled exactly from the sampled clients' data under the new weights), or
    #: local (each client keeps its own; evaluated on the clients' own test splits)
    bn_stats: Literal["averaged", "recompute", "local"] = "averaged"
    #: how a round's clients are drawn: uniform, or size (without replacement, each with
    #: probability its share of the training examples: FedLGT on FLAIR, Li et al. 2019)
    sampling: Literal["uniform", "size"] = "uniform"


@dataclass
class DataConfig:
    name: str = "fmnist"
    root: str = "${oc.env:FL_LIGHTNING_DATA,'~/.cache/fl_lightning/data'}"
    download: bool = False
    partition: str = "dirichlet"  # iid | dirichlet | dirichlet_balanced | shards | longtail | domain | ...
    alpha: float = 0.5  # Dirichlet concentration (dirichlet[_balanced], longtail, multilabel_dirichlet)
    min_size: int = 10  # dirichlet: every client gets at least this many samples
    classes_per_client: int = 2  # shards: exactly this many classes per client; class_blocks: C per block
    imbalance_factor: float = 1.0  # long tail: max/min class count (cifar*_lt datasets, longtail partition)
    client_test_fraction: float = 0.0
    train_subset: int | None = None  # first N training samples (quick runs, tests)
    test_subset: int | None = None
    #: FedDF / FedBE: N training images held out of every client as the server's unlabeled set
    server_subset: int | None = None
    #: resize every image to this square size when the data is loaded (cached like the decoded
    #: images); null: the dataset's own size (folder/HDF5 datasets: their default, e.g. Office 256)
    image_size: int | None = None
    #: training-time augmentation of the clients' batches, in this order (core/augment.py):
    #: random_crop (pad augment_padding, crop back), hflip (p 0.5), rotate (within
    #: +-augment_degrees); evaluation never augments
    augment: list[str] = field(default_factory=list)
    augment_padding: int = 4
    augment_degrees: float = 15.0
    domains: list[str] | None = None  # domain datasets: which domains to load (default: all)
    fine_grained: bool = False  # flair: the 1,628 fine-grained labels instead of the 17 coarse ones
    max_users: int | None = None  # flair: read only the first N training users
    #: fmnist_multilabel: build the training mosaics from the first N training images only, so
    #: images N.. stay out of every client (`fl-lightning pretrain` learns from them)
    source_subset: int | None = None
    cache_partitions: bool = True  # cache splits in <root>/.partitions/<hash>.npz
    #: few-shot protocols (data/protocols.py). shots: k training images per class, CoOp's draw
    #: (random.Random(shots_seed), random.sample per class); CoOp draws with the run seed, 1-3
    shots: int | None = None
    shots_seed: int = 1
    #: p further training images per class held out as the clients' own test splits, each client
    #: testing on those of its own classes (FLiP's personal split, p = shots); needs shots
    personal_shots: int | None = None
    #: instead, the test split's images of the classes each client trains on (PromptFL / FedOTP)
    personal_from_test: bool = False
    #: base-to-new: train on the base half of the classes (the first ceil(C/2) labels), test on
    #: all; evaluations add base_accuracy, new_accuracy, base_new_hm
    base_new: bool = False


@dataclass
class EvalConfig:
    every: int = 1
    batch_size: int = 1000
    clients: bool = True  # also evaluate on each client's own test split, when it has one
    #: which model of each client is evaluated on its own test split: `received` (the model it
    #: would start the next round from: the round's aggregate plus its personal parts; PFLlib's
    #: point, all clients) or `trained` (the model right after its local training, before it
    #: uploads; FedDTR's code; the round's participants only)
    timing: Literal["received", "trained"] = "received"
    #: with timing=received: evaluate this many clients, one seeded sample fixed for the run
    #: (the same clients every round, and for every method with the same seed), so an
    #: evaluation round's cost does not grow with fl.num_clients; null: every client
    clients_sample: int | None = None
    #: where the driver evaluates the global model (auto: cuda if any)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    per_class: bool = False  # single-label: also class_accuracy/<c> for every class
    #: long-tail groups by training-set class counts: [many_above, few_below] gives
    #: many_/medium_/few_accuracy (ImageNet-LT: [100, 20]); null: none
    longtail: list[int] | None = None
    threshold: float = 0.5  # multi-label: decision threshold on sigmoid scores (C-P, C-R, C-F1, O-*)
    #: write the final round's global scores and targets to <run dir>/predictions.npz
    save_predictions: bool = False
    #: run round r's global evaluation on a driver thread while round r + 1 trains (same numbers;
    #: the last round waits for its own); false: evaluate before the next round starts
    overlap: bool = True


@dataclass
class CheckpointConfig:
    every: int = 1  # rounds between checkpoints (the last round is always checkpointed)


@dataclass
class RuntimeConfig:
    executor: Literal["ray", "serial"] = "ray"
    # "auto" or host:port joins a cluster; null: $RAY_ADDRESS (a Ray job's cluster), else local
    address: str | None = None
    placement: Literal["auto", "per_client", "pool"] = "auto"
    num_actors: int | None = None  # pool size; default: one per CPU (or GPU)
    num_cpus: int | None = None  # size of a local Ray instance; default: all
    num_gpus: int | None = None
    cpus_per_client: float | None = None  # CPUs per actor; default: an even share
    gpus_per_client: float | None = None  # default: 1 when GPUs exist
    threads_per_client: int | None = None  # torch threads per fit; default: CPU share
    accelerator: Literal["auto", "cpu", "gpu"] = "auto"
    #: the GPU placement group's strategy
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    schedule_timeout_s: float | None = 120.0  # wait this long for the GPU bundles; null: forever
    #: clients' batches drawn by index from their shard on the fit's device (the shard is copied
    #: there once per fit); false: a torch DataLoader. Same batches, same numbers either way.
    resident_shards: bool = True
    #: local training, Lightning's: 32 | bf16-mixed | 16-mixed (on a CPU Lightning makes 16-mixed bf16)
    precision: Literal["32", "bf16-mixed", "16-mixed"] = "32"
    #: a cold CLI run on a private local Ray starts Ray and its client workers while the driver
    #: imports torch and Lightning (`runtime/early.py`); false: one after the other. Same numbers.
    early_start: bool = True
    #: train a round's clients K at a time in one process, their weights stacked (torch.func);
    #: same numbers to float rounding, for methods whose client step is written for it; 0: one by one
    batched: int = 0


@dataclass
class LoggerConfig:
    backend: Literal["wandb", "none"] = "wandb"
    project: str = "fl_lightning"
    entity: str | None = None
    group: str | None = None  # default: the experiment name
    #: auto: online with an API key, else offline (`$WANDB_MODE` wins, and may say shared:
    #: W&B's mode for one run written from several machines)
    mode: Literal["auto", "online", "offline", "disabled", "shared"] = "auto"
    tags: list[str] = field(default_factory=list)


@dataclass
class RootConfig:
    experiment: str = "default"
    seed: int = 0
    output_dir: str = "runs"
    run_id: str | None = None
    #: the row of a reproduction (`fl-lightning reproduce`) this run is: its W&B run name and
    #: config, and summary.json's `row`, so that ablations of one method stay apart (`compare --by row`)
    row: str | None = None
    #: what sets this run apart within its experiment: its W&B job type and run name
    #: (`<variant>-s<seed>`), and `variant` in summary.json (`compare --by variant`); null: the
    #: reproduction row, else the method. `sweep` sets it to the method and the swept keys
    #: (`fedprox tau=0.1`); config.yaml records the value the run used
    variant: str | None = None
    method: Any = None
    data: DataConfig = field(default_factory=DataConfig)
    model: Any = None
    text: Any = None
    fl: FLConfig = field(default_factory=FLConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    #: modules outside the package imported for the methods they register, comma-separated
    #: (`methods=mypkg.fedfoo`); an installed package can name its modules under the entry-point
    #: group `fl_lightning.methods` instead, and needs no key
    methods: str = ""


def method_modules(value: Any) -> list[str]:
    """The modules a `methods` value names (comma-separated; empty: none)."""
    return [m.strip() for m in str(value or "").split(",") if m.strip()]


def _unlisted_method(name: str, modules: list[str]) -> bool:
    """Whether method `name`, without a file in conf/method/, may be registered elsewhere: by a
    module the run names (`methods=`), or under its name by an installed package's entry point
    (read from package metadata: nothing is imported here). `validate_registered` imports them
    and checks the name."""
    if not SAFE_NAME.fullmatch(name) or (conf_dir() / "method" / f"{name}.yaml").is_file():
        return False
    if modules:
        return True
    from importlib.metadata import entry_points

    return any(ep.name == name for ep in entry_points(group=METHOD_ENTRY_POINTS))


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


#: blocks of a method file that are run-level defaults, not method keys
METHOD_DEFAULT_BLOCKS = ("optim", "fl")


#: a run's `experiment` and `run_id` and a conf file's name: one path component that stays
#: inside its folder (no '/', '..', hidden names, interpolation) and fits a file name
SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")


#: a variant: a label on one line, never an interpolation
VARIANT = re.compile(r"[^\n$]{1,128}")


def variant_of(cfg: Any) -> str:
    """The run's variant (`RootConfig.variant`): as set, else the reproduction row, else the method."""
    return str(cfg.variant or cfg.row or cfg.method.name)


def check_names(cfg: DictConfig) -> None:
    """ConfigError unless `experiment` and `run_id` are each a SAFE_NAME, checked on the raw
    values (before interpolation resolves: `${oc.env:HOME}` is refused, not followed)."""
    raw = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(raw, dict)
    for key in ("experiment", "run_id"):
        value = raw.get(key)
        if value is None and key == "run_id":
            continue
        if not isinstance(value, str) or not SAFE_NAME.fullmatch(value):
            text = str(value)
            shown = repr(value) if len(text) <= 60 else f"{text[:60]!r}... ({len(text)} characters)"
            raise ConfigError(
                f"{key}={shown} must be one folder name: letters, digits, '.', '_', '-', "
                "not starting with '.', at most 200 characters"
            )
    variant = raw.get("variant")
    if variant is not None and not (isinstance(variant, str) and VARIANT.fullmatch(variant)):
        raise ConfigError(f"variant={str(variant)[:60]!r}: one line of 1 to 128 characters, no '$'")


def _group_file(group: str, name: str, unlisted: bool = False) -> dict:
    """`conf/<group>/<name>.yaml`; `unlisted`: a method registered outside conf/ has none, and
    its config dataclass holds every default."""
    path = conf_dir() / group / f"{name}.yaml"
    if unlisted and not path.is_file():
        return {"name": name}
    if not SAFE_NAME.fullmatch(name) or not path.is_file():  # never a file outside conf/<group>/
        valid = ", ".join(choices(group)) or "(none)"
        raise ConfigError(f"unknown {'dataset' if group == 'data' else group} {name!r}; valid: {valid}")
    data = _read_yaml(path)
    if group in ("method", "data", "model", "text"):
        data.setdefault("name", name)  # the registry name
    return data


def method_defaults(name: str, unlisted: bool = False) -> dict[str, dict[str, Any]]:
    """The run-level defaults (`optim:`, `fl:` blocks) of method `name`'s file, as written."""
    data = _group_file("method", name, unlisted)
    out: dict[str, dict[str, Any]] = {}
    for block in METHOD_DEFAULT_BLOCKS:
        value = data.get(block)
        if value is None:
            continue
        if not isinstance(value, dict):
            path = conf_dir() / "method" / f"{name}.yaml"
            raise ConfigError(f"{path}: {block!r} must be a mapping of {block}.* defaults")
        out[block] = value
    return out


def method_group_defaults(name: str) -> dict[str, str]:
    """The group choices of method `name`'s file (`defaults: {model: htfe_cnn3}`), as written."""
    if not (conf_dir() / "method" / f"{name}.yaml").is_file():
        return {}  # an unknown method is named by the group check below
    value = _group_file("method", name).get("defaults") or {}
    bad = [g for g in value if g not in GROUPS or g == "method"] if isinstance(value, dict) else ["?"]
    if bad:
        path = conf_dir() / "method" / f"{name}.yaml"
        raise ConfigError(f"{path}: 'defaults' must map groups ({', '.join(GROUPS[1:])}) to names")
    return {str(k): str(v) for k, v in value.items()}


def _parse(overrides: list[str]) -> tuple[dict[str, str], str | None, list[str]]:
    groups: dict[str, str] = {}
    experiment = None
    dotted: list[str] = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"bad override {item!r}: expected key=value")
        key, value = item.split("=", 1)
        if key in ("+experiment", "experiment") and key.startswith("+"):
            if not SAFE_NAME.fullmatch(value):  # a preset is a file in conf/experiment/, nowhere else
                valid = ", ".join(choices("experiment")) or "(none)"
                raise ConfigError(f"unknown experiment {value!r}; valid: {valid}")
            experiment = value
        elif key in GROUPS:
            groups[key] = value
        elif key == "experiment" and value in choices("experiment"):
            _hint_preset(value)
            dotted.append(item)
        elif key.lstrip("+") != key:
            raise ConfigError(f"bad override {item!r}: only +experiment=<name> takes a '+'")
        else:
            dotted.append(item)
    return groups, experiment, dotted


_HINTED: set[str] = set()


def _hint_preset(name: str) -> None:
    """One line, once per name: `experiment=<preset>` names the folder only; `+` applies it."""
    if name not in _HINTED:
        _HINTED.add(name)
        print(
            f"fl-lightning: note: experiment={name} only names the run folder and W&B group; "
            f"to apply the preset conf/experiment/{name}.yaml write +experiment={name}",
            file=sys.stderr,
        )


def _bool_keys(cls: Any, prefix: str = "") -> list[str]:
    """The dotted keys of the `bool` fields of a config dataclass, nested ones included."""
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if kind is bool:
            out.append(prefix + f.name)
        elif dataclasses.is_dataclass(kind):
            out += _bool_keys(kind, f"{prefix}{f.name}.")
    return out


def _literal_keys(cls: Any, prefix: str = "") -> list[str]:
    """The dotted keys of the `Literal` fields of a config dataclass, nested ones included."""
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if typing.get_origin(kind) is Literal:
            out.append(prefix + f.name)
        elif dataclasses.is_dataclass(kind):
            out += _literal_keys(kind, f"{prefix}{f.name}.")
    return out


def _texts(tree: Any) -> Any:
    """`tree` (a layer of the config, plain data) with a number given for a `Literal` field of
    text written as text: `runtime.precision=32` on the command line, or unquoted in a file,
    is the choice "32" (the schema's `Literal` compares exactly)."""
    if isinstance(tree, dict):
        for key in _literal_keys(RootConfig):
            *parents, last = key.split(".")
            node: Any = tree
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and isinstance(node.get(last), int | float):
                node[last] = str(node[last])
    return tree


def check_bools(tree: Any, keys: list[str], prefix: str = "") -> None:
    """ConfigError unless each of `keys` present in `tree` (nested dicts, raw values) is a real
    bool: OmegaConf would take `2` or `'yes'` for true and the typo would pass silently."""
    for key in keys:
        node = tree
        for part in key.split("."):
            node = node.get(part, None) if isinstance(node, dict) else None
        if node is not None and not isinstance(node, bool):
            raise ConfigError(f"{prefix}{key} must be true or false (got {node!r})")


def _dotlist(items: list[str]) -> DictConfig:
    """`OmegaConf.from_dotlist`, with a YAML error in a value as one ConfigError naming the override."""
    try:
        tree = OmegaConf.to_container(OmegaConf.from_dotlist(list(items)), resolve=False)
        check_bools(tree, _bool_keys(RootConfig))
        return OmegaConf.create(_texts(tree))
    except yaml.YAMLError:
        for item in items:
            try:
                OmegaConf.from_dotlist([item])
            except yaml.YAMLError as e:
                what = " ".join(str(getattr(e, a, "") or "") for a in ("context", "problem")).strip()
                what = what or type(e).__name__
                raise ConfigError(f"bad override {item!r}: not valid YAML ({what})") from None
        raise ConfigError(f"bad overrides {' '.join(items)!r}: not valid YAML") from None


def _nonfinite(node: Any, key: str = "") -> str | None:
    """The dotted key of the first non-finite float (nan, inf) in a config tree, else None."""
    if isinstance(node, float) and not math.isfinite(node):
        return key
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        found = _nonfinite(v, f"{key}.{k}" if key else str(k))
        if found is not None:
            return found
    return None


_LITERAL = re.compile(r"Invalid value (.*), expected one of \[(.*)\]")


def _schema_errors(e: OmegaConfBaseException) -> ConfigError:
    key = getattr(e, "full_key", None) or getattr(e, "key", None)
    msg = str(e).splitlines()[0]
    literal = _LITERAL.match(msg)
    if literal and key:  # a `Literal` field of the schema: name the choices plainly
        valid = ", ".join(v.strip().strip("'") for v in literal.group(2).split(","))
        return ConfigError(f"{key}={literal.group(1)} is not one of: {valid}")
    if "not in struct" in msg or "Key '" in msg and "not" in msg:
        return ConfigError(f"unknown config key {key!r}")
    return ConfigError(f"bad value for {key!r}: {msg}" if key else msg)


def compose(overrides: list[str]) -> DictConfig:
    """Build the run config from `conf/` and overrides; raise ConfigError on any problem."""
    base = _read_yaml(conf_dir() / "config.yaml")
    defaults = dict(base.pop("defaults", {}) or {})
    groups, experiment, dotted = _parse(overrides)
    preset: dict = {}
    preset_groups: dict = {}
    if experiment is not None:
        path = conf_dir() / "experiment" / f"{experiment}.yaml"
        if not path.is_file():
            valid = ", ".join(choices("experiment")) or "(none)"
            raise ConfigError(f"unknown experiment {experiment!r}; valid: {valid}")
        preset = _read_yaml(path)
        preset_groups = dict(preset.pop("defaults", {}) or {})
        defaults.update(preset_groups)
        preset.setdefault("experiment", experiment)
    defaults.update(groups)
    if preset_groups.get("method") not in (None, defaults.get("method")):
        # a preset's `method:` block holds its own method's values (CLIP2FL's teacher), which
        # another method chosen on the command line (`+experiment=clip2fl_cifar10_lt method=fedavg`,
        # a baseline in the same setting) has no keys for
        preset.pop("method", None)
    if preset_groups.get("model") not in (None, defaults.get("model")):
        # likewise its `model:` block (FedLGT's C-Tran trunk) for another model on the command
        # line (the FedAvg baseline's plain ResNet-18 in the same setting)
        preset.pop("model", None)
    # The method's own group choices (its file's `defaults:`, e.g. FedTSP's model family):
    # above config.yaml, below an experiment preset and the command line.
    for group, name in method_group_defaults(defaults.get("method", "")).items():
        if group not in groups and group not in preset_groups:
            defaults[group] = name
    missing = [g for g in GROUPS if g not in defaults]
    if missing:
        raise ConfigError(f"config.yaml names no default for: {', '.join(missing)}")
    # a method outside conf/method/ (`methods=` or an entry point): its dataclass has its defaults
    given = [d.split("=", 1)[1] for d in dotted if d.split("=", 1)[0] == "methods"]
    modules = method_modules(given[-1] if given else preset.get("methods"))
    unlisted = _unlisted_method(defaults["method"], modules)
    files = {g: _group_file(g, defaults[g], g == "method" and unlisted) for g in GROUPS if g not in ("data",)}
    run_defaults = method_defaults(defaults["method"], unlisted)
    for block in (*METHOD_DEFAULT_BLOCKS, "defaults"):
        files["method"].pop(block, None)
    listed = set(files["method"])  # the method keys its file vouches for
    try:
        cfg = OmegaConf.structured(RootConfig)
        OmegaConf.set_struct(cfg, False)
        cfg.merge_with(_texts(files))
        OmegaConf.set_struct(cfg, True)
        for g in ("model", "text"):
            OmegaConf.set_struct(cfg[g], True)
        OmegaConf.set_struct(cfg.method, False)  # its dataclass may hold more: checked below
        cfg.merge_with({"data": _group_file("data", defaults["data"])})
        cfg.merge_with(_texts(base))
    except OmegaConfBaseException as e:
        raise _schema_errors(e) from None
    try:  # the method's optim/fl defaults: above config.yaml, below the preset and the command line
        cfg.merge_with(_texts(run_defaults))
    except OmegaConfBaseException as e:
        path = conf_dir() / "method" / f"{defaults['method']}.yaml"
        raise ConfigError(f"{path}: {_schema_errors(e)}") from None
    try:
        cfg.merge_with(_texts(preset))
        cfg.merge_with(_dotlist(dotted))
        _check_method_keys(cfg, [str(k) for k in cfg.method if k not in listed])
        OmegaConf.set_struct(cfg.method, True)
        check_names(cfg)  # before resolve: an interpolated run_id is refused, not followed
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise _schema_errors(e) from None
    validate(cfg)
    return cfg


def _check_method_keys(cfg: DictConfig, extra: list[str]) -> None:
    """Method keys its conf file does not list (`method.server_lr=0.3` for FedAdam, whose file
    holds only its name; any key of a method from another package): each must be a field of
    the method's config dataclass. The methods are imported only then, so a run that sets no
    such key starts as fast as before; a typo is still one line before any work."""
    if not extra:
        return
    from .methods import METHODS, import_methods

    import_methods(method_modules(cfg.methods))
    name = str(cfg.method.name)
    if name not in METHODS:
        return  # validate_registered names the unknown method
    cls = METHODS.get(name).config_cls
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    bad = [k for k in extra if k not in fields]
    if bad:
        raise ConfigError(f"unknown config key 'method.{bad[0]}'")


def clients_per_round(cfg: DictConfig) -> int:
    """Clients sampled per round (with `fl.fraction_range`: the most in any round)."""
    fl = cfg.fl
    if fl.clients_per_round is not None:
        return int(fl.clients_per_round)
    span = participation(cfg)
    if span is not None:
        return span[1]
    return max(1, int(round(fl.fraction * fl.num_clients)))


def participation(cfg: DictConfig) -> tuple[int, int] | None:
    """`fl.fraction_range` as (fewest, most) clients per round; None for a fixed number.
    PFLlib's counts: int(J * num_clients) for J at either end, at least 1."""
    fl = cfg.fl
    if fl.fraction_range is None:
        return None
    lo, hi = (float(v) for v in fl.fraction_range)
    return max(1, int(lo * fl.num_clients)), max(1, int(hi * fl.num_clients))


def check_kwargs(kind: str, name: str, fn: Any, given: dict) -> None:
    """ConfigError naming the first key of `given` that `fn` (a registered builder) does not take."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(given) - set(params))
    if unknown:
        valid = ", ".join(k for k in params if k not in ("num_classes", "in_channels", "image_size"))
        raise ConfigError(f"unknown config key {kind}.{unknown[0]!r} for {kind} {name!r}; valid: {valid}")


def validate(cfg: DictConfig) -> None:
    """Semantic checks that need no heavy imports."""
    check_names(cfg)  # also a resumed run's config.yaml, whose values are not resolved yet
    fl, data, rt = cfg.fl, cfg.data, cfg.runtime
    bad = _nonfinite(OmegaConf.to_container(cfg, resolve=False))
    if bad is not None:
        value = OmegaConf.select(cfg, bad, throw_on_missing=False)
        raise ConfigError(f"{bad} must be a finite number (got {value})")

    def positive(key: str, value: Any) -> None:
        if value is not None and value <= 0:
            raise ConfigError(f"{key} must be > 0 (got {value})")

    for key in ("rounds", "num_clients", "local_epochs", "batch_size", "clients_per_round", "local_steps"):
        positive(f"fl.{key}", fl[key])
    positive("data.alpha", data.alpha)
    positive("eval.every", cfg.eval.every)
    positive("optim.lr", cfg.optim.lr)
    positive("optim.grad_clip", cfg.optim.grad_clip)
    positive("checkpoint.every", cfg.checkpoint.every)
    if not 0 <= cfg.seed < 2**32:  # numpy's and Lightning's seeding take no more
        raise ConfigError(f"seed must be in [0, 2**32) (got {cfg.seed})")
    for key in ("momentum", "weight_decay"):
        if cfg.optim[key] < 0:
            raise ConfigError(f"optim.{key} must be >= 0 (got {cfg.optim[key]})")
    if not 0 < cfg.eval.threshold < 1:
        raise ConfigError(f"eval.threshold must be in (0, 1) (got {cfg.eval.threshold})")
    lt = cfg.eval.longtail
    if lt is not None and (len(lt) != 2 or lt[0] < lt[1] or lt[1] < 0):
        raise ConfigError(
            "eval.longtail must be [many_above, few_below] with many_above >= few_below >= 0 "
            f"(got {list(lt)})"
        )
    for key in ("train_subset", "test_subset", "server_subset"):
        positive(f"data.{key}", data[key])
    if not 0 < fl.fraction <= 1:
        raise ConfigError(f"fl.fraction must be in (0, 1] (got {fl.fraction})")
    fr = fl.fraction_range
    if fr is not None:
        if len(fr) != 2 or not 0 < fr[0] <= fr[1] <= 1:
            raise ConfigError(f"fl.fraction_range must be [lo, hi] with 0 < lo <= hi <= 1 (got {list(fr)})")
        if fl.clients_per_round is not None:
            raise ConfigError("set fl.fraction_range or fl.clients_per_round, not both")
    if clients_per_round(cfg) > fl.num_clients:
        raise ConfigError(
            f"fl.clients_per_round={clients_per_round(cfg)} exceeds fl.num_clients={fl.num_clients}"
        )
    if fl.max_client_failures < 0:
        raise ConfigError(f"fl.max_client_failures must be >= 0 (got {fl.max_client_failures})")
    if data.personal_shots and not data.shots:
        raise ConfigError("data.personal_shots needs data.shots (the held-out images follow the k-shot draw)")
    if sum(map(bool, (data.personal_shots, data.personal_from_test, data.client_test_fraction > 0))) > 1:
        raise ConfigError(
            "set one of data.personal_shots, data.personal_from_test and data.client_test_fraction"
        )
    if fl.bn_stats == "local" and not client_tests(data):
        raise ConfigError(
            "fl.bn_stats=local keeps each client's batch-norm statistics, so models are evaluated on "
            "each client's own test split: set data.client_test_fraction (e.g. 0.25)"
        )
    if not 0 <= data.client_test_fraction < 1:
        raise ConfigError(f"data.client_test_fraction must be in [0, 1) (got {data.client_test_fraction})")
    if data.min_size < 0:
        raise ConfigError(f"data.min_size must be >= 0 (got {data.min_size})")
    for key in ("classes_per_client", "image_size", "max_users", "shots", "personal_shots"):
        positive(f"data.{key}", data[key])
    check_augment(cfg)
    if data.imbalance_factor < 1:
        raise ConfigError(f"data.imbalance_factor must be >= 1 (got {data.imbalance_factor})")
    if data.partition == "longtail" and data.imbalance_factor <= 1:
        raise ConfigError("data.partition=longtail needs data.imbalance_factor > 1 (e.g. 10, 50, 100)")
    sample = cfg.eval.clients_sample
    if sample is not None and not 1 <= sample <= cfg.fl.num_clients:
        raise ConfigError(
            f"eval.clients_sample must be in [1, fl.num_clients={cfg.fl.num_clients}] (got {sample})"
        )
    if sample is not None and cfg.eval.timing != "received":
        raise ConfigError(
            "eval.clients_sample applies to eval.timing=received (trained evaluates the participants)"
        )
    per_client = ("cpus_per_client", "gpus_per_client", "threads_per_client")
    for key in ("num_actors", "num_cpus", *per_client, "schedule_timeout_s"):
        positive(f"runtime.{key}", rt[key])
    if rt.num_gpus is not None and rt.num_gpus < 0:
        raise ConfigError(f"runtime.num_gpus must be >= 0 (got {rt.num_gpus})")
    if rt.batched < 0:
        raise ConfigError(f"runtime.batched must be >= 0 (got {rt.batched})")


def client_tests(data: Any) -> bool:
    """Whether clients hold their own test splits: a fraction of their images, the personal
    images held out per class (`data.personal_shots`) or the test images of their classes."""
    return bool(data.client_test_fraction > 0 or data.get("personal_shots") or data.get("personal_from_test"))


def check_augment(cfg: DictConfig) -> None:
    """`data.augment` names known transforms, once each, on a runtime that applies them."""
    data = cfg.data
    for name in data.augment:
        if name not in AUGMENTATIONS:
            valid = ", ".join(AUGMENTATIONS)
            raise ConfigError(f"data.augment: unknown augmentation {name!r}; valid: {valid}")
    if len(set(data.augment)) != len(data.augment):
        raise ConfigError(f"data.augment names an augmentation twice ({list(data.augment)})")
    if data.augment_padding < 0:
        raise ConfigError(f"data.augment_padding must be >= 0 (got {data.augment_padding})")
    if not 0 <= data.augment_degrees <= 180:
        raise ConfigError(f"data.augment_degrees must be in [0, 180] (got {data.augment_degrees})")
    if data.augment and cfg.runtime.batched:
        raise ConfigError(
            "runtime.batched trains from precomputed batch indices and does not apply data.augment; "
            "use runtime.batched=0"
        )


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
    from .data.partition import PARTITIONERS
    from .data.registry import DATASETS
    from .methods import METHODS, import_methods
    from .models import MODELS

    import_methods(method_modules(cfg.methods))
    strategy = METHODS.get(cfg.method.name)
    method_cfg = method_config(cfg)
    # A method may refuse an optimiser its algorithm does not hold under (SCAFFOLD: momentum):
    # a classmethod `check_optim(method_config, optim)` raising ConfigError, before any data.
    optim = OmegaConf.to_container(cfg.optim, resolve=True)
    assert isinstance(optim, dict)
    optim_cfg = OptimConfig(**{str(k): v for k, v in optim.items()})
    check_optim = getattr(strategy, "check_optim", None)
    if callable(check_optim):
        check_optim(method_cfg, optim_cfg)
    if cfg.runtime.batched:  # before any data; the model's layers once it is built (`model_refusal`)
        from .core.batched import batched_refusal
        from .models import family

        why = batched_refusal(cfg.method.name, strategy.objective_cls, optim_cfg, cfg.runtime.precision,
                              family(cfg.model.name) is not None)  # fmt: skip
        if why:
            raise ConfigError(f"runtime.batched={cfg.runtime.batched}: {why}; use runtime.batched=0")
    # ... and a run it cannot do (CLIP2FL's teacher=clip without CLIP weights): `check_run`.
    run = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(run, dict)
    entry = DATASETS.get(cfg.data.name)  # what is known of the data before loading it
    known = {"multilabel": entry.multilabel, "class_names": entry.class_names}
    strategy.check_run(method_cfg, {str(k): v for k, v in run.items()} | {"dataset": known})
    # clients' own test splits come from data.client_test_fraction alone (data/federated.py)
    if strategy.keeps_personal_models(method_cfg) and not client_tests(cfg.data):
        raise ConfigError(strategy.needs_test_split_error())
    if cfg.eval.timing == "trained" and not (client_tests(cfg.data) and cfg.eval.clients):
        raise ConfigError(
            "eval.timing=trained evaluates each client's trained model on its own test split: "
            "set data.client_test_fraction (and eval.clients=true)"
        )
    from .models import family
    from .models.weights import MODEL_GENERIC_KEYS, read_weights

    model_kwargs = {k: v for k, v in cfg.model.items() if k not in MODEL_GENERIC_KEYS}
    check_kwargs("model", cfg.model.name, MODELS.get(cfg.model.name), model_kwargs)
    if cfg.data.image_size is not None:  # (the channel count is not known yet; sizes do not depend on it)
        from .models import check_image_size

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
        from .text import TEXT_ENCODERS

        text_kwargs = {k: v for k, v in cfg.text.items() if k != "name"}
        check_kwargs("text", cfg.text.name, TEXT_ENCODERS.get(cfg.text.name), text_kwargs)
    return method_cfg


def method_config(cfg: DictConfig) -> Any:
    """The run's method config: its dataclass (the one source of its defaults) with the keys
    the conf file, a preset and the command line set; ConfigError naming a bad value. The
    method must be registered (`validate_registered` imports the modules)."""
    from .methods import METHODS

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
    from .methods import import_methods

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


#: what a resume may change: nothing that changes the numbers (method.allow_momentum only
#: permits SCAFFOLD runs started before it refused momentum to go on)
RESUMABLE = ("fl.rounds", "runtime.", "logger.", "eval.batch_size", "eval.device", "method.allow_momentum")


#: what a run decides for the machine it runs on (config.yaml records the decision): a
#: resume decides again unless told, so a run moved to another machine fits that one
MACHINE_CHOICES = {"runtime.placement": "auto", "runtime.accelerator": "auto", "eval.device": "auto",
                   "runtime.num_actors": "null"}  # fmt: skip


def load_run_config(run_dir: Path, overrides: list[str]) -> DictConfig:
    """The resolved config of an existing run, with the few overrides a resume may change."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
    for item in overrides:
        key = item.split("=", 1)[0]
        resumable = any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESUMABLE)
        if "=" not in item or not (resumable or key == "methods"):  # methods: the same, as consent
            raise ConfigError(
                f"cannot change {key!r} on resume; "
                "only fl.rounds, runtime.*, logger.*, eval.batch_size, eval.device and method.allow_momentum"
            )
    _consent_to_modules(path, overrides, "resume it", same=True)
    given = {item.split("=", 1)[0] for item in overrides}
    machine = [f"{k}={v}" for k, v in MACHINE_CHOICES.items() if k not in given]
    if "device" in (_read_yaml(path).get("text") or {}):  # an encoder's device, decided again too
        machine.append("text.device=auto")
    return _saved_config(path, [*machine, *overrides, *_earlier_run_id(path)])


def _earlier_run_id(path: Path) -> list[str]:
    """Earlier versions took any `run_id` ('my run'); a run of theirs resumes: a saved run id
    that is its own folder's name (not an interpolation, no path) is checked as a stand-in of
    safe characters. The resumed run writes its folder's name back (`Run._record_choices`)."""
    saved = _read_yaml(path).get("run_id")
    if not isinstance(saved, str) or SAFE_NAME.fullmatch(saved) or saved != path.parent.name or "$" in saved:
        return []
    stand_in = re.sub(r"[^A-Za-z0-9._-]", "_", saved).lstrip(".")[:200] or "run"
    return [f"run_id='{stand_in}'"]


def _consent_to_modules(path: Path, overrides: list[str], how: str, same: bool) -> None:
    """A saved config that names modules to import (`methods=`) is run only when the command
    line names them too. `same`: the command line may not name other modules (a resume)."""
    require_consent(method_modules(_read_yaml(path).get("methods")), overrides, path, how, same)


def require_consent(saved: list[str], overrides: Sequence[str], source: object, how: str, same: bool) -> None:
    """The one consent rule (docs/reliability.md): modules to import (`methods=`) that a file
    names (a run's config.yaml, a sweep's sweep.json: someone else's, untrusted) are imported
    only when the command line names them too; a file alone never makes us import a module.
    `overrides`: the command line's; `source`: the file, for the message; `how`: what the user
    does to consent ("resume it"); `same`: the command line may not name other modules."""
    given = [item.split("=", 1)[1] for item in overrides if item.split("=", 1)[0].lstrip("+") == "methods"]
    if same and given and sorted(set(method_modules(given[-1]))) != sorted(set(saved)):
        raise ConfigError(f"cannot change 'methods' on resume (the run's: {','.join(saved) or 'none'})")
    if saved and not given:
        names = ",".join(dict.fromkeys(saved))
        raise ConfigError(
            f"{source} imports its method from {names}: {how} with methods={names} to allow that "
            "(a file alone never makes fl-lightning import a module)"
        )


def rerun_config(source: Path, overrides: list[str]) -> DictConfig:
    """A new run with the values of a saved config.yaml (`source`: the file or its run
    directory), then `overrides` (key=value). Its run id is left to be made anew (a
    `run_id=` override names it); groups and presets are the saved file's already."""
    path = Path(source) / "config.yaml" if Path(source).is_dir() else Path(source)
    if not path.is_file():
        raise ConfigError(f"--from {source}: no such config.yaml or run directory")
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" not in item or key.startswith("+") or key in GROUPS:
            raise ConfigError(
                f"bad override {item!r} with --from: only key=value (groups and presets are the file's)"
            )
    _consent_to_modules(path, overrides, "run --from it", same=False)
    # the saved variant labels the saved settings: one changed (`method.tau=0.5`), it is made anew
    keys = [item.split("=", 1)[0] for item in overrides]
    same = ("seed", "experiment", "output_dir", "run_id", "variant", "runtime.", "logger.", "eval.device")
    relabel = any(not any(k == s or (s.endswith(".") and k.startswith(s)) for s in same) for k in keys)
    return _saved_config(path, ["run_id=null", *(["variant=null"] if relabel else []), *overrides])


def _saved_config(path: Path, overrides: list[str]) -> DictConfig:
    """A run's config.yaml (checked like any shared file: untrusted) with `overrides` on top."""
    doc = _read_yaml(path)
    check_bools(doc, _bool_keys(RootConfig), f"{path}: ")  # shared run dirs are untrusted
    missing = [g for g in ("method", "data", "model", "fl") if not isinstance(doc.get(g), dict)]
    missing += [
        f"{g}.name" for g in ("method", "data", "model") if g not in missing and not doc[g].get("name")
    ]
    if missing:
        what = "empty" if not doc else "no " + ", ".join(missing)
        raise ConfigError(
            f"{path} is not an fl_lightning run config ({what}); "
            "it must be a run directory's config.yaml written by `fl-lightning run`"
        )
    try:
        cfg = OmegaConf.structured(RootConfig)
        OmegaConf.set_struct(cfg, False)
        cfg.merge_with(_texts(doc))
        OmegaConf.set_struct(cfg, True)
        # method.allow_momentum may be new to a run's config (validate_registered checks it)
        OmegaConf.set_struct(cfg.method, False)
        cfg.merge_with(_dotlist(overrides))
        OmegaConf.set_struct(cfg.method, True)
    except OmegaConfBaseException as e:
        raise _schema_errors(e) from None
    validate(cfg)
    return cfg
