"""A run's saved config.yaml read back: resumed (`load_run_config`: only what a resume may
change), or run again (`rerun_config`), each checked like any shared file (untrusted), with
the one consent rule for the modules such a file names."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..core.errors import ConfigError
from ..core.run_config import RootConfig
from .composition import (
    GROUPS,
    SAFE_NAME,
    _bool_keys,
    _dotlist,
    _read_yaml,
    _schema_errors,
    _texts,
    check_bools,
    method_modules,
    schema,
    validate,
)
from .typed import typed

#: what a resume may change: nothing that changes the numbers; a method may name keys of its
#: own (`MethodConfig.resumable`: SCAFFOLD's allow_momentum lets a run from before it refused
#: momentum go on)
RESUMABLE = ("fl.rounds", "runtime.", "logger.", "eval.batch_size", "eval.device")


def resumable_keys(method: str, modules: Sequence[str] = ()) -> tuple[str, ...]:
    """`RESUMABLE` and the keys method `method` declares (`method.<key>`; imports the methods
    and `modules`); only `RESUMABLE` when no such method is registered."""
    from ..methods import METHODS, import_methods

    import_methods(list(modules))
    own = METHODS.config(method).resumable if method in METHODS else ()
    return (*RESUMABLE, *(f"method.{k}" for k in own))


def _may_change(key: str, keys: Sequence[str]) -> bool:
    return any(key == r or (r.endswith(".") and key.startswith(r)) for r in keys)


#: what a run decides for the machine it runs on (config.yaml records the decision): a
#: resume decides again unless told, so a run moved to another machine fits that one.
#: `runtime.address` too: the cluster a run joins comes from the command line or
#: `$RAY_ADDRESS` only, never from a file (a copied run's config.yaml naming a cluster sent the
#: run's data there, and the driver unpickles what that cluster's workers return)
MACHINE_CHOICES = {"runtime.placement": "auto", "runtime.accelerator": "auto", "eval.device": "auto",
                   "runtime.num_actors": "null", "runtime.address": "null"}  # fmt: skip


def load_run_config(run_dir: Path, overrides: list[str]) -> RootConfig:
    """The typed config of an existing run, with the few overrides a resume may change."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
    later = []  # method keys: the method's own say, once its modules may be imported
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" in item and key.startswith("method."):
            later.append(key)
        elif "=" not in item or not (_may_change(key, RESUMABLE) or key == "methods"):  # methods: as consent
            raise _cannot_change(key, RESUMABLE)
    _consent_to_modules(path, overrides, "resume it", same=True)
    if later:
        saved = _read_yaml(path)
        method = saved.get("method")
        keys = resumable_keys(str(method.get("name")) if isinstance(method, dict) else "",
                              method_modules(saved.get("methods")))  # fmt: skip
        for key in later:
            if not _may_change(key, keys):
                raise _cannot_change(key, keys)
    given = {item.split("=", 1)[0] for item in overrides}
    machine = [f"{k}={v}" for k, v in MACHINE_CHOICES.items() if k not in given]
    if "device" in (_read_yaml(path).get("text") or {}):  # an encoder's device, decided again too
        machine.append("text.device=auto")
    return _saved_config(path, [*machine, *overrides, *_earlier_run_id(path)])


def _cannot_change(key: str, keys: Sequence[str]) -> ConfigError:
    named = [k + "*" if k.endswith(".") else k for k in keys]
    return ConfigError(f"cannot change {key!r} on resume; only {', '.join(named[:-1])} and {named[-1]}")


def _earlier_run_id(path: Path) -> list[str]:
    """Earlier versions took any `run_id` ('my run'); a run of theirs resumes: a saved run id
    that is its own folder's name (not an interpolation, no path) is checked as a stand-in of
    safe characters; one whose folder was renamed since (`oldid`) takes the folder's name. The
    resumed run writes its folder's name back (`Run._record_choices`)."""
    saved = _read_yaml(path).get("run_id")
    if not isinstance(saved, str) or SAFE_NAME.fullmatch(saved) or "$" in saved or "/" in saved:
        return []
    if saved != path.parent.name:  # the folder renamed since: its own name, if a safe one, is the id
        return [f"run_id='{path.parent.name}'"] if SAFE_NAME.fullmatch(path.parent.name) else []
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


def rerun_config(source: Path, overrides: list[str]) -> RootConfig:
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
    address = [] if "runtime.address" in keys else ["runtime.address=null"]  # see MACHINE_CHOICES
    return _saved_config(path, ["run_id=null", *(["variant=null"] if relabel else []), *address, *overrides])


def _saved_config(path: Path, overrides: list[str]) -> RootConfig:
    """A run's config.yaml (checked like any shared file: untrusted) with `overrides` on top,
    typed (the modules it names imported: the caller has the user's consent)."""
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
        try:
            cfg = schema(RootConfig)
            OmegaConf.set_struct(cfg, False)
            cfg.merge_with(_texts(doc))
            OmegaConf.set_struct(cfg, True)
            # a key a method declares resumable may be new to a run's config (its schema checks it)
            OmegaConf.set_struct(cfg.method, False)
            cfg.merge_with(_dotlist(overrides))
            OmegaConf.set_struct(cfg.method, True)
        except OmegaConfBaseException as e:
            raise _schema_errors(e) from None
        validate(cfg)
        return typed(cfg)
    except ConfigError as e:
        raise _older_key(e, doc, path, overrides) from None


def _older_key(e: ConfigError, doc: dict, path: Path, overrides: list[str]) -> ConfigError:
    """An unknown key that the saved file holds (not the command line): a key an earlier (or
    later) version wrote. Say so and how to go on (the run could not be resumed, and nothing
    said why)."""
    m = re.match(r"unknown config key '([^']+)'", str(e))
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    if m is None or m.group(1) in given:
        return e
    for key in (m.group(1), f"method.{m.group(1)}"):
        node: object = doc
        for part in key.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING:
            return ConfigError(
                f"{path} holds {key!r}, a key this version of fl-lightning does not know (another "
                f"version wrote the run): delete that line from {path} to go on with this version"
            )
    return e


_MISSING = object()
