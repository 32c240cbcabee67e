"""The watchdog of a local Ray (stdlib only: `local_ray.Watchdog` runs this file with
`python -I -S`): it blocks on a pipe from the driver and, when the pipe closes (the driver's
`ray.shutdown()` or its death, `kill -9` included), ends the processes of that Ray: SIGTERM,
then SIGKILL, and only to them.

A process of that Ray is found by what it cannot lose:

- the driver's session id (every Ray process inherits it; none calls `setsid`), together
  with an open file or working directory inside the Ray's session directory (each writes its
  log files there): Ray's agents rename themselves (`ray::DashboardAgent`), which overwrites
  their `/proc/<pid>/environ`, so an environment mark alone misses them;
- the environment mark `FL_LIGHTNING_RAY_OWNER=<mark>` (GCS, raylet, workers keep it), from
  whose open files a session directory the driver could not report (killed inside
  `ray.init`) is learnt.

The driver writes its session directory into the pipe (one line) once `ray.init` returns;
until one is known the watchdog looks for it every 0.25 s in the marked processes' open files.
A directory learnt that way counts only in Ray's exact form, `<ray temp root>/session_<date>_<pid>`
with the temp root the driver gave (`<RAY_TMPDIR>/ray`): the first `session_*` folder of any
path counted before, so a user's working directory named `session_2026` (where Ray's processes
ran) made every process of the terminal below it "of that Ray": the shell, an editor, another
run were killed.
"""

from __future__ import annotations

import os
import re
import select
import signal
import sys
import time

OWNER_ENV = "FL_LIGHTNING_RAY_OWNER"
# Ray's session folder name: session_<%Y-%m-%d_%H-%M-%S_%f>_<pid of the process that started it>
SESSION_NAME = r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d{6}_\d+"


def _stat(pid: str) -> tuple[str, int] | None:
    """(state, session id) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[3])


def _paths(pid: str) -> list[str]:
    """Its working directory and the files it holds open."""
    found = []
    for entry in ["cwd", *(f"fd/{fd}" for fd in _listdir(f"/proc/{pid}/fd"))]:
        try:
            found.append(os.readlink(f"/proc/{pid}/{entry}"))
        except OSError:
            pass
    return found


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _marked(pid: str, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:
        return False


def session_pattern(root: str) -> re.Pattern[str]:
    """A path at or below a Ray session directory directly inside `root` (Ray's temp root,
    `<RAY_TMPDIR>/ray`, as /proc shows it: no link, no trailing slash)."""
    return re.compile(rf"^({re.escape(root.rstrip('/'))}/{SESSION_NAME})(/|$)")


def sessions_in(paths: list[str], root: str) -> set[str]:
    """The Ray session directories (`<root>/session_<date>_<pid>`) these paths lie in."""
    pattern = session_pattern(root)
    return {m.group(1) for m in map(pattern.match, paths) if m}


def ray_processes(
    sid: int, sessions: set[str], root: str, mark: str | None = None, skip: tuple[int, ...] = ()
) -> list[int]:
    """Live processes (not zombies, not `skip`) of the Ray started from session id `sid`
    whose session directories are `sessions`; those of marked processes (in Ray's temp root
    `root`) are added to it."""
    want = f"{OWNER_ENV}={mark}".encode() if mark else None
    found, unmarked = [], []
    for pid in _listdir("/proc"):
        if not pid.isdigit() or int(pid) in skip:
            continue
        st = _stat(pid)
        if st is None or st[0] in "ZX":
            continue
        if want is not None and _marked(pid, want):
            sessions |= sessions_in(_paths(pid), root)
            found.append(int(pid))
        elif st[1] == sid:
            unmarked.append((int(pid), _paths(pid)))
    inside = tuple(s + "/" for s in sessions)  # the directory itself, or a path in it
    return found + [pid for pid, paths in unmarked if any((p + "/").startswith(inside) for p in paths)]


def _wait(sid: int, root: str, mark: str, skip: tuple[int, ...]) -> set[str]:
    """Block until the driver closes the pipe; return the session directories known by then:
    those it wrote, and those of marked processes, looked for every 0.25 s until one is
    known (a driver killed inside `ray.init` never writes its own)."""
    told, sessions = b"", set[str]()
    while True:
        ready, _, _ = select.select([0], [], [], None if sessions else 0.25)
        if ready:
            chunk = os.read(0, 4096)
            if not chunk:
                break
            told += chunk
            sessions |= {line for line in told.decode(errors="replace").splitlines() if line.startswith("/")}
        elif not sessions:
            ray_processes(sid, sessions, root, mark, skip)
    return sessions


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    mark, driver, sid, root = argv[1], int(argv[2]), int(argv[3]), argv[4]
    mine = (os.getpid(), driver)
    sessions = _wait(sid, root, mark, mine)
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
        pids = ray_processes(sid, sessions, root, mark, mine)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        end = time.monotonic() + grace
        while time.monotonic() < end and ray_processes(sid, sessions, root, mark, mine):
            time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv)
