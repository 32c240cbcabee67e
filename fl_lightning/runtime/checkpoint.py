"""Round checkpoints: tensors via `torch.save` (loaded with `weights_only=True`), the
rest of `ServerState` as JSON. Written atomically every round.

Layout in `<run dir>/checkpoints/`: `round-000012.pt` (tensors) and `round-000012.json`
(structure, with the .pt file's SHA-256). The JSON is written last and is the commit: a
round whose JSON is missing, or whose .pt does not match its hash, was never completed.
The two newest complete rounds are kept.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from ..core.errors import CheckpointError
from ..core.messages import ServerState

FORMAT = "fl_lightning.checkpoint/1"
KEEP = 2


def _encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu()
        return {"__tensor__": key}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        return {
            "__dataclass__": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {f.name: _encode(getattr(obj, f.name), tensors) for f in dataclasses.fields(obj)},
        }
    if isinstance(obj, dict):  # keys keep their type (client ids are ints)
        return {"__dict__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return [_encode(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot checkpoint a {type(obj).__name__}")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__dict__" in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__dict__"]}
    if "__dataclass__" in obj:
        module, _, name = obj["__dataclass__"].partition(":")
        if not module.startswith("fl_lightning."):  # never instantiate foreign classes
            raise CheckpointError(f"checkpoint names a foreign class {obj['__dataclass__']!r}")
        cls = getattr(importlib.import_module(module), name)
        if not dataclasses.is_dataclass(cls):
            raise CheckpointError(f"checkpoint names a non-state class {obj['__dataclass__']!r}")
        return cls(**{k: _decode(v, tensors) for k, v in obj["fields"].items()})
    raise CheckpointError("unrecognised checkpoint structure")


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save(run_dir: Path, state: ServerState, meta: dict[str, Any]) -> Path:
    ckdir = Path(run_dir) / "checkpoints"
    ckdir.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, tensors)
    stem = f"round-{state.round:06d}"
    pt = ckdir / f"{stem}.pt"
    _atomic_write(pt, lambda f: torch.save(tensors, f))
    doc = {"format": FORMAT, "round": state.round, "sha256": _sha256(pt), "state": tree, "meta": meta}
    _atomic_write(ckdir / f"{stem}.json", lambda f: f.write(json.dumps(doc).encode()))
    for old in sorted(ckdir.glob("round-*.json"))[:-KEEP]:
        old.with_suffix(".pt").unlink(missing_ok=True)
        old.unlink(missing_ok=True)
    return pt


def latest(run_dir: Path) -> Path | None:
    found = sorted((Path(run_dir) / "checkpoints").glob("round-*.json"))
    return found[-1] if found else None


def load(path: Path) -> tuple[ServerState, dict[str, Any]]:
    """Load a checkpoint JSON (and its tensors); CheckpointError if corrupt or foreign."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an fl_lightning checkpoint")
    pt = path.with_suffix(".pt")
    if not pt.is_file() or _sha256(pt) != doc.get("sha256"):
        raise CheckpointError(f"checkpoint {pt} is missing or does not match {path.name}")
    try:
        tensors = torch.load(pt, map_location="cpu", weights_only=True)
    except Exception as e:  # any unpickling failure means a corrupt file
        raise CheckpointError(f"checkpoint {pt} is corrupt: {type(e).__name__}") from None
    try:
        state = _decode(doc["state"], tensors)
    except (KeyError, TypeError, AttributeError, ImportError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt: {type(e).__name__}: {e}") from None
    if not isinstance(state, ServerState):
        raise CheckpointError(f"checkpoint {path} holds no server state")
    return state, doc.get("meta", {})
