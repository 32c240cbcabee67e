"""A user's own Ray head on this machine, for the tests (test_local_ray.py): `ray start --head`
on loopback (shared/RAY_LOCAL.md: every variable of `local_ray.loopback_cli_env`, its own
short RAY_TMPDIR, its own ports), and journey 5 against it: a run submitted with
`cluster/submit.sh` (`ray job submit --working-dir <repo>`, data excluded from the upload),
whose driver joins that head's cluster.

A head is stopped without `ray stop` (which stops every Ray process on the machine, including
the session's `ray_session` instance and other people's): `ray start --block` keeps the head's
processes below one parent, so `Head.stop` collects that parent's descendants from /proc, sends
the parent SIGTERM (Ray then shuts its node down), and SIGKILLs only those collected PIDs that
are still alive afterwards (checked against their start time, so a reused PID is never hit).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from fl_lightning.runtime.local_ray import loopback_cli_env

from .conftest import NARROW

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: start time in clock ticks


def _descendants(root: int) -> dict[int, str]:
    """{pid: start time} of every process below `root` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out: dict[int, str] = {}
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        st = _start_time(pid)
        if st is not None and pid not in out:
            out[pid] = st
            stack.extend(children.get(pid, []))
    return out


def _listening(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets `pids` listen on (Linux /proc; IPv4 and IPv6)."""
    listen: dict[str, str] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A":  # LISTEN
                ip_hex = f[1].split(":")[0]
                if len(ip_hex) == 8:
                    ip = ".".join(str(int(ip_hex[i : i + 2], 16)) for i in (6, 4, 2, 0))
                elif ip_hex[:24] == "0000000000000000FFFF0000":  # IPv4-mapped IPv6
                    t = ip_hex[-8:]
                    ip = ".".join(str(int(t[i : i + 2], 16)) for i in (6, 4, 2, 0))
                else:
                    ip = "::1" if ip_hex == "00000000000000000000000001000000" else ip_hex
                listen[f[9]] = ip
    out = []
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in listen:
                out.append(listen[target[8:-1]])
    return out


class Head:
    def __init__(self) -> None:
        # Short: Ray's unix sockets live below RAY_TMPDIR (107-byte limit).
        self.tmp = Path(tempfile.mkdtemp(prefix="flj", dir="/tmp"))
        self.env = {**os.environ, **loopback_cli_env(self.tmp / "r")}
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"  # the job's `python`
        self.env.pop("RAY_ADDRESS", None)
        (gcs, self.dash, client, agent_http, agent_grpc, env_agent, metrics, nm, om) = _free_ports(9)
        self.log = open(self.tmp / "head.log", "w")
        cmd = [
            str(BIN / "ray"), "start", "--head", "--block", "--num-cpus=2", "--num-gpus=0",
            "--dashboard-host=127.0.0.1", "--disable-usage-stats", f"--port={gcs}",
            f"--dashboard-port={self.dash}",
            f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent_http}",
            f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={env_agent}",
            f"--metrics-export-port={metrics}", f"--node-manager-port={nm}", f"--object-manager-port={om}",
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        self.url = f"http://127.0.0.1:{self.dash}"

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"ray start exited {self.proc.returncode}: {(self.tmp / 'head.log').read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/api/jobs/", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the head's job API did not come up in {timeout:g}s")

    def stop(self) -> list[int]:
        """Stop only this head's processes; returns the PIDs that needed a SIGKILL."""
        procs = _descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_start_time(p) == st for p, st in procs.items()):
            time.sleep(0.2)
        killed = []
        for pid, st in procs.items():
            if _start_time(pid) == st:  # still the same process: ours
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return killed


def submit_run(head: Head, out: Path, data_root: str) -> subprocess.CompletedProcess[str]:
    """Journey 5: a small run submitted to `head` with `cluster/submit.sh`, writing below `out`."""
    cmd = [
        str(REPO / "cluster" / "submit.sh"), "--address", head.url, "run",
        "data=fmnist", "data.train_subset=200", "data.test_subset=100", "fl.num_clients=2", "fl.rounds=1",
        "fl.local_steps=2", *NARROW, "logger=none", f"output_dir={out}",
        f"data.root={Path(data_root).expanduser().resolve()}", "experiment=job", "run_id=submitted",
        # both clients on one worker: what is tested is where the job's driver runs, not
        # placement, and each worker costs ~7 CPU-seconds to start
        "runtime.placement=pool", "runtime.num_actors=1",
    ]  # fmt: skip
    return subprocess.run(cmd, env=head.env, capture_output=True, text=True, timeout=300)


def check_submitted(head: Head, res: subprocess.CompletedProcess[str], out: Path) -> None:
    """The submitted run joined the head's cluster (not a private local Ray), the head listened
    on loopback only, the run wrote its summary, and the upload held the code and config but
    none of the data, runs or environment."""
    logs = res.stdout + res.stderr
    assert res.returncode == 0, logs[-4000:]
    addresses = _listening(set(_descendants(head.proc.pid)) | {head.proc.pid})
    assert addresses and set(addresses) <= {"127.0.0.1", "::1"}, addresses  # shared/RAY_LOCAL.md
    assert "ray: joined the cluster at 127.0.0.1:" in logs  # not a private local Ray
    summary = json.loads((out / "job" / "submitted" / "summary.json").read_text())
    assert summary["rounds_completed"] == 1 and summary["num_actors"] == 1
    assert summary["final_accuracy"] is not None
    pkgs = [p for p in Path(head.tmp).rglob("working_dir_files/*") if p.is_dir()]
    assert pkgs, "no unpacked working dir found under the head's RAY_TMPDIR"
    wd = pkgs[0]
    assert (wd / "fl_lightning" / "data" / "datasets.py").is_file() and (
        wd / "conf" / "config.yaml"
    ).is_file()
    assert not any((wd / d).exists() for d in (".venv", ".git", "data", "runs"))
