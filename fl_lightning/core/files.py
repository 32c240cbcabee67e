"""Writing files of our own: whole or not at all, never through a link planted in a shared run
directory (no matplotlib import here: a figure is duck-typed)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def cache_dir(kind: str, env: str) -> Path:
    """Where the cache `kind` (text, teachers, ...) lives: `$<env>` when set; else, when
    `$FL_LIGHTNING_DATA` moves the datasets, `$FL_LIGHTNING_DATA/.cache/<kind>` beside their
    decoded images (so one variable moves everything a machine stores); else
    `~/.cache/fl_lightning/<kind>`, beside the default data root."""
    for value, sub in ((os.environ.get(env), ""), (os.environ.get("FL_LIGHTNING_DATA"), f".cache/{kind}")):
        if value:
            return Path(os.path.expandvars(value)).expanduser() / sub
    return Path("~/.cache/fl_lightning").expanduser() / kind


def write_atomic(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """`write(f)` into a temporary file beside `path`, then renamed over it: `path` is whole or
    what it was before (a killed writer, a full disk), and a link planted at `path` is
    replaced, not written through."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_figure(fig: Any, path: str | Path) -> Path:
    """`fig.savefig` as PNG, written atomically: a reader (the W&B upload, a dashboard) never
    sees half a picture, and a failed write leaves nothing."""
    return write_atomic(path, lambda f: fig.savefig(f, format="png"))


def copy_atomic(src: str | Path, dst: str | Path) -> Path:
    """`src`'s bytes to `dst`, written atomically."""

    def copy(out: BinaryIO) -> None:
        with open(src, "rb") as f:
            shutil.copyfileobj(f, out)

    return write_atomic(dst, copy)


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """`torch.save`, written atomically: a cache or weights file is whole or absent, never half
    written."""
    import torch  # here: the CLI imports this module before torch

    return write_atomic(path, lambda f: torch.save(obj, f))


def open_new(path: Path) -> BinaryIO:
    """`path` opened for writing as a new file of its own: a leftover of the same name (a
    stale temporary file, or a planted link) is removed first, and O_EXCL | O_NOFOLLOW make
    sure that what is written cannot land in a file elsewhere."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o644), "wb")
