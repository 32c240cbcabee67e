"""Round checkpoints: tensors via `torch.save` (loaded with `weights_only=True`), the
rest of `ServerState` as JSON. Written atomically every `checkpoint.every` rounds and at the last.

Layout in `<run dir>/checkpoints/`: `round-000012.pt` (tensors) and `round-000012.json`
(structure, with the .pt file's SHA-256). The JSON is written last and is the commit: a
round whose JSON is missing, or whose .pt does not match its hash, was never completed.
The two newest complete rounds are kept.

Clients' resident state is collected from the hosts and written one file per client in
`checkpoints/clients/c<id>-r<round>.pt` (only for clients that trained since the last
checkpoint: cost and driver memory follow the clients sampled, not all clients). The
round's JSON holds the index client id -> round of that client's newest file; files no
kept checkpoint names are deleted.

A checkpoint is untrusted input (run directories are shared): tensors load with
`weights_only=True`, JSON nesting is bounded (`core/safe_json.py`), and the dataclasses it
names are looked up among the registered methods' state classes (`core/state_classes.py`),
never imported. A write that fails (a full disk) removes its temporary file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from ..core.errors import CheckpointError
from ..core.files import open_new
from ..core.messages import ServerState
from ..core.safe_json import loads
from ..core.state_classes import class_name, state_class
from ..core.types import ClientId, ClientState
from .outcome import os_cause

FORMAT = "fl_lightning.checkpoint/2"
WANDB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a W&B run id (ours: 8 hex digits)
KEEP = 2


def _encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu()
        return {"__tensor__": key}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            "__dataclass__": class_name(type(obj)),
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
        cls = state_class(str(obj["__dataclass__"]))  # a lookup, never an import
        if cls is None:
            named = str(obj["__dataclass__"])[:200]
            raise CheckpointError(f"checkpoint names {named!r}, not a state class of a registered method")
        return cls(**{k: _decode(v, tensors) for k, v in obj["fields"].items()})
    raise CheckpointError("unrecognised checkpoint structure")


def _atomic_write(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open_new(tmp) as f:  # not through a link planted under this name
            write(f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException as e:  # a full disk, Ctrl-C: no half-written temporary stays behind
        tmp.unlink(missing_ok=True)
        cause = os_cause(e)  # torch's zip writer turns a failed write into a RuntimeError
        if isinstance(e, Exception) and cause is not None and cause is not e:
            raise OSError(cause.errno, cause.strerror, str(path)) from e
        raise


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _client_file(run_dir: Path, cid: ClientId, rnd: int) -> Path:
    return Path(run_dir) / "checkpoints" / "clients" / f"c{cid:07d}-r{rnd:06d}.pt"


def save_client_states(
    run_dir: Path, rnd: int, states: Iterable[tuple[ClientId, ClientState]]
) -> dict[ClientId, int]:
    """Write each (client, state) as it comes (nothing accumulates); returns the index
    entries to merge: client id -> `rnd`."""
    written: dict[ClientId, int] = {}
    for cid, st in states:
        path = _client_file(run_dir, cid, rnd)
        path.parent.parent.mkdir(exist_ok=True)  # not the run directory itself: see `save`
        path.parent.mkdir(exist_ok=True)
        tensors: dict[str, torch.Tensor] = {}
        doc = {"tree": json.dumps(_encode(st, tensors)), "tensors": tensors}

        def write(f: BinaryIO, doc: dict[str, Any] = doc) -> None:
            torch.save(doc, f)

        _atomic_write(path, write)
        written[cid] = rnd
    return written


def load_client_state(run_dir: Path, cid: ClientId, rnd: int) -> ClientState:
    path = _client_file(run_dir, cid, rnd)
    try:
        doc = torch.load(path, map_location="cpu", weights_only=True)
        state = _decode(loads(doc["tree"]), doc["tensors"])
    except Exception as e:  # any failure to read it back means a missing or corrupt file
        raise CheckpointError(f"client state {path} is missing or corrupt: {type(e).__name__}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"client state {path} holds no client state")
    return state


def save(
    run_dir: Path, state: ServerState, meta: dict[str, Any], clients: dict[ClientId, int] | None = None
) -> Path:
    """Commit round `state.round`: its tensors, then the JSON (with the client-state index)."""
    ckdir = Path(run_dir) / "checkpoints"
    ckdir.mkdir(exist_ok=True)  # not its parents: a run directory removed mid-run stays removed
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, tensors)
    stem = f"round-{state.round:06d}"
    pt = ckdir / f"{stem}.pt"
    _atomic_write(pt, lambda f: torch.save(tensors, f))
    index = [[int(c), int(r)] for c, r in sorted((clients or {}).items())]
    doc = {
        "format": FORMAT,
        "round": state.round,
        "sha256": _sha256(pt),
        "state": tree,
        "meta": meta,
        "clients": index,
    }
    _atomic_write(ckdir / f"{stem}.json", lambda f: f.write(json.dumps(doc).encode()))
    for old in sorted(ckdir.glob("round-*.json"))[:-KEEP]:
        old.with_suffix(".pt").unlink(missing_ok=True)
        old.unlink(missing_ok=True)
    _drop_unreferenced(ckdir)
    return pt


def _drop_unreferenced(ckdir: Path) -> None:
    folder = ckdir / "clients"
    if not folder.is_dir():
        return
    keep: set[str] = set()
    for js in ckdir.glob("round-*.json"):
        try:
            index = loads(js.read_text()).get("clients", [])
        except (OSError, ValueError, AttributeError):
            return  # an unreadable checkpoint: delete nothing
        keep.update(f"c{c:07d}-r{r:06d}.pt" for c, r in index)
    for f in folder.glob("c*-r*.pt"):
        if f.name not in keep:
            f.unlink(missing_ok=True)


def latest(run_dir: Path) -> Path | None:
    found = sorted((Path(run_dir) / "checkpoints").glob("round-*.json"))
    return found[-1] if found else None


def load(path: Path) -> tuple[ServerState, dict[str, Any], dict[ClientId, int]]:
    """Load a checkpoint JSON (and its tensors): the server state, the run's metadata and
    the client-state index. CheckpointError if corrupt or foreign."""
    path = Path(path)
    try:
        doc = loads(path.read_text())
    except (OSError, ValueError) as e:  # also nesting deeper than we ever write
        raise CheckpointError(f"checkpoint {path} is unreadable: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        if isinstance(found, str) and found.startswith("fl_lightning.checkpoint/"):
            raise CheckpointError(f"{path} is in checkpoint format {found}, this version reads {FORMAT}")
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
        clients = {int(c): int(r) for c, r in doc.get("clients", [])}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt: {type(e).__name__}: {e}") from None
    if not isinstance(state, ServerState):
        raise CheckpointError(f"checkpoint {path} holds no server state")
    meta = doc.get("meta", {})
    wandb_id = meta.get("wandb_id") if isinstance(meta, dict) else None
    ok_id = wandb_id is None or isinstance(wandb_id, str) and WANDB_ID.fullmatch(wandb_id) is not None
    if not isinstance(meta, dict) or not ok_id:  # W&B refused `a/b` with a traceback on resume
        shown = str(wandb_id)[:80]
        raise CheckpointError(f"checkpoint {path} is corrupt: W&B run id {shown!r} is not one W&B makes")
    return state, meta, clients


def verify(path: Path) -> int:
    """The round of checkpoint `path` if it is intact: its JSON and tensors load and match,
    and every client-state file it names loads (one at a time). CheckpointError otherwise."""
    state, _, index = load(path)
    for cid, rnd in sorted(index.items()):
        load_client_state(path.parent.parent, cid, rnd)
    return int(state.round)


def recover(run_dir: Path) -> int:
    """Make the newest intact checkpoint of `run_dir` the latest one and return its round
    (0: none was written yet). Newer checkpoints that are not intact (corrupt, truncated,
    client-state files missing or unreadable) are moved to `checkpoints/skipped/`, with the
    client files only they name, and a warning names each and why. CheckpointError when
    checkpoints exist but none is intact: nothing is moved then."""
    ckdir = Path(run_dir) / "checkpoints"
    skipped: list[tuple[Path, str]] = []
    good: Path | None = None
    rnd = 0
    for js in sorted(ckdir.glob("round-*.json"), reverse=True):
        try:
            rnd = verify(js)
        except CheckpointError as e:
            skipped.append((js, str(e)))
            continue
        good = js
        break
    if not skipped:
        return rnd
    if good is None:
        names = ", ".join(js.stem for js, _ in skipped)
        raise CheckpointError(
            f"no intact checkpoint in {ckdir} ({names}; newest: {skipped[0][1]}); "
            "the run cannot be resumed: start it again with `fl-lightning run`"
        )
    log = logging.getLogger("fl_lightning")
    aside = ckdir / "skipped"
    aside.mkdir(exist_ok=True)
    keep = set(_client_names(good))
    for js, why in skipped:
        for f in (js.with_suffix(".pt"), js):
            if f.exists():
                f.replace(aside / f.name)
        for name in set(_client_names(aside / js.name)) - keep:
            src = ckdir / "clients" / name
            if src.exists():
                (aside / "clients").mkdir(exist_ok=True)
                src.replace(aside / "clients" / name)
        log.warning(
            "skipped checkpoint %s: %s; resuming from round %d (set aside in %s)", js.stem, why, rnd, aside
        )
    return rnd


def _client_names(js: Path) -> list[str]:
    """The client-state file names a checkpoint JSON names (none if it is unreadable)."""
    try:
        index = loads(js.read_text()).get("clients", [])
        return [_client_file(Path("."), int(c), int(r)).name for c, r in index]
    except (OSError, ValueError, TypeError, AttributeError):
        return []
