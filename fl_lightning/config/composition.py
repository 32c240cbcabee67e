"""Composition: `conf/` and command-line overrides into one checked tree (one-line errors),
which `typed.compose` turns into the typed `RootConfig`, the only form that leaves the package.

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
import functools
import math
import os
import re
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..core.errors import ConfigError
from ..core.registry import METHOD_ENTRY_POINTS
from ..core.run_config import RootConfig

GROUPS = ("method", "data", "model", "text", "runtime", "logger", "privacy")


def conf_dir() -> Path:
    """`$FL_LIGHTNING_CONF`, else the `conf/` folder next to the package."""
    env = os.environ.get("FL_LIGHTNING_CONF")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "conf"


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
    # a method of this package without a file in conf/method/ (its config holds the defaults):
    # its `METHODS.register("name")` read as text, as `methods._import_package_configs` finds it
    here = Path(__file__).resolve().parents[1] / "methods"
    needle = f'register("{name}")'
    if any(needle in f.read_text() for f in [*here.glob("configs/*.py"), *here.glob("*.py")]):
        return True
    from importlib.metadata import entry_points

    return any(ep.name == name for ep in entry_points(group=METHOD_ENTRY_POINTS))


def choices(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


#: files larger than this are parsed each time, never kept (a saved run's config.yaml is untrusted)
_CACHED_YAML_CHARS = 1 << 16


@functools.lru_cache(maxsize=512)
def _parsed(text: str) -> Any:
    """A YAML text parsed once per process: a run, a sweep's runs, `list` and the tests compose
    from the same ~10 files again and again (a parse was a fifth of a compose). Keyed by the
    text itself, so an edited file is parsed again, however soon after; callers get a copy."""
    return yaml.safe_load(text)


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text()
        parsed = copy.deepcopy(_parsed(text)) if len(text) <= _CACHED_YAML_CHARS else yaml.safe_load(text)
        data = parsed or {}
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


def _bool_keys(cls: Any, prefix: str = "") -> tuple[str, ...]:
    """The dotted keys of the `bool` fields of a config dataclass, nested ones included."""
    return _keys_of(cls, prefix, "bool")


def _literal_keys(cls: Any, prefix: str = "") -> tuple[str, ...]:
    """The dotted keys of the `Literal` fields of a config dataclass, nested ones included."""
    return _keys_of(cls, prefix, "literal")


# It reads a dataclass's type hints (`typing.get_type_hints`, ~1 ms for RootConfig), which a
# compose asked for five times: a class's fields do not change, so each is read once.
@functools.cache
def _keys_of(cls: Any, prefix: str, kind: Literal["bool", "literal"]) -> tuple[str, ...]:
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        hint, nested = hints[f.name], dataclasses.is_dataclass(hints[f.name])  # (a hint stays hashable)
        if hint is bool if kind == "bool" else typing.get_origin(hint) is Literal:
            out.append(prefix + f.name)
        elif nested:
            out += _keys_of(hint, f"{prefix}{f.name}.", kind)
    return tuple(out)


@functools.cache
def _schema(cls: Any) -> DictConfig:
    """`OmegaConf.structured(cls)`, built once per class; callers take a `schema(cls)` copy
    (building RootConfig's reads every nested dataclass's hints: 17 ms, a copy 2 ms)."""
    return OmegaConf.structured(cls)


def schema(cls: Any, shared: bool = False) -> DictConfig:
    """A fresh `OmegaConf.structured(cls)`: the same tree, flags and types, a copy of one built once;
    `shared`: that one itself, for a caller that never changes it (`OmegaConf.merge` copies its first
    argument)."""
    built = _schema(cls)
    return built if shared else copy.deepcopy(built)


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


def check_bools(tree: Any, keys: Sequence[str], prefix: str = "") -> None:
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


def compose_tree(overrides: list[str]) -> DictConfig:
    """The run config's tree from `conf/` and overrides, checked (`validate`); ConfigError on
    any problem. What `compose` types: the rest of the package reads only that."""
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
        cfg = schema(RootConfig)
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
    from ..methods import METHODS, import_methods

    import_methods(method_modules(cfg.methods))
    name = str(cfg.method.name)
    if name not in METHODS:
        return  # validate_registered names the unknown method
    fields = {f.name for f in dataclasses.fields(METHODS.config(name))}
    bad = [k for k in extra if k not in fields]
    if bad:
        raise ConfigError(f"unknown config key 'method.{bad[0]}'")


def validate(cfg: DictConfig) -> None:
    """The composed tree's checks that need no heavy imports: the raw values first (names before
    interpolation, non-finite numbers), then the typed sections' own (`RootConfig.check`)."""
    check_names(cfg)  # also a resumed run's config.yaml, whose values are not resolved yet
    bad = _nonfinite(OmegaConf.to_container(cfg, resolve=False))
    if bad is not None:
        value = OmegaConf.select(cfg, bad, throw_on_missing=False)
        raise ConfigError(f"{bad} must be a finite number (got {value})")
    sections(cfg).check()


def sections(cfg: DictConfig) -> RootConfig:
    """`cfg` as the typed `RootConfig` with `method`, `model` and `text` left mappings: no
    registry is read (`registered.typed` gives the method its dataclass)."""
    try:
        run = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise _schema_errors(e) from None
    assert isinstance(run, RootConfig)
    return run
