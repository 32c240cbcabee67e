"""Writing a file whole or not at all (no matplotlib import here: a figure is duck-typed)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: str | Path) -> Path:
    """`fig.savefig` as PNG to a temporary file beside `path`, then renamed: a reader (the W&B
    upload, a dashboard) never sees half a picture, and a failed write leaves nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
