"""Reads a W&B offline run file (`run-<id>.wandb`) so tests can check what was logged.

The file is a LevelDB-style log (7-byte header ':W&B' + magic + version, then 32 KiB
blocks of records with crc32/length/type headers) of `wandb_internal_pb2.Record`s.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32768


def records(path: Path) -> Iterator[Any]:
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if length == 0 and kind == 0:
            break
        buf += data[pos : pos + length]
        pos += length
        if kind in (1, 4):  # FULL or LAST fragment
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read_run(path: Path) -> dict[str, Any]:
    """{'run': Record.run, 'history': [ {key: value} ], 'summary': {key: value}, 'config': {...},
    'metrics': [Record.metric (a `define_metric`)]}."""
    out: dict[str, Any] = {"run": None, "history": [], "summary": {}, "config": {}, "metrics": []}
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run"] = rec.run
            for item in rec.run.config.update:
                out["config"][_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            for item in rec.summary.update:
                out["summary"][_key(item)] = json.loads(item.value_json)
        elif kind == "metric":
            out["metrics"].append(rec.metric)
        elif kind == "config":
            for item in rec.config.update:
                out["config"][_key(item)] = json.loads(item.value_json)
    return out


def read_finished_run(path: Path, timeout: float = 60.0) -> dict[str, Any]:
    """`read_run` once the file holds its exit record: W&B's service may still be writing
    the offline file when `run.finish()` returns (seen: only the 7-byte header)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(r.WhichOneof("record_type") == "exit" for r in records(path)):
                break
        except Exception:  # a record still being written
            pass
        time.sleep(0.2)
    return read_run(path)
