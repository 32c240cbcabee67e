"""Starting or joining Ray.

A local Ray started by us stays on loopback (see shared/RAY_LOCAL.md): node IP
127.0.0.1, no 8.8.8.8 probe, no cloud-metadata look-ups, no usage report, session files
in our own temp dir. Joining a cluster (`runtime.address`) applies none of this.
"""
from __future__ import annotations

import contextlib
import logging
import os
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


def init_ray(address: str | None, num_cpus: int | None = None, num_gpus: int | None = None) -> bool:
    """Start a private local Ray on loopback, or join `address`. Returns True if this call
    connected (so the caller should `ray.shutdown()`), False if Ray was already up."""
    if not address:
        apply_loopback_env()  # before `import ray`: Ray reads some of these at import
    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        return False
    kwargs = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True)
    if address:
        ray.init(address=address, **kwargs)
        return True
    # If Ray was imported before the variables were set (e.g. by user code), the node-IP
    # switch was already read; set it the way the variable would have.
    ray_constants.ENABLE_RAY_CLUSTER = False
    with _home(ray_home()):
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, **kwargs)
    return True
