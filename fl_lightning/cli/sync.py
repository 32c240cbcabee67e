"""`fl-lightning sync <runs folder>`: upload every offline W&B run of an experiment (or of
any folder of runs) in one command, with `wandb sync`, when a W&B API key is configured
(`WANDB_API_KEY` or `wandb login`); without one (or with `WANDB_MODE` not online), one
`fl-lightning: error:` line saying which, exit 2, and nothing else.
Runs W&B marked as synced (`run-<id>.wandb.synced`) are not sent again."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..core.errors import ConfigError
from ..tracking.compare import summary_files
from ..tracking.loggers import wandb_mode


def offline_runs(root: Path) -> list[Path]:
    """The offline W&B run folders (`<run dir>/wandb/offline-run-*`) of the run directories at
    or under `root` (found as `compare` finds them: never through a link), not yet synced."""
    found: list[Path] = []
    for summary in summary_files(root):
        wandb_dir = summary.parent / "wandb"
        if wandb_dir.is_symlink() or not wandb_dir.is_dir():
            continue
        for run in sorted(wandb_dir.glob("offline-run-*")):
            files = list(run.glob("run-*.wandb"))
            if (
                run.is_dir()
                and not run.is_symlink()
                and files
                and not all(f.with_name(f.name + ".synced").exists() for f in files)
            ):
                found.append(run)
    return found


def sync_command(folder: str) -> int:
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ConfigError(f"{root} is not a folder of runs")
    runs = offline_runs(root)
    if not runs:
        print(f"fl-lightning sync: no offline W&B runs left to upload in {root}")
        return 0
    if wandb_mode("auto") != "online":
        mode = os.environ.get("WANDB_MODE")
        why = (  # with a key set, the mode is the reason (the key was blamed)
            f"WANDB_MODE={mode} (unset it, or set WANDB_MODE=online)"
            if mode and mode != "online" and os.environ.get("WANDB_API_KEY")
            else "no W&B API key (set WANDB_API_KEY or run `wandb login`)"
        )
        raise ConfigError(f"{why}: {len(runs)} offline runs in {root} stay offline")
    print(f"fl-lightning sync: uploading {len(runs)} offline runs from {root}")
    from .spawn import tool_command

    return subprocess.call([*tool_command("wandb"), "sync", *map(str, runs)])
