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

A local Ray never sees the working directory (which the user may not have written: a
download, a shared folder): `ray.init` puts the driver's working directory first on every
worker's `sys.path` (`py_driver_sys_path`), so a `torch.py` lying there ran in each worker. It
is called from an empty private folder (`_private_cwd`), which is what Ray records and where its
processes start; a client worker goes back to the driver's directory (relative paths in the
config mean what they meant) only once its imports are done (`WORKER_CWD_ENV`, read by
`actor.ClientActor`), and nothing of it is on its `sys.path`.

A local Ray takes no port of Ray's defaults: its dashboard agent (52365) and its dashboard
server (8265, where that server listens: it starts even with the dashboard off) get free
ports, so a user's own `ray start --head` on the same machine gets those, and `ray job
submit` reaches that head (not this run's Ray, nor "No available agent to submit job").
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
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
    """Short path: Ray's unix sockets live under it (107-byte limit). Absolute: `ray.init`
    runs in another folder (`_private_cwd`). One a user (`/tmp/fl_lightning_ray-<uid>`): on a
    shared workstation another user's folder would hold this user's sockets and session files."""
    default = Path(tempfile.gettempdir()) / f"fl_lightning_ray-{os.getuid()}"
    return Path(os.path.abspath(os.environ.get("FL_LIGHTNING_RAY_TMPDIR", default)))


def private_ray_tmpdir() -> Path:
    """`ray_tmpdir()`, made (0700) where missing and checked before a local Ray uses it: a real
    folder of this user's that no one else can write. Ray puts its raylet's and object store's
    unix sockets there, and whoever can reach them can run code as this user: a link, or a
    folder another user made or can write, is one line (`StartupError`), never used. The default
    folder, ours but open to others (made by an older version with the umask's 0755), is closed
    (0700); one the user chose is never changed."""
    import stat

    path = ray_tmpdir()
    chosen = "FL_LIGHTNING_RAY_TMPDIR" in os.environ
    how = "set FL_LIGHTNING_RAY_TMPDIR to a folder of your own (mode 0700)"
    try:
        if not os.path.lexists(path):
            path.mkdir(mode=0o700, parents=True)
        st = os.lstat(path)
    except FileExistsError:  # made by another run between the check and the mkdir
        st = os.lstat(path)
    except OSError as e:
        raise StartupError(f"cannot make the Ray temp folder {path}: {e.strerror or e}; {how}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StartupError(f"the Ray temp folder {path} is a link or not a folder; {how}")
    if st.st_uid != os.getuid():
        raise StartupError(
            f"the Ray temp folder {path} belongs to user id {st.st_uid}, not you (its Ray sockets would be "
            f"theirs to reach); {how}"
        )
    if chosen and st.st_mode & 0o022:
        raise StartupError(
            f"the Ray temp folder {path} can be written by other users (mode {stat.S_IMODE(st.st_mode):o}); "
            "chmod 700 it, or " + how
        )
    if not chosen and st.st_mode & 0o077:  # ours alone, as it is made
        os.chmod(path, 0o700)
    return path


def ray_home() -> Path:
    """A HOME holding `ray_bootstrap_config.yaml` = {}: stops the cloud-metadata probes."""
    home = private_ray_tmpdir() / "home"
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
    env = {**_defaults(), **LOOPBACK_ENV, "RAY_TMPDIR": str(private_ray_tmpdir())}
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
#: set around `ray.init` of a local Ray (its processes inherit it): the driver's working
#: directory, where a client worker goes once its imports are done
WORKER_CWD_ENV = "FL_LIGHTNING_WORKER_CWD"


def ray_temp_root() -> str:
    """Where the Ray about to start keeps its session directories, as /proc shows paths (no
    link): `<RAY_TMPDIR>/ray`, Ray's own rule (`ray._common.utils.get_default_ray_temp_dir`)."""
    base = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return os.path.realpath(os.path.join(base, "ray"))


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
                [sys.executable, "-I", "-S", watchdog.__file__, mark, str(os.getpid()), str(os.getsid(0)),
                 ray_temp_root()],
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
    stops its watchdog, which ends whatever of it is left, and removes the empty folder it
    started in."""

    def __init__(self, watchdog: Watchdog | None = None, folder: str | None = None) -> None:
        self.watchdog = watchdog
        self.folder = folder

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.folder is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)  # only if empty: nothing of anyone's is removed


def _session_dir() -> str:
    """The session directory of the Ray this process started ("" if Ray's internals moved),
    as /proc shows it (no link)."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    return os.path.realpath(node.get_session_dir_path()) if node is not None else ""


@contextlib.contextmanager
def _private_cwd(folder: str) -> Iterator[None]:
    """Run the block in `folder` (empty, ours) and come back: `ray.init` records the working
    directory for its workers' `sys.path`, and Ray's processes start in it. The driver's own
    directory is handed to the client workers in `WORKER_CWD_ENV`."""
    try:
        here: str | None = os.getcwd()
    except OSError:  # the working directory was removed: nothing to hand on
        here = None
    before = os.environ.get(WORKER_CWD_ENV)
    if here is not None:
        os.environ[WORKER_CWD_ENV] = here
    os.chdir(folder)
    try:
        yield
    finally:
        if here is not None:
            with contextlib.suppress(OSError):
                os.chdir(here)
        if before is None:
            os.environ.pop(WORKER_CWD_ENV, None)
        else:
            os.environ[WORKER_CWD_ENV] = before


@contextlib.contextmanager
def _private_head_params(log_monitor: bool = True) -> Iterator[None]:
    """What `ray.init(address="local")` cannot be told, for the block (Ray's parameters default
    them). The dashboard agent listens on a free port (0; Ray reads the bound one back), not
    52365, which another user's Ray may hold (the dashboard's own port is
    `ray.init(dashboard_port=0)`). And a private head starts neither the autoscaler monitor nor
    the API server (the "minimal dashboard" `include_dashboard=False` still starts): it is one
    fixed node that nothing scales, and nothing submits jobs to it or reads its state API, while
    each is a Python process importing Ray on the cores a cold start waits for (0.3 and 0.6
    CPU-s of Ray's ~2.3 on 2 cores: `benchmarks/cold_phases.py`, `cpu_s.<kind>`). The log
    monitor carries the workers' output to the driver: started unless nothing is forwarded
    (`log_monitor=False`, `init_ray(log_to_driver=False)`), where it would only tail files for
    no one (~0.25 CPU-s a minute, idle: `benchmarks/ray_idle.py`)."""
    from ray._private import parameter, services

    original, api_server = parameter.RayParams, services.start_api_server

    class PrivateHead(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("dashboard_agent_listen_port", 0)
            kwargs.setdefault("no_monitor", True)
            kwargs.setdefault("include_log_monitor", log_monitor)
            super().__init__(*args, **kwargs)

    def no_api_server(*args: Any, **kwargs: Any) -> tuple[None, None]:
        return None, None  # (url, process): Node records no dashboard process

    parameter.RayParams = PrivateHead  # type: ignore[misc]
    services.start_api_server = no_api_server
    try:
        yield
    finally:
        parameter.RayParams, services.start_api_server = original, api_server  # type: ignore[misc]


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


#: how long a cluster's address may take to accept a connection before the join is given up
JOIN_TIMEOUT_S = 15.0


def check_reachable(address: str, timeout: float = JOIN_TIMEOUT_S) -> None:
    """StartupError (one line) unless something accepts a TCP connection at `address`'s host and
    port within `timeout` seconds: Ray itself retried an address where nothing listens for
    minutes, printing only its own lines. `auto` (Ray finds the address itself) and an address
    without a port are left to Ray."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if address == "auto" or not host or not port.isdigit():
        return
    host = host.strip("[]")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise StartupError(
            f"cannot join the Ray cluster at {address}: nothing accepts a connection at {host}:{port} "
            f"({why}, within {timeout:g} s); is its head up? (runtime.address=local: a private Ray)"
        ) from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def init_ray(
    address: str | None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    *,
    log_to_driver: bool = True,
    idle_workers: bool = True,
) -> RayConnection | None:
    """Start a private local Ray on loopback, or join a cluster (`address`, else
    `$RAY_ADDRESS`: see `cluster_address`). Returns the connection if this call connected
    (the caller shuts it down), None if Ray was already up. `log_to_driver=False` keeps the
    workers' output in Ray's session logs instead of this process's stdout and stderr.

    A private Ray collects no metrics (`enable_metrics_collection`): it starts no dashboard,
    so nothing reads them (their export cost its agent and raylet ~0.1 CPU-s a minute, idle).
    `idle_workers=False` (a private Ray that mostly waits, as the test suite's shared one)
    prestarts no idle workers: Ray keeps one a CPU ready for the first actors (a cold start's
    gain), each ~0.3 CPU-s a minute while it waits (`benchmarks/ray_idle.py`)."""
    address = cluster_address(address)
    if not address:
        apply_loopback_env()  # before `import ray`: Ray reads some of these at import
    import ray
    from ray._private import ray_constants

    if ray.is_initialized():
        return None
    from . import signals

    sigterm = signals.our_handler()
    kwargs: dict[str, Any] = dict(
        include_dashboard=False, logging_level=logging.WARNING, log_to_driver=log_to_driver
    )
    if address:
        check_reachable(address)
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
    folder = tempfile.mkdtemp(prefix="cwd-", dir=ray_tmpdir())  # empty, 0700: ours alone
    dog = Watchdog()
    mark = dog.start()
    before = os.environ.get(OWNER_ENV)
    try:
        if mark:
            os.environ[OWNER_ENV] = mark  # inherited by every process of this Ray
        # held: a signal during `ray.init` raises after it returns, never half-way through
        system: dict[str, Any] = {"enable_metrics_collection": False}
        if not idle_workers:
            system |= {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
        with signals.held(), _home(ray_home()), _private_cwd(folder), _private_head_params(log_to_driver):
            ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, dashboard_port=0,
                     _system_config=system, **kwargs)  # fmt: skip
            signals.restore_after_ray_init(sigterm)
            dog.watch(_session_dir())
    except BaseException as e:
        RayConnection(dog, folder).shutdown()
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
    return RayConnection(dog, folder)
