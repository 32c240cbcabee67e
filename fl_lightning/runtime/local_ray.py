"""Starting or joining Ray.

A local Ray started by us stays on loopback (the project's notes on local Ray): node IP
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

No process of a local Ray outlives the run that started it. Ray's own start-up and
`ray.shutdown()` stop the GCS and the raylet, but not always the agents the raylet starts
(`DashboardAgent`, `RuntimeEnvAgent`): after Ctrl-C during start-up (the terminal sends
SIGINT to Ray's processes too) or `kill -9` of the driver they stayed 1-2.5 minutes. So
`init_ray` starts a small watchdog (`watchdog.py`) in its own session that waits on a pipe
from the driver: when the pipe closes (`RayConnection.shutdown()`, after `ray.shutdown()`, or
the driver's death, `kill -9` included), it sends SIGTERM, then SIGKILL, to the processes of
that Ray, and only to them: those of the driver's session id holding a file open in the
Ray's session directory (which the driver reports once `ray.init` returns), and those whose
environment carries the mark `FL_LIGHTNING_RAY_OWNER=<pid>-<token>` (set around `ray.init`,
inherited from the raylet; the agents lose it when they rename themselves).
A SIGINT or SIGTERM during `ray.init` is held until it returns (a second one interrupts at
once), then Ray is shut down and the interrupt raised: Ray's start-up is never left half done.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core.errors import StartupError
from . import watchdog

LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # node IP 127.0.0.1, listeners on loopback
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",  # discard port: refused at once
    "RAY_AUTH_MODE": "disabled",  # no ~/.ray/auth_token
}
# Defaults a user's own setting overrides. Ray warns on every run (a raylet line streamed into
# the driver's stderr) once its temp disk is 95% full; on a large shared disk that is many GB
# free. 99%: the warning (and Ray's refusal to spill) only when the disk is really nearly full.
DEFAULT_ENV = {"RAY_local_fs_capacity_threshold": "0.99"}


def _defaults() -> dict[str, str]:
    return {k: os.environ.get(k, v) for k, v in DEFAULT_ENV.items()}


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
    return {**_defaults(), **LOOPBACK_ENV, "RAY_TMPDIR": str(tmpdir), "HOME": str(home)}


def apply_loopback_env() -> dict[str, str]:
    """Set the loopback variables in this process (Ray's processes inherit them)."""
    env = {**_defaults(), **LOOPBACK_ENV, "RAY_TMPDIR": str(ray_tmpdir())}
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


OWNER_ENV = watchdog.OWNER_ENV


class Watchdog:
    """The watchdog of a local Ray about to start (`start`), and the mark its processes get
    in their environment (`mark`: None where there is no /proc, nothing to watch with)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.mark: str | None = None

    def start(self) -> str | None:
        if not os.path.isdir("/proc"):
            return None
        mark = f"{os.getpid()}-{secrets.token_hex(6)}"
        env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", watchdog.__file__, mark, str(os.getpid()), str(os.getsid(0))],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )  # fmt: skip
        except OSError:
            return None
        self.mark = mark
        return mark

    def watch(self, session_dir: str) -> None:
        """Tell it the session directory of the Ray now started (where its processes hold
        their log files open: found by that even after the environment mark is lost)."""
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.write(f"{session_dir}\n".encode())
                self.proc.stdin.flush()

    def stop(self, wait_s: float = 10.0) -> None:
        """After `ray.shutdown()`: end what that Ray left behind (the watchdog does, then
        exits). A no-op when it never started or was stopped already."""
        wd, self.proc = self.proc, None
        if wd is None:
            return
        if wd.stdin is not None:
            with contextlib.suppress(OSError):
                wd.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            wd.wait(timeout=wait_s)


class RayConnection:
    """A Ray that `init_ray` started or joined: `shutdown` disconnects, and for a local Ray
    stops its watchdog, which ends whatever of it is left."""

    def __init__(self, watchdog: Watchdog | None = None) -> None:
        self.watchdog = watchdog

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        if self.watchdog is not None:
            self.watchdog.stop()


def _session_dir() -> str:
    """The session directory of the Ray this process started ("" if Ray's internals moved)."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    return str(node.get_session_dir_path()) if node is not None else ""


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


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def init_ray(
    address: str | None, num_cpus: int | None = None, num_gpus: int | None = None
) -> RayConnection | None:
    """Start a private local Ray on loopback, or join a cluster (`address`, else
    `$RAY_ADDRESS`: see `cluster_address`). Returns the connection if this call connected
    (the caller shuts it down), None if Ray was already up."""
    address = cluster_address(address)
    if not address:
        apply_loopback_env()  # before `import ray`: Ray reads some of these at import
    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        return None
    from . import signals

    sigterm = signals.our_handler()
    kwargs: dict[str, Any] = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True)
    if address:
        try:
            ray.init(address=address, **kwargs)
        except Exception as e:  # unreachable, refused, timed out: one line, not Ray's traceback
            raise StartupError(f"cannot join the Ray cluster at {address}: {_first_line(e)}") from None
        signals.restore_after_ray_init(sigterm)
        res = ray.cluster_resources()
        print(
            f"ray: joined the cluster at {address} ({len(ray.nodes())} nodes, "
            f"{res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs)",
            file=sys.stderr,
        )
        return RayConnection()
    # If Ray was imported before the variables were set (e.g. by user code), the node-IP
    # switch was already read; set it the way the variable would have.
    ray_constants.ENABLE_RAY_CLUSTER = False
    dog = Watchdog()
    mark = dog.start()
    before = os.environ.get(OWNER_ENV)
    try:
        if mark:
            os.environ[OWNER_ENV] = mark  # inherited by every process of this Ray
        # held: a signal during `ray.init` raises after it returns, never half-way through
        with signals.held(), _home(ray_home()):
            ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, **kwargs)
            signals.restore_after_ray_init(sigterm)
            dog.watch(_session_dir())
    except BaseException as e:
        RayConnection(dog).shutdown()
        if isinstance(e, Exception):  # e.g. "The current node timed out during startup" under load
            raise StartupError(
                f"the local Ray did not start: {_first_line(e)} (an overloaded machine: try again, "
                "or runtime=serial)"
            ) from None
        raise
    finally:
        if before is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = before
    return RayConnection(dog)
