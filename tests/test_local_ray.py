"""How a local Ray of ours starts, seen from the user's side of the machine (docs/reliability.md,
"Shared folders" and "Clean exits"): its workers never see the working directory, its watchdog
ends its own processes and no one else's, and it takes none of the ports a user's own Ray head
needs. Each test runs `fl-lightning` as a user would, in a subprocess, on a Ray of its own
(`FL_LIGHTNING_RAY_TMPDIR`), and ends only what it started."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from fl_lightning.runtime.local_ray import loopback_cli_env

from .conftest import small
from .ray_head import BIN, Head, _free_ports, check_submitted, submit_run
from .test_reliability import EXE, TINY, _alive, _clean_up, _cmdline, _left_after, _of_run

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to find processes")


def _plant(where: Path, name: str, marker: Path) -> None:
    """`<where>/<name>.py`: importing it appends its PID to `marker` (and provides nothing)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{name}.py").write_text(
        f"import os\nwith open({str(marker)!r}, 'a') as f:\n    f.write(str(os.getpid()) + '\\n')\n"
    )


def _pause(pid: int) -> None:
    """SIGSTOP a run a test keeps alive only to be beside what it checks (its Ray's ports stay
    bound, its signal handlers in place): left training, even at nice 19, it took CPU from the
    rest of the suite for the whole test (20 of the test's 40 CPU-s on a quiet machine, where
    nice 19 still gets an idle core). `_resume` before it is asked to stop."""
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGSTOP)


def _resume(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGCONT)


def _env(ray_tmp: str) -> dict[str, str]:
    return {**os.environ, "FL_LIGHTNING_RAY_TMPDIR": ray_tmp}


# --- 1. a module in the working directory runs in no Ray worker -------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_torch_py_in_the_working_directory_runs_in_no_ray_worker(tmp_path, data_root, command):
    """`ray.init` put the driver's working directory first on every worker's sys.path: a
    `torch.py` (or `lightning.py`) there ran in each worker of a plain `fl-lightning run`
    (Ray is the default) before it imported torch, and in those of `sweep --parallel`'s
    children (started with `-P`: their Ray put it back). Now Ray starts from an empty folder
    of its own: the runs complete, nothing planted ran; a relative `output_dir` still means
    the user's folder."""
    cwd, marker = tmp_path / "shadow", tmp_path / "imported"
    for name in ("torch", "lightning"):
        _plant(cwd, name, marker)
    ray_tmp = tempfile.mkdtemp(prefix="flc", dir="/tmp")
    # one client worker a run: each worker starts the same way, and one planted import in any fails
    args = [
        a
        for a in small(tmp_path, *TINY, "fl.rounds=1", "runtime.num_actors=1")
        if not a.startswith("output_dir=")
    ]
    argv = {
        "run": ["run", *args, "output_dir=runs", "run_id=r", "--quiet"],
        "sweep": [  # one run: still a child process of its own (`--parallel 2`), whose Ray is its own
            "sweep",
            "seed=0",
            *args,
            "output_dir=runs",
            "experiment=sw",
            "--parallel",
            "2",
            "--no-plots",
        ],
    }[command]
    try:
        res = subprocess.run(
            [EXE, *argv], cwd=cwd, env=_env(ray_tmp), capture_output=True, text=True, timeout=600
        )
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        summaries = list((cwd / "runs").glob("*/*/summary.json"))
        assert len(summaries) == 1
        for path in summaries:
            summary = json.loads(path.read_text())
            assert summary["status"] == "completed" and summary["num_actors"] >= 1  # on Ray workers
        assert not marker.exists(), f"a planted module ran in processes {marker.read_text().split()}"
    finally:
        _clean_up(ray_tmp)


# --- 2. the watchdog ends its Ray's processes, and only those ---------------------------------
def _watchdogs_of(driver: int) -> list[int]:
    """The watchdog processes started by the driver `driver` (`watchdog.py <mark> <driver> ...`)."""
    found = []
    for name in os.listdir("/proc"):
        argv = _cmdline(int(name)).split() if name.isdigit() else []
        if any(a.endswith("runtime/watchdog.py") for a in argv) and str(driver) in argv[3:5]:
            found.append(int(name))
    return found


@pytest.mark.slow
def test_the_watchdog_spares_the_terminal_below_a_session_named_folder(tmp_path, data_root):
    """The watchdog took the first `session_*` folder of any path of the run's processes for
    Ray's session directory: run from a folder named `session_x` (or with its Ray temp folder
    below one), it SIGKILLed every process of the terminal below that folder when the run
    ended, normally too: the user's shell, a `tail -f` of their notes, another run. Here a
    terminal (one session) holds a shell-like process (it ignores SIGTERM, as an interactive
    bash does) in `session_x`, a `tail -f` below the folder that holds the Ray temp folder, and
    a second, serial run in `session_x`; a Ray run ends normally there. After its watchdog
    exits all three are alive, and no process of that Ray is left."""
    base = Path(tempfile.mkdtemp(prefix="session_", dir="/tmp"))  # short: Ray's sockets live below
    ray_tmp, notes, cwd = str(base / "r"), base / "work" / "notes.txt", tmp_path / "session_x"
    notes.parent.mkdir()
    notes.write_text("the user's own notes\n")
    cwd.mkdir()
    b_args = small(tmp_path / "b", *TINY, "runtime=serial", "fl.rounds=100000", "run_id=b")
    a_args = small(
        tmp_path / "a", *TINY, "fl.rounds=1", "runtime.address=local", "runtime.num_actors=1", "run_id=a"
    )
    env = {k: v for k, v in os.environ.items() if k != "FL_LIGHTNING_RAY_TMPDIR"}
    script = f"""
        (trap '' TERM; exec sleep 900) >/dev/null 2>&1 & echo $! > shell.pid
        (cd {shlex.quote(str(notes.parent))} && exec tail -f notes.txt) >/dev/null 2>&1 & echo $! > tail.pid
        {shlex.quote(EXE)} run {shlex.join(b_args)} --quiet >b.log 2>&1 & echo $! > b.pid
        export FL_LIGHTNING_RAY_TMPDIR={shlex.quote(ray_tmp)}
        exec {shlex.quote(EXE)} run {shlex.join(a_args)} --quiet
    """
    term = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    pids: dict[str, int] = {}
    try:
        b_metrics, deadline = tmp_path / "b" / "default" / "b" / "metrics.jsonl", time.monotonic() + 600
        while term.poll() is None and not b_metrics.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        if b_metrics.exists():  # run b trains, its signal handling in place: it need only stay alive
            _pause(int((cwd / "b.pid").read_text()))
        out, err = term.communicate(timeout=max(1.0, deadline - time.monotonic()))
        pids = {name: int((cwd / f"{name}.pid").read_text()) for name in ("shell", "tail", "b")}
        assert term.returncode == 0, err[-3000:]
        deadline = time.monotonic() + 60
        while _watchdogs_of(term.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _watchdogs_of(term.pid), "the run's watchdog did not finish"
        dead = [name for name, pid in pids.items() if not _alive(pid)]
        assert not dead, f"the watchdog killed the terminal's {dead} ({(cwd / 'b.log').read_text()[-500:]})"
        left = _left_after(ray_tmp, 10)
        assert not left, f"processes of the run's Ray outlived it: {left}"
        _resume(pids["b"])  # the second run, paused since its first round, goes on and stops as asked
        os.kill(pids["b"], signal.SIGTERM)
        deadline = time.monotonic() + 120
        while _alive(pids["b"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "terminated (SIGTERM)" in (cwd / "b.log").read_text()
    finally:
        # also when run a failed (its Ray did not start under load): run b trains 100,000
        # rounds and, left behind, took a core from the rest of the suite
        for name in ("shell", "tail", "b"):
            with contextlib.suppress(OSError, ValueError):
                pids.setdefault(name, int((cwd / f"{name}.pid").read_text()))
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if term.poll() is None:
            term.kill()
        for pid in _of_run(ray_tmp):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


# --- 7. a private Ray takes none of Ray's default ports ---------------------------------------
DASHBOARD, AGENT = 8265, 52365  # Ray's defaults: what a user's `ray start --head` takes


def _ports(pids: set[int]) -> set[int]:
    """The TCP ports `pids` listen on (Linux /proc; IPv4 and IPv6)."""
    inodes: dict[str, int] = {}
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A":  # LISTEN
                    inodes[f[9]] = int(f[1].rsplit(":", 1)[1], 16)
    found = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        found.add(inodes[target[8:-1]])
    return found


def _free(port: int) -> bool:
    """Whether a server can listen on `port`: with SO_REUSEADDR, as Ray's dashboard and agent
    bind, so a closed connection's TIME_WAIT there (an ephemeral port of any of the machine's
    connections may be 52365) does not count as taken."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class DefaultPortsHead(Head):
    """A user's own `ray start --head` on this machine: the dashboard and its agent on Ray's
    default ports (the rest free ones, so it fits beside the test suite's other Rays)."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="flh", dir="/tmp"))
        self.env = {**os.environ, **loopback_cli_env(self.tmp / "r")}
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"
        self.env.pop("RAY_ADDRESS", None)
        gcs, client, agent_grpc, env_agent, metrics, nm, om = _free_ports(7)
        self.dash = DASHBOARD
        self.log = open(self.tmp / "head.log", "w")  # noqa: SIM115  (closed by `stop`)
        cmd = [
            str(BIN / "ray"), "start", "--head", "--block", "--num-cpus=1", "--num-gpus=0",
            "--dashboard-host=127.0.0.1", "--disable-usage-stats", f"--port={gcs}",
            f"--ray-client-server-port={client}", f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={env_agent}", f"--metrics-export-port={metrics}",
            f"--node-manager-port={nm}", f"--object-manager-port={om}",
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        self.url = f"http://127.0.0.1:{DASHBOARD}"


#: what a head just started answers for a while, more so on a loaded machine
TRANSIENT = ("No available agent", "Connection aborted", "Connection refused")


@pytest.mark.slow
def test_a_users_ray_head_and_job_work_beside_a_private_run(tmp_path, data_root):
    """A private run's Ray bound the dashboard agent's default port 52365 (and, where its
    dashboard server listens, 8265): a `ray start --head` on the same machine then got an
    agent that could not bind, and `ray job submit` answered "No available agent to submit
    job" (or reached the private run's Ray). Now, while a private run is up, its Ray listens
    on none of Ray's default ports, and a user's head on them runs journey 5, a run submitted
    with `cluster/submit.sh` whose driver joins that head (`ray_head.check_submitted`). (Where
    another program held those ports before the run started, the head takes free ones: the
    journey is checked, not that it ran on the defaults; on a shared machine, run it in a
    network namespace of its own as root:
    `unshare -n bash -c 'ip link set lo up && pytest tests/test_local_ray.py -k users_ray_head'`.)"""
    ray_tmp = tempfile.mkdtemp(prefix="flp", dir="/tmp")
    args = small(
        tmp_path, *TINY, "fl.rounds=100000", "runtime.address=local", "runtime.num_actors=1", "run_id=p"
    )
    free_before = _free(DASHBOARD) and _free(AGENT)
    run = subprocess.Popen([EXE, "run", *args, "--quiet"], env=_env(ray_tmp),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    head = None
    try:
        # training: a round is written (its Ray's agents have bound their ports long before; at
        # the moment they appear they may not have yet)
        metrics, deadline = tmp_path / "default" / "p" / "metrics.jsonl", time.monotonic() + 600
        while not metrics.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert metrics.exists() and run.poll() is None, run.stderr.read().decode() if run.stderr else ""
        _pause(run.pid)  # it need only stay up, its Ray's ports bound
        taken = _ports(set(_of_run(ray_tmp)))
        assert taken, "found no listening socket of the run's Ray"
        assert not taken & {AGENT, *range(DASHBOARD, DASHBOARD + 51)}, sorted(taken)  # 50: Ray's retries
        head = DefaultPortsHead() if free_before else Head()
        head.wait_ready(timeout=240)
        # the head's agent registers some seconds after its job API answers (more on a loaded
        # machine): "No available agent" is tried again for 3 minutes, as is a head whose
        # dashboard dropped the connection under load (seen in the suite beside two busy
        # workers), while no job has started (no run folder); an agent that cannot bind its
        # port (the failure here) never comes
        out, deadline = tmp_path / "job", time.monotonic() + 180
        while True:
            job = submit_run(head, out, data_root)
            said = job.stdout + job.stderr
            transient = any(t in said for t in TRANSIENT) and not out.exists()
            if job.returncode == 0 or not transient or time.monotonic() > deadline:
                break
            time.sleep(3)
        if job.returncode != 0 and _free(head.dash) and run.poll() is None:
            # nothing listens on the head's port any more: the user's head itself went down
            # (its dashboard loses the GCS under a loaded suite: seen at load 30+ on 2 cores),
            # while the private run took none of its ports (checked above): no verdict here
            pytest.skip(f"the user's head stopped answering on {head.dash} under load: {said[-300:]}")
        check_submitted(head, job, out)
        assert run.poll() is None, "the private run stopped meanwhile"
        if not free_before:
            pytest.skip(f"ports {DASHBOARD}/{AGENT} were taken by another program before the run started: "
                        "the head ran on free ones")  # fmt: skip
    finally:
        if head is not None:
            head.stop()
        if run.poll() is None:
            _resume(run.pid)
            run.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.wait(timeout=120)
        if run.poll() is None:
            run.kill()
        _clean_up(ray_tmp)


def test_the_ray_temp_folder_is_this_users_alone(tmp_path, monkeypatch, capsys):
    """Every local Ray used `/tmp/fl_lightning_ray` (made with the umask's 0755), shared by every
    user of a workstation: the first user's folder held the next one's raylet and object-store
    sockets, and a user who made it first (or planted a link there) could reach another's Ray,
    which runs code as its owner. Now `/tmp/fl_lightning_ray-<uid>`, made 0700; a link, a
    folder of another user's, or one others can write, is one line before anything is written."""
    from fl_lightning.cli.main import main
    from fl_lightning.core.errors import StartupError
    from fl_lightning.runtime.local_ray import private_ray_tmpdir, ray_tmpdir

    monkeypatch.delenv("FL_LIGHTNING_RAY_TMPDIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    default = tmp_path / f"fl_lightning_ray-{os.getuid()}"
    assert ray_tmpdir() == default and not default.exists()
    assert private_ray_tmpdir() == default and (default.stat().st_mode & 0o777) == 0o700
    default.chmod(0o755)  # ours, made by an older version: closed again, not refused
    assert private_ray_tmpdir() == default and (default.stat().st_mode & 0o777) == 0o700
    if os.getuid() == 0:  # only root can hand a folder to another user
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        monkeypatch.setenv("FL_LIGHTNING_RAY_TMPDIR", str(theirs))
        with pytest.raises(StartupError, match="belongs to user id 65534"):
            private_ray_tmpdir()
    open_one = tmp_path / "open"
    open_one.mkdir()
    open_one.chmod(0o777)
    monkeypatch.setenv("FL_LIGHTNING_RAY_TMPDIR", str(open_one))
    with pytest.raises(StartupError, match="can be written by other users"):
        private_ray_tmpdir()
    assert (open_one.stat().st_mode & 0o777) == 0o777  # a folder the user chose is not changed
    link = tmp_path / "link"
    link.symlink_to(default)
    monkeypatch.setenv("FL_LIGHTNING_RAY_TMPDIR", str(link))
    with pytest.raises(StartupError, match="is a link"):
        private_ray_tmpdir()
    # through the command line: one line, exit 1, no run directory (checked before the data)
    code = main(
        ["run", *small(tmp_path / "runs", *TINY, "fl.rounds=1", "runtime=ray", "run_id=l"), "--quiet"]
    )
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 1 and len(err) == 1 and err[0].startswith("fl-lightning: error: the Ray temp folder"), err
    assert not (tmp_path / "runs" / "default").exists()
