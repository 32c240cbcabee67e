"""`fl-lightning reproduce <paper> [--scale mini|paper] [--seeds 0,1,2] [--parallel N]`.

Runs a paper's claims grid (`conf/reproduce/<paper>.yaml`, see `tracking/reproduce.py`)
through the sweep machinery, then writes `report.md`, `results.json` and `curves.png` into
its folder (`--out`, default `runs/reproduce/<paper>_<scale>`). The runs live in
`<out>/<paper>_<scale>/<row>_s<seed>/`, one W&B group (`reproduce-<paper>-<scale>`), each
tagged with the paper, scale, row and the claims it enters.

Run again, it skips the runs that finished (completed, or stopped for good by divergence),
resumes the ones a kill interrupted from their last checkpoint, and starts the rest: a killed
reproduction continues where it stopped. Extra `key=value` overrides after the paper go to
every run (`runtime=ray`, `logger=none`); they are part of the grid, so use the same ones
when continuing.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ..config import compose, conf_dir
from ..core.errors import ConfigError
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
from .sweep import SweepRun, continue_run, print_plan, run_grid, sweep_lock


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


def _tags(spec: Spec, scale: str, row: str) -> str:
    claims = [
        c.id for c in spec.claims_for(scale) if row in (spec.rows[c.row].source, spec.rows[c.baseline].source)
    ]
    return "logger.tags=[" + ",".join(["reproduce", spec.name, scale, f"row-{row}", *claims]) + "]"


def plan(
    spec: Spec, scale: str, seeds: Sequence[int], out: Path, extra: Sequence[str]
) -> tuple[list[SweepRun], list[SweepRun], list[Path]]:
    """Every run of the grid, composed and checked before any starts, touching nothing:
    (to run, finished, leftovers of killed runs to remove before they start again)."""
    experiment = f"{spec.name}_{scale}"
    todo: list[SweepRun] = []
    done: list[SweepRun] = []
    wipe: list[Path] = []
    missing: list[str] = []
    for row in spec.run_rows(scale):
        for seed in seeds:
            name = run_name(row.id, seed)
            args = [
                *row.args(spec.scales[scale], out), *extra, f"seed={seed}", f"experiment={experiment}",
                f"run_id={name}", f"output_dir={out}", f"logger.group=reproduce-{spec.name}-{scale}",
                _tags(spec, scale, row.id),
            ]  # fmt: skip
            try:
                cfg = compose(args)
            except ConfigError as e:
                raise ConfigError(f"{spec.name} row {row.id!r}: {e}") from None
            missing += [m for m in missing_inputs(spec.scales[scale], cfg) if m not in missing]
            run = SweepRun(len(todo), args, cfg, out / experiment / name)
            need = continue_run(run)  # as a resumed sweep: finished, resume, restart or new
            if need == "finished":
                done.append(run)
                continue
            if need == "restart":
                wipe.append(run.run_dir)
            todo.append(run)
    if missing:  # every missing dataset and weights file at once, before any data loads
        raise ConfigError(f"{spec.name} --scale {scale} cannot start: " + "; ".join(missing))
    return todo, done, wipe


def missing_inputs(scale: Scale, cfg: Any) -> list[str]:
    """What a run of `scale` lacks on disk: its dataset (unless it may be downloaded) and the
    files the scale `requires` (the paper's weights), each as what to get and where."""
    from .. import data  # noqa: F401  (registers every loader)
    from ..data.registry import check_dataset

    found: list[str] = []
    try:
        check_dataset(str(cfg.data.name), str(Path(str(cfg.data.root)).expanduser()), bool(cfg.data.download))
    except ConfigError as e:
        found.append(str(e))
    for key, what in scale.requires.items():
        value = OmegaConf.select(cfg, key)
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

    logs.mkdir(parents=True, exist_ok=True)
    for i, (target, args) in enumerate(steps):
        log = logs / f"prepare-{i}.log"
        print(f"prepare: fl-lightning {' '.join(args)}", flush=True)
        with log.open("w") as f:
            cmd = [sys.executable, "-m", "fl_lightning", *args]
            rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
        lines = log.read_text().strip().splitlines()
        if rc != 0 or (target is not None and not target.is_file()):
            last = lines[-1] if lines else f"exit {rc}"
            raise ConfigError(f"prepare step `fl-lightning {' '.join(args)}` failed ({last}); log: {log}")
        for line in lines[-2:]:
            print(f"  {line}", flush=True)


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
) -> int:
    if listing or paper is None:
        list_specs()
        return 0
    if scale not in SCALES:
        raise ConfigError(f"--scale must be one of {', '.join(SCALES)} (got {scale!r})")
    if parallel < 1:
        raise ConfigError(f"--parallel must be >= 1 (got {parallel})")
    spec = get_spec(paper)
    if scale not in spec.scales:
        raise ConfigError(f"{paper} has no {scale!r} scale; it has: {', '.join(spec.scales)}")
    seeds = list(seeds) if seeds else spec.scales[scale].seeds
    folder = resolve_output_dir(out or f"runs/reproduce/{paper}_{scale}")
    runs_dir = folder / f"{spec.name}_{scale}"
    command = " ".join(["fl-lightning reproduce", paper, f"--scale {scale}",
                        f"--seeds {','.join(map(str, seeds))}", *([f"--out {out}"] if out else []),
                        *extra])  # fmt: skip
    todo: list[SweepRun] = []
    if not report_only:
        todo, done, wipe = plan(spec, scale, seeds, folder, extra)  # every run composes, or one line
        steps = prepare_steps(spec, scale, folder)
        total = len(todo) + len(done)
        resumed = sum(r.resume for r in todo)
        print(
            f"reproduce {paper} ({scale}): {total} runs in {runs_dir}; {len(done)} finished, "
            f"{resumed} to resume, {len(todo) - resumed} to start",
            flush=True,
        )
        if dry_run:
            for _, args in steps:
                print(f"  fl-lightning {' '.join(args)}   (prepare)")
            print_plan(todo)
            return 0
        with sweep_lock(folder):  # one reproduction at a time in its folder
            if steps:
                run_prepare(steps, folder / "logs")
            for path in wipe:
                shutil.rmtree(path)
            if todo:
                run_grid(todo, parallel, folder / "logs", ["run_id"])
    report, numbers = build_report(spec, scale, runs_dir, seeds, command)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.md").write_text(report)
    import json

    (folder / "results.json").write_text(json.dumps(numbers, indent=1) + "\n")
    written = [folder / "report.md", folder / "results.json"]
    png = plot_curves(spec, scale, runs_dir, seeds, folder / "curves.png")
    if png is not None:
        written.append(png)
    for p in written:
        print(f"wrote {p}")
    for c in numbers["claims"]:
        print(f"  {c['id']}: {c['verdict']} ({len(c['seeds'])} pairs)")
    missing = [r for r in todo if not is_finished(read_run(r.run_dir), int(r.cfg.fl.rounds))]
    if missing:
        print(f"fl-lightning: error: {len(missing)} runs unfinished; run the command again", file=sys.stderr)
        return 1
    return 0
