"""Where relative paths land: a run's `output_dir`, and the paths given to `resume` and `compare`.

A Ray job started with `ray job submit --working-dir ...` (what `cluster/submit.sh` does) runs
in Ray's temporary copy of the uploaded code,
`<session dir>/runtime_resources/working_dir_files/_ray_pkg_<hash>/`, which goes when Ray's
session files are cleaned and is a different folder for every job. A relative path there would
put a run somewhere nobody finds it and that `resume` (another job, another folder) cannot
reach. So:

- **inside a Ray job** (`in_ray_job()`: one of Ray's job variables is set, `$RAY_JOB_ID` or
  `$RAY_JOB_CONFIG_JSON_ENV_VAR`, *and* the working directory is at or below a `_ray_pkg_*`
  folder whose parent is `working_dir_files` and grandparent `runtime_resources`), a relative
  path resolves against `runs_base()`:
  `$FL_LIGHTNING_RUNS`, default `~/fl_lightning_runs` (both cluster yamls set it on every node).
  `output_dir=runs` (the default) then writes `$FL_LIGHTNING_RUNS/runs/<experiment>/<run id>/`,
  and a relative path printed by such a job (`runs/<experiment>/<run id>`) given to a later
  job's `resume` or `compare` names the same absolute directory;
- **anywhere else** nothing changes: a relative path stays relative (to the working
  directory), as before. That includes a process with a job variable set whose working
  directory is not Ray's package folder (a driver script the user started in a folder of their
  choosing, a job submitted without `--working-dir` or with a `local://` one, a subprocess of a
  Ray task started elsewhere): that folder is the user's and lasts, so it is respected.

Which variable: Ray sets `RAY_JOB_ID` for its worker processes (tasks, actors), but a job's
entrypoint (the `python -m fl_lightning ...` of `ray job submit`) gets, in Ray 2.60 (measured),
`RAY_JOB_CONFIG_JSON_ENV_VAR` (the job's runtime env and submission id) and `RAY_ADDRESS`, not
`RAY_JOB_ID`. Either counts; processes the entrypoint starts (`sweep --parallel`) inherit it and
the working directory, so they resolve the same way.

In both cases `~` is expanded and an absolute path is returned unchanged. Pure path logic:
no Ray import, nothing touched on disk.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    from ..config import RootConfig

PathLike = Union[str, "os.PathLike[str]"]

RUNS_ENV = "FL_LIGHTNING_RUNS"
DEFAULT_RUNS_BASE = "~/fl_lightning_runs"
# Set by Ray for a job's processes: RAY_JOB_ID in workers, RAY_JOB_CONFIG_JSON_ENV_VAR (the name
# is the variable) in a submitted job's entrypoint. Either one marks "a Ray job".
JOB_ENV_VARS = ("RAY_JOB_ID", "RAY_JOB_CONFIG_JSON_ENV_VAR")
# Ray's layout: <session>/runtime_resources/working_dir_files/_ray_pkg_<hash>/
RAY_PKG_PREFIX = "_ray_pkg_"
RAY_PKG_PARENTS = ("runtime_resources", "working_dir_files")


def ray_package_dir(cwd: PathLike | None = None) -> Path | None:
    """The Ray working-dir package folder that `cwd` (default: the working directory) is at or
    below, or None. A package folder is a `_ray_pkg_*` directory directly inside
    `runtime_resources/working_dir_files/`."""
    if cwd is None:
        try:
            cwd = os.getcwd()
        except OSError:  # the working directory was removed
            return None
    path = Path(os.path.abspath(os.fspath(cwd)))
    parts = path.parts
    for i in range(len(parts) - 1, 1, -1):
        if parts[i].startswith(RAY_PKG_PREFIX) and parts[i - 2 : i] == RAY_PKG_PARENTS:
            return Path(*parts[: i + 1])
    return None


def in_ray_job(env: Mapping[str, str] | None = None, cwd: PathLike | None = None) -> bool:
    """True inside a Ray job's entrypoint (or a process it started, e.g. a `sweep --parallel`
    run): `$RAY_JOB_ID` or `$RAY_JOB_CONFIG_JSON_ENV_VAR` is set and not blank, and the working
    directory is at or below Ray's package folder (`ray_package_dir`). `env` defaults to
    `os.environ`, `cwd` to the working directory."""
    env = os.environ if env is None else env
    if not any((env.get(name) or "").strip() for name in JOB_ENV_VARS):
        return False
    return ray_package_dir(cwd) is not None


def runs_base(env: Mapping[str, str] | None = None) -> Path:
    """The absolute folder that relative paths resolve against inside a Ray job:
    `$FL_LIGHTNING_RUNS` (`~` and `$VARS` expanded; a relative value is taken relative to the
    home directory, never to the temporary working directory), default `~/fl_lightning_runs`.
    An empty value counts as unset."""
    env = os.environ if env is None else env
    raw = (env.get(RUNS_ENV) or "").strip() or DEFAULT_RUNS_BASE
    base = Path(os.path.expanduser(os.path.expandvars(raw)))
    if not base.is_absolute():
        base = Path(os.path.expanduser("~")) / base
    return base


def _resolve(path: PathLike, env: Mapping[str, str] | None, cwd: PathLike | None) -> Path:
    p = Path(os.path.expanduser(os.fspath(path)))
    if p.is_absolute() or not in_ray_job(env, cwd):
        return p
    return runs_base(env) / p


def resolve_output_dir(
    path: PathLike, env: Mapping[str, str] | None = None, cwd: PathLike | None = None
) -> Path:
    """A run's `output_dir` as the run will use it: `~` expanded; absolute: unchanged; relative:
    under `runs_base()` inside a Ray job (`in_ray_job()`), else unchanged (relative to the
    working directory, exactly `Path(output_dir).expanduser()` as before)."""
    return _resolve(path, env, cwd)


def resolve_run_path(
    path: PathLike, env: Mapping[str, str] | None = None, cwd: PathLike | None = None
) -> Path:
    """A run directory given to `resume`, or a folder given to `compare` (and its `--out`):
    the same rule as `resolve_output_dir`, so the path a job printed, relative or absolute,
    names the same directory in a later job."""
    return _resolve(path, env, cwd)


def node_name() -> str:
    """This machine's host name, to say on which node a run directory lives (no network)."""
    return socket.gethostname() or "localhost"


def run_dir_message(run_dir: PathLike) -> str:
    """The line a run prints when it creates its directory: the absolute path and the node,
    e.g. `run dir: /home/me/fl_lightning_runs/runs/cmp/fedavg_fmnist_s0_... (node head-1)`."""
    return f"run dir: {os.path.abspath(os.path.expanduser(os.fspath(run_dir)))} (node {node_name()})"


def new_run_dir(cfg: RootConfig) -> Path:
    """Where a new run goes: <output_dir>/<experiment>/<run_id, or method_data_seed_time_hex>."""
    run_id: str = cfg.run_id or (
        f"{cfg.method.name}_{cfg.data.name}_s{cfg.seed}_{time.strftime('%Y%m%d-%H%M%S')}_{secrets.token_hex(2)}"
    )
    experiment: str = cfg.experiment
    return resolve_output_dir(cfg.output_dir) / experiment / run_id
