"""`fl-lightning reproduce <paper> [--scale mini|paper] [--seeds 0,1,2] [--parallel N]`.

Runs a paper's claims grid (`conf/reproduce/<paper>.yaml`, see `tracking/reproduce.py`)
through the sweep machinery, then writes `report.md`, `results.json` and `curves.png` into
its folder (`--out`, default `runs/reproduce/<paper>_<scale>`). The runs live in
`<out>/<paper>_<scale>/<row>_s<seed>/`, one W&B group (`reproduce-<paper>-<scale>`), each
named `<row>-s<seed>` there, with `row=<row>` in its config and summary (`compare --by row`),
and tagged with the paper, scale, row and the claims it enters.

Run again, it skips the runs that finished (completed, or stopped for good by divergence),
resumes the ones a kill interrupted from their last checkpoint, and starts the rest: a killed
reproduction continues where it stopped. The runs go seed by seed (every row of the first
seed, then every row of the next), so a reproduction cut short holds whole seeds: each one
finished is a pair for every claim, where row by row it would hold whole rows and no pair.
Extra `key=value` overrides after the paper go to every run (`runtime=ray`, `logger=none`)
and are part of the grid: a run there made with other settings (its `config.yaml` against the
one planned now, apart from what a resume may change: `fl.rounds`, `runtime.*`, `logger.*`,
...) is refused in one line, or with `--restart` moved aside (to `<out>/set_aside/<time>/`,
never deleted) and run again.

What a claims file may make us do is bounded like any file someone else wrote: a row or a
scale that imports a module (`methods=`) runs only when the command line names the same
modules (the consent rule of `config.yaml` and `sweep.json`), and its `prepare` steps run
only `pretrain --out {out}/...` or `teacher build`, as `python -P` children (no working
directory on `sys.path`, `cli/spawn.py`).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import RESUMABLE, RootConfig, compose, conf_dir, method_modules, resumable_keys, tree
from ..core.errors import ConfigError
from ..core.files import open_new, own_folder, write_atomic
from ..runtime.paths import resolve_output_dir
from ..tracking.reproduce import (
    SCALES,
    Scale,
    Spec,
    build_report,
    is_finished,
    load_spec,
    plot_curves,
    read_run,
    run_name,
)
from .spawn import fl_lightning_command
from .sweep import SweepRun, continue_run, print_plan, run_grid, sweep_lock

#: keys a run's stored config may differ in from the planned one and still be continued: what
#: a resume may change (config.RESUMABLE, and its method's own: `config.resumable_keys`), and
#: where it lives (a folder moved, another data root)
SAME_RUN_IGNORES = (
    *RESUMABLE,
    "output_dir", "run_id", "experiment", "row", "variant", "data.root",
    "model.pretrained",  # C-Tran's: recorded as what loaded (config.resolved_config)
)  # fmt: skip


def specs() -> dict[str, Path]:
    return {p.stem: p for p in sorted((conf_dir() / "reproduce").glob("*.yaml"))}


def get_spec(paper: str) -> Spec:
    found = specs()
    if paper not in found:
        raise ConfigError(f"unknown paper {paper!r}; valid: {', '.join(found) or '(none)'}")
    return load_spec(found[paper])


def list_specs() -> None:
    for name, path in specs().items():
        s = load_spec(path)
        scales = ", ".join(
            f"{k} ({len(s.rows_for(k))} rows x {len(v.seeds)} seeds)" for k, v in s.scales.items()
        )
        print(f"{name:10s} {s.title}")
        print(f"{'':10s} claims: {', '.join(c.id for c in s.claims)}; scales: {scales}")
        for k in s.scales:
            lines = needs_lines(s, k, resolve_output_dir(f"runs/reproduce/{name}_{k}"), None)
            print(f"{'':10s} {k}: {lines[0]}")
            for line in lines[1:]:
                print(f"{'':10s} {line}")


def _tags(spec: Spec, scale: str, row: str) -> str:
    claims = [
        c.id for c in spec.claims_for(scale) if row in (spec.rows[c.row].source, spec.rows[c.baseline].source)
    ]
    return "logger.tags=[" + ",".join(["reproduce", spec.name, scale, f"row-{row}", *claims]) + "]"


def check_consent(spec: Spec, scale: str, extra: Sequence[str]) -> None:
    """A claims file that imports modules (`methods=` in a scale, a row or a prepare step) is
    run only when the command line names them: a file alone never makes us import a module."""
    given = [o.split("=", 1)[1] for o in extra if o.split("=", 1)[0].lstrip("+") == "methods"]
    allowed = set(method_modules(given[-1])) if given else set()
    sc = spec.scales[scale]
    named = [(f"scales.{scale}", o) for o in sc.overrides]
    named += [(f"scales.{scale}.prepare[{i}]", o) for i, st in enumerate(sc.prepare) for o in st.command]
    named += [(f"rows.{r.id}", o) for r in spec.run_rows(scale) for o in r.args(sc)]
    for where, o in named:
        if o.split("=", 1)[0].lstrip("+") != "methods" or "=" not in o:
            continue
        wanted = method_modules(o.split("=", 1)[1])
        if not set(wanted) <= allowed:
            names = ",".join(wanted)
            raise ConfigError(
                f"{spec.name}: {where} imports its method from {names}: run it with methods={names} "
                "to allow that (a claims file alone never makes fl-lightning import a module)"
            )


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def _in_folder(value: str, folder: str) -> str:
    """A path inside `folder` as `{out}/...`; anything else unchanged."""
    if folder and value.startswith(folder.rstrip("/") + "/"):
        return "{out}" + value[len(folder.rstrip("/")) :]
    return value


def config_changes(run: SweepRun, folder: Path) -> list[str]:
    """How the config a finished or killed run was made with (its `config.yaml`) differs from
    the one planned for it now, key by key (`key: then -> now`); keys a resume may change, keys
    one of the two lacks (a key newer than the run), keys the plan leaves to the run (null
    or `auto`: config.yaml records the run's choice, e.g. MiniLM's folder, the device) and
    model keys the run's overrides do not give (recorded as built) are not compared."""
    import yaml

    from ..core.safe_json import UnsafeInput, read_text

    path = run.run_dir / "config.yaml"
    if not path.is_file():
        return []
    try:
        stored = yaml.safe_load(read_text(path, 1 << 20))
    except (OSError, UnsafeInput, yaml.YAMLError, RecursionError) as e:
        return [f"its config.yaml cannot be read ({str(e).splitlines()[0]})"]
    if not isinstance(stored, dict):
        return ["its config.yaml is not a run config"]
    then_out = str(stored.get("output_dir", ""))
    planned = _flat(tree(run.cfg))
    # the model's keyword arguments are recorded as built, and a method may set one the run
    # leaves at the model file's default (FedTSP and CLIP2FL: the feature dimension, to the
    # text's): those are compared only where the run's overrides give them
    given = {a.split("=", 1)[0].lstrip("+") for a in run.overrides}
    changes = []
    for key, then in _flat(stored).items():
        if key not in planned or any(
            key == k or (k.endswith(".") and key.startswith(k)) for k in SAME_RUN_IGNORES
        ):
            continue
        if key.startswith("model.") and key != "model.name" and key not in given:
            continue
        now = planned[key]
        if (
            now is None or now == "auto"
        ):  # left to the run, which records what it chose (text.path, text.device)
            continue
        if isinstance(then, str) and isinstance(now, str):  # a path in the folder, wherever it is now
            then, now = _in_folder(then, then_out), _in_folder(now, str(folder))
        if then != now and not (key.startswith("method.") and key in _method_resumable(run)):
            changes.append(f"{key}: {then} -> {now}")
    return changes


def _method_resumable(run: SweepRun) -> tuple[str, ...]:
    """The keys the run's method declares a resume may change (imports the methods: called only
    for a method key that differs)."""
    return resumable_keys(str(run.cfg.method.name), method_modules(run.cfg.methods))


def plan(
    spec: Spec,
    scale: str,
    seeds: Sequence[int],
    out: Path,
    extra: Sequence[str],
    restart: bool = False,
    report_only: bool = False,
    check_inputs: bool = True,
) -> tuple[list[SweepRun], list[SweepRun], list[Path], list[tuple[Path, list[str]]]]:
    """Every run of the grid, composed and checked before any starts, touching nothing:
    (to run, finished, leftovers of killed runs to remove before they start again, runs made
    with other settings and how: moved aside with `restart`, said in the report with
    `report_only`, else one ConfigError). With `check_inputs`, a missing dataset or weights file
    the scale `requires` is one ConfigError naming every one (`--dry-run` lists them instead)."""
    check_consent(spec, scale, extra)
    experiment = f"{spec.name}_{scale}"
    todo: list[SweepRun] = []
    done: list[SweepRun] = []
    wipe: list[Path] = []
    missing: list[str] = []
    stale: list[tuple[Path, list[str]]] = []
    for seed in seeds:  # seed by seed: whatever finishes first pairs across the rows
        for row in spec.run_rows(scale):
            name = run_name(row.id, seed)
            args = [
                *row.args(spec.scales[scale], out), *extra, f"seed={seed}", f"experiment={experiment}",
                f"run_id={name}", f"row={row.id}", f"output_dir={out}",
                f"logger.group=reproduce-{spec.name}-{scale}", _tags(spec, scale, row.id),
            ]  # fmt: skip
            try:
                cfg = compose(args)
            except ConfigError as e:
                raise ConfigError(f"{spec.name} row {row.id!r}: {e}") from None
            missing += [m for m in missing_inputs(spec.scales[scale], cfg) if m not in missing]
            run = SweepRun(len(todo), args, cfg, out / experiment / name)
            changes = config_changes(run, out)
            if changes:
                stale.append((run.run_dir, changes))
                if not report_only:
                    todo.append(run)
                    continue
            need = continue_run(run)  # as a resumed sweep: finished, resume, restart or new
            if need == "finished":
                done.append(run)
                continue
            if need == "restart":
                wipe.append(run.run_dir)
            todo.append(run)
    if missing and check_inputs:  # every missing dataset and weights file at once, before any data
        raise ConfigError(f"{spec.name} --scale {scale} cannot start: " + "; ".join(missing))
    if stale and not restart and not report_only:
        first, changes = stale[0]
        more = f" (and {len(stale) - 1} more runs)" if len(stale) > 1 else ""
        raise ConfigError(
            f"{first} was made with other settings ({'; '.join(changes[:3])}){more}: continue with "
            "the overrides it was made with, choose another --out, or add --restart to move those runs "
            "aside and run them again"
        )
    return todo, done, wipe, stale


def missing_inputs(scale: Scale, cfg: RootConfig) -> list[str]:
    """What a run of `scale` lacks on disk: its dataset (unless it may be downloaded) and the
    files the scale `requires` (the paper's weights), each as what to get and where."""
    from .. import data  # noqa: F401  (registers every loader)
    from ..data.registry import check_data

    found: list[str] = []
    try:
        check_data(cfg.data)
    except ConfigError as e:
        found.append(str(e))
    given = _flat(tree(cfg))
    for key, what in scale.requires.items():
        value = given.get(key)
        if not value:
            found.append(f"{what}: pass {key}=<path>")
        elif not Path(str(value)).expanduser().exists():
            found.append(f"{what}: put it at {value} (or pass {key}=<path>)")
    return found


def prepare_steps(spec: Spec, scale: str, folder: Path) -> list[tuple[Path | None, list[str]]]:
    """The scale's `prepare` steps to run: (the file it creates, or None; `fl-lightning`
    arguments). A step whose file exists is done."""
    todo: list[tuple[Path | None, list[str]]] = []
    for step in spec.scales[scale].prepare:
        target = None if step.creates is None else folder / step.creates
        if target is None or not target.is_file():
            todo.append((target, [a.replace("{out}", str(folder)) for a in step.command]))
    return todo


def run_prepare(steps: Sequence[tuple[Path | None, list[str]]], logs: Path) -> None:
    """Each step as its own `fl-lightning` process (its output also in `logs/`); a failure is
    one line naming the step and its log."""
    import subprocess

    own_folder(logs)  # a planted link: one line (its logs were written through it)
    for i, (target, args) in enumerate(steps):
        log = logs / f"prepare-{i}.log"
        print(f"prepare: fl-lightning {' '.join(args)}", flush=True)
        with open_new(log) as f:  # a link planted at the log is replaced, not truncated through
            rc = subprocess.call([*fl_lightning_command(), *args], stdout=f, stderr=subprocess.STDOUT)
        lines = log.read_text().strip().splitlines()
        if rc != 0 or (target is not None and not target.is_file()):
            last = lines[-1] if lines else f"exit {rc}"
            raise ConfigError(f"prepare step `fl-lightning {' '.join(args)}` failed ({last}); log: {log}")
        for line in lines[-2:]:
            print(f"  {line}", flush=True)


def needs_lines(spec: Spec, scale: str, folder: Path, runs: Sequence[SweepRun] | None) -> list[str]:
    """What the scale says it needs, then what of it is here: each dataset the runs read (under
    their data root) and each weights file they name (`model.weights`, `text.pretrained`,
    `text.path`; one a prepare step makes counts as made). `runs`: the planned runs (None:
    compose the first row's here)."""
    from ..data.registry import missing

    sc = spec.scales[scale]
    lines = [f"needs: {sc.needs or '-'}"]
    if runs is None:  # `--list`: the first row's run stands for the scale
        row = spec.run_rows(scale)[0]
        try:
            runs = [SweepRun(0, [], compose([*row.args(sc, folder), f"output_dir={folder}"]), folder)]
        except ConfigError as e:
            return [*lines, f"  (row {row.id!r} does not compose here: {e})"]
    made = {str(folder / st.creates) for st in sc.prepare if st.creates is not None}
    checked: dict[str, str] = {}
    for run in runs:
        data = run.cfg.data
        root = str(Path(str(data.root)).expanduser())
        members = None if data.datasets is None else [str(m) for m in data.datasets]
        named = "" if members is None else f" ({', '.join(members)})"  # a composite's members
        key = f"dataset {data.name}{named} under {root}"
        if key not in checked:
            try:
                where = missing(str(data.name), root, members)
                checked[key] = "present" if where is None else f"MISSING: {where}"
            except ConfigError as e:
                checked[key] = f"MISSING: {e}"
        for name, value in (("model.weights", run.cfg.model.get("weights")),
                            ("text.pretrained", (run.cfg.text or {}).get("pretrained")),
                            ("text.path", (run.cfg.text or {}).get("path"))):  # fmt: skip
            if value:
                path = str(Path(str(value)).expanduser())
                state = (
                    "present"
                    if Path(path).is_file()
                    else "made by a prepare step"
                    if path in made
                    else "MISSING"
                )
                checked.setdefault(f"{name} {path}", state)
    lines += [f"  {what}: {state}" for what, state in checked.items()]
    return lines


def _run_dir_at(folder: Path) -> Path | None:
    """`folder` or the nearest folder above it that is a run directory (its `config.yaml` beside
    its metrics, summary or checkpoints), else None."""
    for d in (folder, *folder.parents):
        if (d / "config.yaml").is_file() and any(
            (d / n).exists() for n in ("metrics.jsonl", "summary.json", "checkpoints")
        ):
            return d
    return None


def _check_extra(extra: Sequence[str]) -> None:
    """Every word after the paper is a key=value override; a bare number is a seed given as
    `--seeds 0 1` (one comma-separated list is what --seeds takes)."""
    for o in extra:
        if "=" in o:
            continue
        if o.strip().isdigit():
            raise ConfigError(
                f"--seeds takes one comma-separated list (--seeds 0,1,2); got a stray seed {o!r}"
            )
        raise ConfigError(f"{o!r} is not a key=value override")


def _git(root: Path, *args: str) -> str | None:
    """`git -C root args` (stdout, stripped); None where git fails (no checkout, no git, or a
    `merge-base --is-ancestor` that says no). The claims folder may be a checkout someone else
    made: its `core.fsmonitor` command (run by `git status`) and hooks are off."""
    import subprocess

    from ..runtime.summary import git_command

    try:
        out = subprocess.run(git_command(root, *args), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _substance(spec: Spec, scale: str | None = None) -> str:
    """What decides a claims file's verdicts at `scale`: that scale's settings, the arguments
    each of its rows runs with there (and whose runs it reads), and each of its claims' rows,
    metric, statistic and direction; not its wording, labels, paper numbers, references, notes
    or multiplicity rule, which annotate the same test, nor another scale's settings (a paper
    scale corrected after a mini scale's runs leaves them pre-registered). None: every scale."""
    if scale is None:
        return repr([_substance(spec, s) for s in sorted(spec.scales)])
    if scale not in spec.scales:
        return repr(None)
    sc = spec.scales[scale]
    rows = [(r.id, r.args(sc), r.runs_of, r.metric_prefix) for r in spec.rows_for(scale)]
    claims = [(c.id, c.row, c.baseline, c.metric, c.stat, c.direction) for c in spec.claims_for(scale)]
    return repr((sc, rows, claims))


def claims_history(
    claims: Path, rev: str = "HEAD", scale: str | None = None
) -> tuple[str | None, str | None, str | None, str | None]:
    """(last commit, its date, the commit since which the claims' substance at `scale`
    (`_substance`; None: every scale) is what the file on disk says, its date) of a committed
    claims file, in `rev`'s history; Nones where git cannot tell (the third and fourth when even
    `rev`'s version differs)."""
    import tempfile

    root = claims.resolve().parent
    log = _git(root, "log", "--format=%H %cI", rev, "--", claims.name)
    if not log:
        return None, None, None, None
    history = [line.split(" ", 1) for line in log.splitlines()]
    last, last_date = history[0]
    try:
        now: str | None = _substance(load_spec(claims), scale)
    except ConfigError:  # a file today's reader refuses: its versions compared as text
        now = None
    raw = claims.read_text().strip() if claims.is_file() else None
    since: str | None = None
    since_date: str | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for commit, date in history:
            text = _git(root, "show", f"{commit}:./{claims.name}")
            old = Path(tmp) / claims.name
            old.write_text((text or "") + "\n")
            try:
                same = text is not None and (
                    _substance(load_spec(old), scale) == now if now is not None else text.strip() == raw
                )
            except ConfigError:  # a version today's reader refuses: the same only as text
                same = text is not None and now is None and text.strip() == raw
            if not same:
                break
            since, since_date = commit, date
    return last, last_date, since, since_date


def _earlier_runs(folder: Path, name: str) -> list[str]:
    """The earlier runs of the same name a `--restart` moved aside (`<out>/set_aside/<time>/`)."""
    aside = folder / "set_aside"
    return sorted(p.parent.name for p in aside.glob(f"*/{name}")) if aside.is_dir() else []


def provenance(
    claims: Path, run_dirs: Sequence[Path], scale: str | None = None
) -> tuple[list[str], dict[str, Any]]:
    """The report's provenance: the last commit of the claims file (and the one since which what
    decides its verdicts is unchanged), the commit each run ran at (its summary's `code`,
    `runtime/summary.py`) and its start time, and whether the claims are older than every run:
    pre-registered only where each run records a clean commit that contains the claims' and none
    started before that commit. Runs started before the claims' commit, or run more than once (an
    earlier run of the name set aside by `--restart`), are named."""
    root = claims.resolve().parent
    changed = _git(root, "status", "--porcelain", "--", claims.name)
    claims_commit, claims_date, since, since_date = claims_history(claims, scale=scale)
    at: dict[str, list[str]] = {}  # "<commit>" / "<commit> (dirty)" / "not recorded" -> runs
    older = since is not None and not changed
    early: list[str] = []  # started before the claims' commit
    by_content: list[str] = []  # runs whose commit is not in this history, checked by its own
    other: dict[str, tuple[str | None, str | None, str | None, str | None]] = {}
    unstarted: list[str] = []  # no start time recorded (runs from before summaries had one)
    twice: dict[str, list[str]] = {}
    starts: list[str] = []
    for d in run_dirs:
        summary = read_run(d).summary if d.is_dir() else {}
        code = summary.get("code")
        earlier = _earlier_runs(d.parent.parent, d.name)
        if earlier:
            twice[d.name] = earlier
        if not isinstance(code, dict) or not code.get("commit"):
            at.setdefault("not recorded", []).append(d.name)
            older = False
            continue
        at.setdefault(code["commit"] + (" (dirty)" if code.get("dirty") else ""), []).append(d.name)
        contains = _git(root, "merge-base", "--is-ancestor", since or "", code["commit"])
        run_since_date = since_date
        if contains is None and since is not None:
            # not in this history (a rebase rewrote the commits): the run's own commit must hold
            # these claims, committed before it started, as its history tells
            if code["commit"] not in other:
                other[code["commit"]] = claims_history(claims, code["commit"], scale)
            _, _, theirs, run_since_date = other[code["commit"]]
            if theirs is not None:
                contains = ""
                by_content.append(d.name)
        if code.get("dirty") or contains is None:
            older = False
        started = summary.get("started_at")
        if not isinstance(started, str):
            unstarted.append(d.name)
        else:
            starts.append(started)
            if run_since_date is not None and _utc(started) < _utc(run_since_date):
                early.append(d.name)
                older = False
    why = (
        "every run ran at a clean commit that contains the claims' commit"
        + (", and started after it" if not unstarted else f"; {len(unstarted)} runs record no start time")
        if older
        else "the claims file is uncommitted or changed since"
        if since is None or changed
        else f"{len(early)} runs started before the claims' commit"
        if early
        else "not every run records a clean commit that contains the claims' commit"
    )
    head = (
        f"`{claims_commit[:10]}` ({claims_date})"
        + (
            "; what decides its verdicts"
            + (f" at the {scale} scale (its settings, rows" if scale else " (scales, rows")
            + ", claims' rows, metrics, statistics, directions) "
            f"is unchanged since `{since[:10]}` ({since_date}), the commit the runs are checked against"
            if since and since != claims_commit
            else ""
        )
        if claims_commit
        else "no commit"
    )
    lines = [
        "## Provenance",
        "",
        f"Claims file `conf/reproduce/{claims.name}`: last committed in "
        + head
        + (" and changed since (uncommitted)" if changed else "")
        + ".",
        "",
        "| code commit the runs ran at | runs |",
        "|---|---|",
        *(f"| `{k}` | {len(v)}: {', '.join(v)} |" for k, v in at.items()),
        "",
    ]
    if starts:
        lines.append(f"Runs started {min(starts)} to {max(starts)} (UTC, their `summary.json`'s `started_at`)"
                     + (f"; {len(unstarted)} record no start time." if unstarted else "."))  # fmt: skip
    elif run_dirs:
        lines.append("No run records its start time (`started_at` came after these runs).")
    if early:
        lines.append(f"**Started before the claims' commit**: {', '.join(early)}.")
    if by_content:
        lines.append(
            f"{len(by_content)} runs ran at a commit outside this history (rewritten by a rebase); each "
            "was checked against its own commit's history, which holds these claims committed before it "
            "started."
        )
    if twice:
        named = "; ".join(f"{k} ({', '.join(v)})" for k, v in sorted(twice.items()))
        lines.append(f"**Run more than once** (an earlier run set aside by `--restart`): {named}.")
    lines += ["", f"Pre-registered: **{'yes' if older else 'no'}** ({why})."]
    numbers = {"claims_commit": claims_commit, "claims_date": claims_date, "claims_substance_since": since,
               "claims_substance_since_date": since_date, "claims_changed": bool(changed), "runs_at": at,
               "started_before_claims": early,
               "checked_in_own_history": by_content, "start_not_recorded": unstarted,
               "run_more_than_once": twice,
               "pre_registered": older}  # fmt: skip
    return lines, numbers


def _utc(stamp: str) -> Any:
    """An ISO 8601 time (git's %cI, summary.json's started_at) as an aware datetime."""
    from datetime import datetime

    return datetime.fromisoformat(stamp)


def reproduce_command(
    paper: str | None,
    scale: str,
    seeds: Sequence[int] | None,
    parallel: int,
    out: str | None,
    extra: Sequence[str],
    dry_run: bool = False,
    report_only: bool = False,
    listing: bool = False,
    restart: bool = False,
    estimate: bool = False,
) -> int:
    if listing or paper is None:
        list_specs()
        return 0
    _check_extra(extra)
    if scale not in SCALES:
        raise ConfigError(f"--scale must be one of {', '.join(SCALES)} (got {scale!r})")
    if parallel < 1:
        raise ConfigError(f"--parallel must be >= 1 (got {parallel})")
    spec = get_spec(paper)
    if scale not in spec.scales:
        raise ConfigError(f"{paper} has no {scale!r} scale; it has: {', '.join(spec.scales)}")
    seeds = list(seeds) if seeds else spec.scales[scale].seeds
    folder = resolve_output_dir(out or f"runs/reproduce/{paper}_{scale}")
    inside = _run_dir_at(folder.absolute())
    if inside is not None:
        where = "inside " if inside != folder.absolute() else ""
        raise ConfigError(
            f"--out {folder} is {where}the run directory {inside}: a reproduction needs its own folder"
        )
    if estimate:  # runs nothing, writes nothing
        from .estimate import estimate_lines

        sc = spec.scales[scale]
        rows = [(r.label, [*r.args(sc, folder), *extra, "seed=0", f"output_dir={folder}", "logger=none"])
                for r in spec.run_rows(scale)]  # fmt: skip
        print(f"reproduce {paper} ({scale}): {len(rows)} rows x {len(seeds)} seeds, the scale's rounds")
        for line in estimate_lines(rows, len(seeds)):
            print(f"  {line}")
        return 0
    runs_dir = folder / f"{spec.name}_{scale}"
    command = " ".join(["fl-lightning reproduce", paper, f"--scale {scale}",
                        f"--seeds {','.join(map(str, seeds))}", *([f"--out {out}"] if out else []),
                        *extra])  # fmt: skip
    # every run composes and was made with these settings, or one line (also before a report:
    # its "Every run" line must be what the runs got)
    todo, done, wipe, stale = plan(
        spec, scale, seeds, folder, extra, restart, report_only, check_inputs=not (report_only or dry_run)
    )
    aside = [path for path, _ in stale]
    if not report_only:
        steps = prepare_steps(spec, scale, folder)
        total = len(todo) + len(done)
        resumed = sum(r.resume for r in todo)
        print(
            f"reproduce {paper} ({scale}): {total} runs in {runs_dir}; {len(done)} finished, "
            f"{resumed} to resume, {len(todo) - resumed} to start"
            + (f" ({len(aside)} made with other settings, to move aside first)" if aside else ""),
            flush=True,
        )
        if dry_run:
            for line in needs_lines(spec, scale, folder, [*todo, *done]):
                print(f"  {line}")
            for _, args in steps:
                print(f"  fl-lightning {' '.join(args)}   (prepare)")
            print_plan(todo)
            return 0
        with sweep_lock(folder):  # one reproduction at a time in its folder
            if aside:
                target = folder / "set_aside" / time.strftime("%Y%m%d-%H%M%S")
                target.mkdir(parents=True, exist_ok=False)
                for path in aside:
                    path.rename(target / path.name)
                print(f"moved {len(aside)} runs made with other settings to {target}", flush=True)
            if steps:
                run_prepare(steps, folder / "logs")
            for path in wipe:
                shutil.rmtree(path)
            if todo:
                run_grid(todo, parallel, folder / "logs", ["run_id"])
    report, numbers = build_report(
        spec, scale, runs_dir, seeds, command, extra, {p.name: c for p, c in stale} if report_only else {}
    )
    run_dirs = [runs_dir / run_name(r.id, s) for r in spec.run_rows(scale) for s in seeds]
    lines, numbers["provenance"] = provenance(specs()[paper], run_dirs, scale)
    report = report.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    # whole or as it was (a full disk cut a report mid-line), and a link planted at either
    # name is replaced, not written through
    write_atomic(folder / "report.md", lambda f: f.write(report.encode()))
    import json

    numbers["command"] = command
    results = json.dumps(numbers, indent=1) + "\n"
    write_atomic(folder / "results.json", lambda f: f.write(results.encode()))
    written = [folder / "report.md", folder / "results.json"]
    png = plot_curves(spec, scale, runs_dir, seeds, folder / "curves.png")
    if png is not None:
        written.append(png)
    for p in written:
        print(f"wrote {p}")
    for c in numbers["claims"]:
        print(f"  {c['id']}: {c['verdict']} ({len(c['seeds'])} pairs{'; ' + c['why'] if c['why'] else ''})")
    missing = [r for r in todo if not is_finished(read_run(r.run_dir), int(r.cfg.fl.rounds))]
    if missing and not report_only:
        print(f"fl-lightning: error: {len(missing)} runs unfinished; run the command again", file=sys.stderr)
        return 1
    return 0
