"""Starting or joining Ray.

A local Ray started by us stays on loopback (see shared/RAY_LOCAL.md): node IP
127.0.0.1, no 8.8.8.8 probe, no cloud-metadata look-ups, no usage report, session files
in our own temp dir. Joining a cluster applies none of this.

Which Ray a run uses (`cluster_address`):

- `runtime.address=auto` or `host:port` (or `ray://host:port`): join that cluster;
- `runtime.address=local`: always a private local Ray;
- `runtime.address=null` (default): join the cluster named by `$RAY_ADDRESS` when it is a
  cluster address (inside a job started by `ray job submit`, Ray sets it to the head's
  GCS address, so the job's driver joins the cluster it was submitted to); an
  `http://` dashboard URL there (what `ray job submit` itself reads) is not a cluster
  address and is ignored; otherwise start a private local Ray.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # node IP 127.0.0.1, listeners on loopback
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",  # discard port: refused at once
    "RAY_AUTH_MODE": "disabled",  # no ~/.ray/auth_token
}


def ray_tmpdir() -> Path:
    """Short path: Ray's unix sockets live under it (107-byte limit)."""
    return Path(os.environ.get("FL_LIGHTNING_RAY_TMPDIR", Path(tempfile.gettempdir()) / "fl_lightning_ray"))


def ray_home() -> Path:
    """A HOME holding `ray_bootstrap_config.yaml` = {}: stops the cloud-metadata probes."""
    home = ray_tmpdir() / "home"
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "ray_bootstrap_config.yaml"
    if not cfg.exists():
        cfg.write_text("{}\n")
    return home


def loopback_cli_env(tmpdir: Path | None = None) -> dict[str, str]:
    """The variables for a `ray start --head` (or any Ray CLI) that must stay on loopback:
    the loopback switches, `RAY_TMPDIR` and a `HOME` holding `ray_bootstrap_config.yaml`.
    Merge them into a copy of `os.environ` for a subprocess; nothing here is changed."""
    tmpdir = Path(tmpdir) if tmpdir is not None else ray_tmpdir()
    home = tmpdir / "home"
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "ray_bootstrap_config.yaml").exists():
        (home / "ray_bootstrap_config.yaml").write_text("{}\n")
    return {**LOOPBACK_ENV, "RAY_TMPDIR": str(tmpdir), "HOME": str(home)}


def apply_loopback_env() -> dict[str, str]:
    """Set the loopback variables in this process (Ray's processes inherit them)."""
    env = {**LOOPBACK_ENV, "RAY_TMPDIR": str(ray_tmpdir())}
    ray_tmpdir().mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    return env


@contextlib.contextmanager
def _home(path: Path) -> Iterator[None]:
    before = os.environ.get("HOME")
    os.environ["HOME"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = before


def cluster_address(address: str | None) -> str | None:
    """The cluster to join, or None for a private local Ray (see the module docstring)."""
    if address == "local":
        return None
    if address:
        return address
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env and not env.startswith(("http://", "https://")):
        return env
    return None


def init_ray(address: str | None, num_cpus: int | None = None, num_gpus: int | None = None) -> bool:
    """Start a private local Ray on loopback, or join a cluster (`address`, else
    `$RAY_ADDRESS`: see `cluster_address`). Returns True if this call connected (so the
    caller should `ray.shutdown()`), False if Ray was already up."""
    address = cluster_address(address)
    if not address:
        apply_loopback_env()  # before `import ray`: Ray reads some of these at import
    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        return False
    kwargs = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True)
    if address:
        ray.init(address=address, **kwargs)
        res = ray.cluster_resources()
        print(
            f"ray: joined the cluster at {address} ({len(ray.nodes())} nodes, "
            f"{res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs)",
            file=sys.stderr,
        )
        return True
    # If Ray was imported before the variables were set (e.g. by user code), the node-IP
    # switch was already read; set it the way the variable would have.
    ray_constants.ENABLE_RAY_CLUSTER = False
    with _home(ray_home()):
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, **kwargs)
    return True
