"""`fl-lightning sweep method=fedavg,fedprox seed=0,1,2 <overrides>`: a grid of runs.

Every override whose value holds a comma (outside brackets and quotes) is an axis; the
grid is their product, in command-line order (the last axis varies fastest). All runs
share one experiment name, so they land in one runs folder
(`<output_dir>/<experiment>/`) and one W&B group; without `experiment=...` the sweep
names one `sweep_<timestamp>`. Every configuration is composed and validated before
the first run starts.

Runs go one after another in this process by default, on one Ray: it starts once, and a
finished run's client workers (processes that have imported Lightning) are set up again
for the next run when it asks for the same CPUs and GPUs per worker (on GPUs: the same
placement-group layout, kept reserved between the runs). `--parallel N` runs N at a time,
each in its own `fl-lightning run` subprocess (its output in
`<experiment dir>/sweep_logs/`); on a private local Ray each then gets `cpu_count / N` CPUs
(`runtime.num_cpus`) unless set, while runs that join a cluster (`runtime.address`, or
`$RAY_ADDRESS` inside a Ray job) share the cluster's resources.
At the end the sweep prints the comparison table of its runs and writes the plots
(`tracking/compare.py`), grouped by the swept keys other than `seed`.

Each run takes its run directory's lock like `fl-lightning run` (`runtime/lock.py`); a run
that fails (diverged, clients failed, its directory taken by another process, ...) is
listed as FAILED with its one-line reason and the sweep goes on with the next.

A sweep can be continued. Its folder records its grid (`sweep.json`: the command's overrides
and each run's), and the sweep holds the folder's lock while it runs (a second sweep there
gets one line naming it). Running the same sweep again (the same overrides; without
`experiment=`, the newest unfinished `sweep_*` folder with that grid), or
`fl-lightning sweep --resume <folder>`, skips the runs that finished (completed, or stopped for
good by divergence), resumes the ones a kill interrupted from their last checkpoint, and
starts again those killed before they wrote one (`continue_run`, shared with `reproduce`).
Children of a killed `--parallel` sweep die with it (`_die_with_parent`), so nothing of the
old sweep trains beside the resumed one.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import CheckpointError, ClientFailure, ConfigError, DivergedError, StartupError
from ..core.files import open_append, open_new, own_folder
from ..core.safe_json import load_file
from ..runtime.lock import RunDirBusy, RunLock, check_output_dir
from ..runtime.paths import resolve_output_dir
from ..runtime.session import Session
from .progress import RoundMonitor, monitored
from .spawn import fl_lightning_command

if TYPE_CHECKING:
    from ..config import RootConfig


def split_top_level(value: str) -> list[str]:
    """Split on commas outside [], {}, () and quotes: `a,b` -> [a, b]; `[a,b]` stays."""
    parts: list[str] = []
    cur: list[str] = []
    depth, quote = 0, ""
    for ch in value:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def expand(overrides: Sequence[str]) -> tuple[list[list[str]], list[str]]:
    """The grid (one override list per run) and the swept keys, in order."""
    axes: list[list[str]] = []
    swept: list[str] = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"bad override {item!r}: expected key=value")
        key, value = item.split("=", 1)
        values = split_top_level(value)
        if any(v == "" for v in values):
            raise ConfigError(f"bad sweep values in {item!r}: empty value between commas")
        if len(values) > 1:
            if len(set(values)) != len(values):
                raise ConfigError(f"repeated value in {item!r}")
            swept.append(key)
        axes.append([f"{key}={v}" for v in values])
    return [list(p) for p in itertools.product(*axes)], swept


@dataclass
class SweepRun:
    index: int
    overrides: list[str]
    cfg: RootConfig
    run_dir: Path
    status: str = "pending"  # pending | ok | failed
    message: str = ""
    resume: bool = False  # continue its run directory from the last checkpoint (reproduce)

    def label(self, swept: Sequence[str]) -> str:
        keys = {k.lstrip("+") for k in swept}
        shown = [o for o in self.overrides if o.split("=", 1)[0].lstrip("+") in keys]
        return " ".join(shown) or f"run {self.index}"


SWEEP_FILE = "sweep.json"
SWEEP_FORMAT = "fl_lightning.sweep/1"


def read_record(folder: Path) -> dict[str, Any] | None:
    """A sweep folder's record (`sweep.json`), None if it has none; ConfigError if it is not one
    (the folder is untrusted: bounded JSON, a plain file, the expected shape)."""
    path = folder / SWEEP_FILE
    if not path.exists() and not path.is_symlink():
        return None
    try:
        doc = load_file(path, 16 << 20)
        args = [r.get("args") for r in doc["runs"]]
        ok = (
            doc.get("format") == SWEEP_FORMAT
            and all(isinstance(a, list) and all(isinstance(x, str) for x in a) for a in args)
            and all(isinstance(o, str) for o in doc["overrides"])
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{path} is not a sweep record ({e})") from None
    if not ok:
        raise ConfigError(f"{path} is not a sweep record (format {SWEEP_FORMAT})")
    return doc


def _write_record(folder: Path, overrides: Sequence[str], runs: Sequence[SweepRun]) -> None:
    doc = {
        "format": SWEEP_FORMAT,
        "overrides": list(overrides),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "runs": [{"run_id": r.run_dir.name, "args": r.overrides} for r in runs],
    }
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{SWEEP_FILE}.tmp"
    with open_new(tmp) as f:
        f.write((json.dumps(doc, indent=1) + "\n").encode())
    tmp.replace(folder / SWEEP_FILE)


def variant(method: str, point: Sequence[str], swept: Sequence[str]) -> str:
    """A grid point's variant (`RootConfig.variant`, its W&B job type and run name): the method
    and the swept keys' values but the seed (`fedprox tau=0.1`), a method key without its
    `method.`; a label, so what the config would read as a comma or interpolation is left out."""
    keys = {k.lstrip("+") for k in swept} - {"seed", "method"}
    shown = [o.lstrip("+").removeprefix("method.") for o in point if o.split("=", 1)[0].lstrip("+") in keys]
    text = " ".join([method, *shown]).replace(",", ";").replace("$", "").replace("\n", " ")
    return text[:128]


def _recorded_points(doc: dict[str, Any], grid: list[list[str]], path: Path) -> list[list[str]]:
    """The args of a record's runs, each checked to be its grid point and only the names the
    sweep made (`experiment=`, `run_id=`, `variant=`): the record is untrusted, so a run cannot add
    `methods=` (a module to import), `output_dir=` (a folder elsewhere) or anything else."""
    if len(doc["runs"]) != len(grid):
        raise ConfigError(f"{path} does not record this grid")
    points = []
    for r, point in zip(doc["runs"], grid, strict=True):
        args, tail = list(r["args"]), r["args"][len(point) :]
        keys = [t.split("=", 1)[0] for t in tail]
        named = {"experiment", "run_id", "variant"}
        if args[: len(point)] != point or len(keys) != len(set(keys)) or set(keys) - named:
            raise ConfigError(f"{path} records a run that is not a point of its grid ({' '.join(args)})")
        points.append(args)
    return points


def _unfinished_sweep(output_dir: Path, overrides: Sequence[str]) -> Path | None:
    """The newest `sweep_*` folder under `output_dir` recording this grid with a run unfinished."""
    from ..config import compose

    grid = expand(overrides)[0]
    for folder in sorted(output_dir.glob("sweep_*"), reverse=True):
        try:
            doc = read_record(folder)
            if doc is None or doc["overrides"] != list(overrides):
                continue
            runs = [(a, compose(a)) for a in _recorded_points(doc, grid, folder / SWEEP_FILE)]
        except ConfigError:
            continue  # not a record of ours: plan_sweep names a new folder
        for args, cfg in runs:
            if continue_run(SweepRun(0, args, cfg, folder / str(cfg.run_id)), check_lock=False) != "finished":
                return folder
    return None


def plan_sweep(
    overrides: Sequence[str], resume: Path | None = None, consent: Sequence[str] = ()
) -> tuple[list[SweepRun], list[str], str, Path]:
    """Compose and validate every grid point; returns the runs, swept keys, experiment and the
    sweep's folder. A folder that records this grid (`resume`'s, the named experiment's, or
    the newest unfinished `sweep_*` one) gives its runs back, as they were named. `consent`:
    the `methods=` of `sweep --resume`'s command line, which the record's must equal."""
    from ..config import compose, method_modules, require_consent

    if resume is not None:
        doc = read_record(resume)
        if doc is None:
            raise ConfigError(f"{resume} holds no sweep ({SWEEP_FILE}): nothing to resume")
        overrides = doc["overrides"]
        saved = [m for o in overrides if o.split("=", 1)[0].lstrip("+") == "methods"
                 for v in split_top_level(o.split("=", 1)[1]) for m in method_modules(v)]  # fmt: skip
        how = f"continue it (`fl-lightning sweep --resume {resume}`)"
        require_consent(saved, consent, resume / SWEEP_FILE, how, same=True)
        # the cluster to join comes from the command line or $RAY_ADDRESS, never from a record
        # (`sweep --resume` takes none: the runs go to the default, `$RAY_ADDRESS` or a local Ray)
        if any(o.split("=", 1)[0].lstrip("+") == "runtime.address" for o in overrides):
            raise ConfigError(
                f"{resume / SWEEP_FILE} names runtime.address (a Ray cluster to join): a record never "
                "chooses the cluster; run the grid again with runtime.address= on the command line, or "
                "set RAY_ADDRESS"
            )
    grid, swept = expand(overrides)
    keys = [o.split("=", 1)[0].lstrip("+") for o in overrides]
    if "run_id" in keys and len(grid) > 1:
        raise ConfigError("run_id cannot be set in a sweep of several runs (each run names its own)")
    if "experiment" in swept or "output_dir" in swept:
        raise ConfigError("a sweep's runs share one folder: experiment and output_dir cannot be swept")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    extra: list[str] = []
    if resume is None:
        first = compose(grid[0])
        if first.experiment == "default" and "experiment" not in keys:
            resume = _unfinished_sweep(resolve_output_dir(first.output_dir), overrides)
            if resume is None:
                extra.append(f"experiment=sweep_{stamp}")
        else:
            named = resolve_output_dir(first.output_dir) / first.experiment
            doc = read_record(named)
            if doc is not None and doc["overrides"] != list(overrides):
                raise ConfigError(
                    f"{named} holds another sweep ({' '.join(doc['overrides'])}): continue it with "
                    f"`fl-lightning sweep --resume {named}`, or name another experiment="
                )
            resume = named if doc is not None else None
    if resume is not None:  # the recorded runs, as they were named
        doc = read_record(resume)
        assert doc is not None
        points = _recorded_points(doc, grid, resume / SWEEP_FILE)
    else:
        points = [[*p, *extra] for p in grid]
    runs: list[SweepRun] = []
    for i, args in enumerate(points):
        cfg = compose(args)
        if resume is None and "run_id" not in keys:
            rid = f"{cfg.method.name}_{cfg.data.name}_s{cfg.seed}_{stamp}_{i:03d}"
            args.append(f"run_id={rid}")
        if resume is None and "variant" not in keys:
            args.append(f"variant={variant(cfg.method.name, args, swept)}")
        if resume is None:
            cfg = compose(args)
        run_dir = resolve_output_dir(cfg.output_dir) / cfg.experiment / str(cfg.run_id)
        if resume is None and run_dir.exists():
            raise ConfigError(f"run directory {run_dir} exists")
        runs.append(SweepRun(i, args, cfg, run_dir))
    folder = runs[0].run_dir.parent
    if resume is not None:  # every recorded run, not only the first, lies in the sweep's folder
        home = os.path.realpath(resume)  # (realpath: a link loop is no RuntimeError)
        outside = [r.run_dir.parent for r in runs if os.path.realpath(r.run_dir.parent) != home]
        if outside:
            raise ConfigError(f"{resume / SWEEP_FILE} records runs of another folder ({outside[0]})")
    for run in runs:  # a file in the way, not writable: before the first run starts
        check_output_dir(run.run_dir.parent, str(run.cfg.output_dir))
    return runs, swept, runs[0].cfg.experiment, folder


def continue_run(run: SweepRun, check_lock: bool = True) -> str:
    """What grid point `run` needs, from its run directory: `finished` (completed its rounds,
    or stopped for good by divergence; a run that `failed`, e.g. on a full disk or a Ray that
    did not start, is tried again), `new` (no directory), `resume` (killed mid-run, or
    finished fewer rounds than it now asks: continue from its last checkpoint; sets
    `run.resume`) or `restart` (killed before its first checkpoint: its leftovers go). A run
    directory held by a live process is RunDirBusy (one line), unless `check_lock` is False."""
    from ..tracking.reproduce import is_finished, read_run

    rounds = int(run.cfg.fl.rounds)
    state = read_run(run.run_dir)
    if is_finished(state, rounds) and state.status != "failed":
        return "finished"
    if state.status == "missing":
        return "new"
    if check_lock:
        RunLock(run.run_dir).acquire().release()  # held by another process: one line, nothing touched
    last = max((int(r["round"]) for r in state.records if "round" in r), default=0)
    if (run.run_dir / "checkpoints").is_dir() and last < rounds:
        run.resume = True
        return "resume"
    return "restart"


def _finished_status(run_dir: Path) -> str:
    from ..tracking.reproduce import read_run

    return read_run(run_dir).status


def print_plan(todo: Sequence[SweepRun]) -> None:
    """`--dry-run`: the command each run left would be."""
    for r in todo:
        what = f"resume {r.run_dir}" if r.resume else "run " + " ".join(r.overrides)
        print(f"  fl-lightning {what}")


@contextlib.contextmanager
def sweep_lock(folder: Path) -> Iterator[None]:
    """Hold `folder`'s lock for a whole sweep (or reproduction): a second one there is one line."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = RunLock(folder)
    try:
        lock.acquire()
    except RunDirBusy as e:
        raise ConfigError(
            f"sweep folder {folder} is in use by another sweep ({e.holder}); wait for it to end"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _result_line(run: SweepRun, total: int, swept: Sequence[str]) -> str:
    head = f"[{run.index + 1}/{total}] {run.label(swept)}"
    if run.status != "ok":
        return f"{head}: FAILED: {run.message}"
    import json

    s = json.loads((run.run_dir / "summary.json").read_text())
    metric = s.get("primary_metric") or s.get("accuracy_metric", "accuracy")
    acc = s.get(f"final_{metric}")
    best = s.get(f"best_{metric}")
    fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    if s.get("status", "completed") != "completed":
        return f"{head}: FAILED: {s.get('status')} after {s.get('rounds_completed')} rounds  {run.run_dir}"
    warning = f"  WARNING: {s['warning']}" if s.get("warning") else ""  # e.g. no better than chance
    return (
        f"{head}: final {metric} {fmt(acc)}, best {fmt(best)}, "
        f"{s.get('rounds_completed')} rounds, {s.get('wall_time_s', 0.0):.1f}s  {run.run_dir}{warning}"
    )


def _run_inline(run: SweepRun, session: Session) -> None:
    from ..runtime.early import import_driver

    import_driver()  # the first run's: the collector paused (a no-op after it)
    from ..runtime.runner import resume_run, start_run

    try:
        if run.resume:
            from ..config import load_run_config

            rounds = f"fl.rounds={run.cfg.fl.rounds}"  # may be more than it ran (a longer schedule)
            resume_run(run.run_dir, load_run_config(run.run_dir, [rounds]), console=False, session=session)
        else:
            start_run(run.cfg, console=False, session=session)
        run.status = "ok"
    except (ClientFailure, CheckpointError, ConfigError, StartupError, RuntimeError, OSError) as e:
        # (its run dir taken, a full disk, ...)
        why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        run.status, run.message = "failed", f"diverged: {why}" if isinstance(e, DivergedError) else why


def _session(runs: Sequence[SweepRun]) -> Session:
    """One Ray, and warm client workers, for all runs one after another, when every Ray run
    asks for the same Ray (address, CPUs, GPUs); else each run starts its own as `run` does."""
    wants = {
        (rt.address, rt.num_cpus, rt.num_gpus) for rt in (r.cfg.runtime for r in runs) if rt.executor == "ray"
    }
    shared = len(wants) == 1
    return Session(keep_ray=shared, reuse_actors=shared)


def own_wandb_service() -> dict[str, str]:
    """This process's environment without `$WANDB_SERVICE`: each run gets a W&B service of its
    own. A shared one keeps a killed run's stream open, and the run resumed under the same id
    is then refused ("run ID ... is in use")."""
    return {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}


def _local_cpus(run: SweepRun, parallel: int) -> list[str]:
    """On a private local Ray (or serial), N concurrent runs share the machine's CPUs."""
    from ..runtime.local_ray import cluster_address

    keys = {o.split("=", 1)[0] for o in run.overrides}
    rt = run.cfg.runtime
    if parallel <= 1 or "runtime.num_cpus" in keys or rt.num_cpus is not None:
        return []
    if rt.executor == "ray" and cluster_address(rt.address):
        return []  # joins a cluster: its resources are shared by Ray's scheduler
    return [f"runtime.num_cpus={max(1, (os.cpu_count() or 1) // parallel)}"]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the sweep's process dies, even by `kill -9`
    (Linux; elsewhere a no-op), so a killed sweep leaves no orphan run training beside the
    next one. SIGTERM stops a run like Ctrl-C: resumable."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _run_parallel(
    runs: list[SweepRun],
    parallel: int,
    log_dir: Path,
    total: int,
    swept: Sequence[str],
    monitor: RoundMonitor | None = None,
) -> None:
    own_folder(log_dir)  # a planted link: one line (the logs were written through it)
    queue = list(runs)
    active: dict[subprocess.Popen, tuple[SweepRun, Path, Any]] = {}
    try:
        while queue or active:
            while queue and len(active) < parallel:
                run = queue.pop(0)
                log = log_dir / f"{run.index:03d}_{run.run_dir.name}.log"
                fh = open_append(log)  # a resumed sweep adds to it; never through a planted link
                what = ["run", *run.overrides]
                if run.resume:
                    what = ["resume", str(run.run_dir), f"fl.rounds={run.cfg.fl.rounds}"]
                cmd = [*fl_lightning_command(), *what, *_local_cpus(run, parallel)]
                cmd.append("--quiet")
                fh.write(("$ " + " ".join(cmd) + "\n").encode())
                fh.flush()
                proc = subprocess.Popen(
                    cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    preexec_fn=_die_with_parent, env=own_wandb_service(),
                )  # fmt: skip
                active[proc] = (run, log, fh)
                if monitor is not None:
                    monitor.watch(
                        run.run_dir, f"[{run.index + 1}/{total}] {run.label(swept)}", int(run.cfg.fl.rounds)
                    )
            for proc in [p for p in active if p.poll() is not None]:
                run, log, fh = active.pop(proc)
                fh.close()
                if monitor is not None:
                    monitor.forget(run.run_dir)
                if proc.returncode == 0 and (run.run_dir / "summary.json").is_file():
                    run.status = "ok"
                else:
                    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
                    errs = [ln for ln in lines if ln.startswith("fl-lightning: error:")]
                    last = (errs or lines or ["no output"])[-1]
                    run.status, run.message = "failed", f"exit {proc.returncode}: {last} (log: {log})"
                print(_result_line(run, total, swept), flush=True)
            time.sleep(0.2)
    finally:
        for proc, (_, _, fh) in active.items():  # interrupted: stop only the runs we started
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            fh.close()


def run_grid(
    runs: list[SweepRun], parallel: int, log_dir: Path, swept: Sequence[str], total: int | None = None
) -> None:
    """Run `runs` one after another on one Ray, or `parallel` at a time in subprocesses
    (their output in `log_dir`), with a line per round of every run and one per result.
    `total`: the grid's size, when `runs` is what is left of it."""
    total = total or len(runs)
    with RoundMonitor(sys.stdout) as monitor:  # a line per round of every run: never silent
        if parallel == 1:
            with _session(runs) as session:
                for r in runs:
                    label = f"[{r.index + 1}/{total}] {r.label(swept)}"
                    monitored(
                        monitor, r.run_dir, label, int(r.cfg.fl.rounds), partial(_run_inline, r, session)
                    )
                    print(_result_line(r, total, swept), flush=True)
        else:
            _run_parallel(runs, parallel, log_dir, total, swept, monitor)


def sweep_command(
    overrides: Sequence[str],
    parallel: int = 1,
    dry_run: bool = False,
    plots: bool = True,
    resume: Path | None = None,
) -> int:
    if parallel < 1:
        raise ConfigError(f"--parallel must be >= 1 (got {parallel})")
    if resume is not None and any(o.split("=", 1)[0] != "methods" for o in overrides):
        raise ConfigError(
            "sweep --resume takes no overrides but methods= (consent to import what its sweep.json "
            "names): the grid is the one its folder records"
        )
    runs, swept, experiment, out = plan_sweep([] if resume else overrides, resume, overrides)
    mode = "one after another" if parallel == 1 else f"{parallel} at a time, one process each"
    with contextlib.ExitStack() as stack:
        if not dry_run:
            stack.enter_context(sweep_lock(out))  # one sweep at a time in a folder
        need = {r.index: continue_run(r) for r in runs}
        todo = [r for r in runs if need[r.index] != "finished"]
        counts = {k: sum(v == k for v in need.values()) for k in ("finished", "resume", "restart")}
        again = (
            f"; {counts['finished']} finished, {counts['resume']} to resume, {counts['restart']} to restart"
        )
        print(
            f"sweep: {len(runs)} runs ({mode}) of experiment {experiment} in {out}"
            + (again if len(todo) < len(runs) or counts["resume"] or counts["restart"] else ""),
            flush=True,
        )
        if dry_run:
            print_plan(todo)
            return 0
        if read_record(out) is None:
            _write_record(out, overrides, runs)
        for r in todo:
            if need[r.index] == "restart":  # killed before its first checkpoint: start it again
                shutil.rmtree(r.run_dir)
        for r in runs:
            if need[r.index] == "finished":  # before: completed, or stopped for good
                status = _finished_status(r.run_dir)
                r.status, r.message = ("ok", "") if status == "completed" else ("failed", status)
                print(_result_line(r, len(runs), swept), flush=True)
        run_grid(todo, parallel, out / "sweep_logs", swept, total=len(runs))
    done = [r for r in runs if r.status == "ok"]
    failed = [r for r in runs if r.status != "ok"]
    if done:
        from ..tracking.compare import RunResult, compare, find_runs

        by = [k.lstrip("+") for k in swept if k.lstrip("+") != "seed"] or ["method"]
        results: list[RunResult] = find_runs([r.run_dir for r in done])
        table, written = compare(by=by, out_dir=out / "compare", plots=plots, runs=results)
        print(table)
        for p in written:
            print(f"wrote {p}")
    if failed:
        print(f"fl-lightning: error: {len(failed)} of {len(runs)} sweep runs failed", file=sys.stderr)
        return 1
    return 0
