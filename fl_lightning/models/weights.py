"""Pretrained trunks: the weights file `fl-lightning pretrain` writes and `model.weights=<file>`
reads into any model whose trunk has the same shapes.

A weights file is a `torch.save`d dict, read with `weights_only=True` (no code runs):

    {"format": "fl_lightning.weights", "version": 1, "arch": "cnn", "model_kwargs": {...},
     "state_dict": {trunk tensors: the model's state dict without its classifier head},
     "info": {"dataset": ..., "train_range": [lo, hi], "held_out_accuracy": ..., ...}}

A plain state dict (a torchvision ResNet-18's, say) is read too; its classifier keys (`fc.`,
`head.`, `classifier.`, `_fc.`) are dropped.

Where the trunk goes in the target model: `weights_prefix` (a model attribute; "" for the
backbones, whose state dict minus `head.` is the trunk; `trunk.encoder.` for C-Tran on
tiles, ...). Every trunk key of the target must come from the file with the same shape, and
every key of the file must land in the target: a mismatch is one ConfigError naming the
first key that differs, so a file for another architecture is never half-loaded.

A run keeps a copy of the file it started from in its directory (`KEPT`), and `resume`
reads the trunk from there: the run goes on once the file named is gone or replaced, its
clients starting from the same initial weights.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..core.errors import ConfigError, load_refusal
from ..core.files import atomic_torch_save, copy_atomic

FORMAT = "fl_lightning.weights"
MODEL_GENERIC_KEYS = ("name", "weights")  # `model.*` keys that are not the builder's arguments
VERSION = 1
KEPT = "model_weights.pt"  # in a run directory: the weights file the run started from
HEAD_PREFIXES = ("head.", "fc.", "_fc.", "classifier.")  # a classifier: never part of a trunk


def trunk_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict without its classifier head, on the CPU."""
    return {
        k: v.detach().cpu().clone() for k, v in model.state_dict().items() if not k.startswith(HEAD_PREFIXES)
    }


def save_weights(
    path: str | Path, model: nn.Module, arch: str, model_kwargs: Mapping[str, Any], info: Mapping[str, Any]
) -> Path:
    """Write `model`'s trunk as a weights file (whole or not at all)."""
    path = Path(path).expanduser()
    blob = {
        "format": FORMAT, "version": VERSION, "arch": arch, "model_kwargs": dict(model_kwargs),
        "state_dict": trunk_state(model), "info": dict(info),
    }  # fmt: skip
    return atomic_torch_save(blob, path)


def read_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(trunk tensors, metadata) of a weights file or plain state dict. Only tensors and plain
    containers are read (`weights_only=True`): a pickled payload is refused, never run."""
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ConfigError(f"model.weights={path}: no such file")
    try:
        blob = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # a hostile pickle, a truncated file, not a torch file at all
        raise ConfigError(f"model.weights={path}: not a readable weights file ({load_refusal(e)})") from None
    meta: dict[str, Any] = {}
    if isinstance(blob, dict) and blob.get("format") == FORMAT:
        if blob.get("version") != VERSION:
            raise ConfigError(
                f"model.weights={path}: weights file version {blob.get('version')} (expected {VERSION})"
            )
        state = blob.get("state_dict")
        meta = {k: blob.get(k) for k in ("arch", "model_kwargs", "info")}
    else:
        state = blob.get("state_dict", blob) if isinstance(blob, dict) else None
    if (
        not isinstance(state, dict)
        or not state
        or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())
    ):
        raise ConfigError(f"model.weights={path}: holds no state dict of named tensors")
    return {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIXES)}, meta


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(Path(path).expanduser(), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def load_trunk(model: nn.Module, path: str | Path) -> dict[str, Any]:
    """Load the trunk of weights file `path` into `model` (at its `weights_prefix`); returns
    what the run records of it (path, digest, the file's arch and info)."""
    state, meta = read_weights(path)
    prefix = str(getattr(model, "weights_prefix", ""))
    target = {
        k: v
        for k, v in model.state_dict().items()
        if k.startswith(prefix) and not k[len(prefix) :].startswith(HEAD_PREFIXES)
    }
    if not target:
        raise ConfigError(f"model.weights: {type(model).__name__} has no trunk that takes pretrained weights")
    where = f"model.weights={path}"
    if meta.get("arch"):
        where += f" ({meta['arch']})"
    for k, v in state.items():
        t = target.get(prefix + k)
        if t is None:
            raise ConfigError(f"{where} does not fit this model: its key {k!r} has no place in the trunk")
        if tuple(t.shape) != tuple(v.shape):
            raise ConfigError(
                f"{where} does not fit this model: {k!r} is {tuple(v.shape)} in the file, "
                f"{tuple(t.shape)} in the model"
            )
    missing = [k[len(prefix) :] for k in target if k[len(prefix) :] not in state]
    if missing:
        raise ConfigError(f"{where} does not fit this model: the file has no {missing[0]!r}")
    merged = model.state_dict()
    merged.update({prefix + k: v.to(merged[prefix + k].dtype) for k, v in state.items()})
    model.load_state_dict(merged)
    return {"path": str(Path(str(path)).expanduser()), "sha256": file_digest(path), "arch": meta.get("arch"),
            "info": meta.get("info") or {}}  # fmt: skip


def keep_weights(path: str | Path, run_dir: Path) -> Path:
    """A copy of the weights file `path` in `run_dir` (`KEPT`). Not a hard link: a file
    rewritten in place (`torch.save` to the same name) would change the run's start under it."""
    return copy_atomic(Path(str(path)).expanduser(), run_dir / KEPT)


def kept_weights(run_dir: Path, named: str) -> str:
    """Where a resumed run reads its trunk: its own copy, else (a run from before it kept one)
    the file `model.weights` names; one line when neither is there."""
    kept = run_dir / KEPT
    if kept.is_file():
        return str(kept)
    if not Path(named).expanduser().is_file():
        raise ConfigError(
            f"model.weights={named}: no such file, and {run_dir} keeps no copy of it (it was started "
            "before runs kept theirs): put the file back to resume it"
        )
    return named
