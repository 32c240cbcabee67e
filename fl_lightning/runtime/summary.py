"""`summary.json`: a run's result in one object, read by `compare`, `sweep`, `reproduce` and
the console table. `final_accuracy`/`best_accuracy`/`accuracy_metric` are kept beside
`final_<primary>` for single-label runs: every earlier result and tool reads them."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ..config import RootConfig, variant_of
from ..core.types import ClientId
from ..tracking.chance import chance_note
from .placement import Placement
from .record import driver_memory_mb


def run_summary(
    cfg: RootConfig,
    records: list[dict[str, Any]],
    primary: str,
    run_id: str,
    status: str,
    placement: Placement | None,
    actors_reused: int = 0,
    actors_prestarted: int = 0,
    startup_s: float | None = None,
    clients_evaluated_ids: Sequence[ClientId] | None = None,
    extra: dict[str, Any] | None = None,
    error: str | None = None,
    chance: tuple[str, float, float] | None = None,
) -> dict[str, Any]:
    """`placement`: None when Ray did not start; `extra`: the method's own keys
    (`Strategy.run_summary`), the pretrained trunk the run started from (`model_weights`);
    `error`: why the run stopped (one line); `chance`: the test set's chance level
    (`tracking.chance.chance_level`) for a completed run, which is warned about if it never
    did better."""
    evald = [r for r in records if r.get(primary) is not None and not r.get("diverged")]
    out: dict[str, Any] = {
        "method": cfg.method.name,
        "dataset": cfg.data.name,
        "model": cfg.model["name"],
        "seed": int(cfg.seed),
        "experiment": cfg.experiment,
        "run_id": run_id,
        "status": status,
        "executor": cfg.runtime.executor,
        "num_clients": int(cfg.fl.num_clients),
        "rounds": int(cfg.fl.rounds),
        "rounds_completed": max((int(r["round"]) for r in records if not r.get("diverged")), default=0),
        "primary_metric": primary,
        f"final_{primary}": None,
        f"best_{primary}": None,
        "best_round": None,
        # a round that failed part-way has a line without one: the last line that has one
        "wall_time_s": next((float(r["wall_time_s"]) for r in reversed(records) if "wall_time_s" in r), 0.0),
        "bytes_up_total": int(sum(r.get("bytes_up", 0) for r in records)),
        "bytes_down_total": int(sum(r.get("bytes_down", 0) for r in records)),
        "clients_failed_total": int(sum(r.get("clients_failed", 0) for r in records)),
        "driver_peak_rss_mb": driver_memory_mb().get("driver_peak_rss_mb"),
        "driver_anon_max_mb": max((r.get("driver_anon_mb", 0.0) for r in records), default=None),
        "num_actors": placement.num_actors if placement else 0,  # None: Ray did not start
        "actors_reused": actors_reused,  # warm workers of a sweep's previous run
        "actors_prestarted": actors_prestarted,  # started while the driver imported
        "startup_s": None if startup_s is None else round(startup_s, 3),
        "threads_per_client": placement.threads if placement else None,
        "machine": machine(),  # where it ran: a report of its runs says so, not where it is written
        "code": this_code(),  # the commit it ran at: a report checks its claims are older
        **run_times(records),  # when: a report flags runs started before their claims were committed
    }
    out["variant"] = variant_of(cfg)  # what sets it apart in its experiment: `compare --by variant`
    if cfg.row:
        out["row"] = cfg.row  # a reproduction's row: `compare --by row`
    out.update(extra or {})
    if clients_evaluated_ids is not None:
        out["clients_evaluated_ids"] = list(clients_evaluated_ids)  # whose splits client_* averages
    single_label = primary in ("accuracy", "client_accuracy")
    if single_label:  # the keys every earlier result and tool reads
        out.update(accuracy_metric=primary, final_accuracy=None, best_accuracy=None)
    if evald:
        best = max(evald, key=lambda r: r[primary])
        out.update(
            {
                f"final_{primary}": evald[-1][primary],
                f"best_{primary}": best[primary],
                "best_round": best["round"],
            }
        )
        if single_label:
            out.update(final_accuracy=evald[-1][primary], best_accuracy=best[primary])
        for k, v in evald[-1].items():
            if (
                (k.startswith("client_") or k.startswith(("many_", "medium_", "few_")))
                and k != primary
                and isinstance(v, float)
            ):
                out[f"final_{k}"] = v
    if error is not None:
        out["error"] = error
    elif status == "completed":  # learned nothing, yet nothing diverged: say so
        out.update(chance_note(records, chance))
        if chance is not None:  # what a report checks the metrics against again
            metric, level, margin = chance
            out["chance_level"] = {"metric": metric, "level": round(level, 6), "margin": round(margin, 6)}
    return out


def run_times(records: list[dict[str, Any]]) -> dict[str, str]:
    """`finished_at`: now (UTC, the summary is written as the run ends); `started_at`: that
    minus the run's wall time (its last line's `wall_time_s`; a resumed run's counts its
    rounds, not the pause between), to the second."""
    now = datetime.now(timezone.utc)
    wall = next((float(r["wall_time_s"]) for r in reversed(records) if "wall_time_s" in r), 0.0)
    return {
        "started_at": (now - timedelta(seconds=wall)).isoformat(timespec="seconds"),
        "finished_at": now.isoformat(timespec="seconds"),
    }


#: what the code of a run is: the package, its configs and its dependencies (not the results
#: a reproduction writes into the same tree while it runs)
CODE_PATHS = ("fl_lightning", "conf", "pyproject.toml")


#: git run on a checkout we did not make (a claims folder, `FL_LIGHTNING_CONF`): none of its
#: own configured commands run (`core.fsmonitor` is a command git runs on `status`; hooks)
SAFE_GIT = ("git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null")


def git_command(root: Path, *args: str) -> list[str]:
    """`git -C root args` with the checkout's own commands off (`SAFE_GIT`)."""
    return [*SAFE_GIT, "-C", str(root), *args]


@functools.cache  # once per process: the code it imported, not what changed since
def this_code() -> dict[str, Any] | None:
    """`code_version` of the checkout holding this package."""
    return code_version(Path(__file__).resolve().parents[2])


def code_version(root: Path) -> dict[str, Any] | None:
    """`{"commit": sha, "dirty": bool}` of the git checkout at `root` (dirty: `CODE_PATHS`
    differ from the commit, untracked files included); None where `root` is not the top of a
    checkout (an installed copy) or git is missing."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(
            git_command(root, *args), capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root.resolve():
            return None  # an installed copy inside some other repository
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--", *CODE_PATHS) != ""
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """This machine in a few words: CPU model and cores, its first GPU (if any), Python."""
    import os
    import platform

    import torch

    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return f"{cpu_model()} x{os.cpu_count()}{gpu}, Python {platform.python_version()}"
