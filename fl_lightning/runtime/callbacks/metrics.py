"""Where a run's numbers go: `MetricsWriter` (the run directory's metrics.jsonl, summary.json
and curves.png) and `Loggers` (W&B and the console's progress bar)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from functools import partial
from pathlib import Path
from typing import Any

from ...config import tree, variant_of
from ...core.about import about
from ...core.errors import DivergedError
from ...tracking.console import Progress
from ...tracking.loggers import MetricsLogger, RunFiles
from .. import outcome
from ..build import Prepared
from ..record import RoundRecord, strict_json
from .base import Callback, RunContext, WallClock

log = logging.getLogger("fl_lightning")


class MetricsWriter(Callback):
    """`metrics.jsonl`: a line per round (strict JSON: non-finite numbers are null and named
    under `nonfinite`), fsynced; the line of a round that diverged, marked; `summary.json`
    (`write_summary`, first thing on the way out) and `curves.png` at the end. On resume,
    lines after the checkpoint's round are dropped first."""

    def __init__(self, run_dir: Path, resumed_round: int | None = None) -> None:
        self.run_dir = run_dir
        self.files = RunFiles(run_dir, keep_until_round=resumed_round)
        self.clock = WallClock()

    def records(self) -> list[dict[str, Any]]:
        return self.files.records()

    def has_line(self, rnd: int) -> bool:
        """Whether metrics.jsonl ends with round `rnd`'s line (or a later one)."""
        prior = self.records()
        return bool(prior) and int(prior[-1]["round"]) >= rnd

    def wall_time(self, unwritten: dict[str, Any] | None) -> float:
        """The run's wall time so far: that of its unwritten line, else of its last line."""
        prior = self.records()
        return float((unwritten or (prior[-1] if prior else {})).get("wall_time_s", 0.0))

    def on_run_start(self, ctx: RunContext) -> None:
        self.clock = ctx.clock

    def on_line(self, record: RoundRecord) -> None:
        self.files.log_round(record.round, strict_json(record.line()))

    def on_exception(self, error: BaseException) -> None:
        if isinstance(error, DivergedError):  # what is known of the round, marked
            rnd = error.record.get("round")
            assert isinstance(rnd, int)
            self.files.log_round(
                rnd, strict_json({**error.record, "wall_time_s": self.clock.wall(time.perf_counter())})
            )

    def write_summary(self, summary: dict[str, Any], failing: bool) -> None:
        """summary.json, before anything slow on the way out (`Run` calls it ahead of the
        callbacks' `on_run_end`); on a run already failing (`failing`), a summary the disk
        refuses is a warning, so that the error that stopped the run is the one reported."""
        outcome.write_summary(self.files, summary, failing)

    def on_run_end(self, status: str, summary: dict[str, Any]) -> None:
        from ...tracking.curves import save_run_curves

        if not self.run_dir.is_dir():  # removed mid-run: not made again for a picture
            return
        try:  # a picture that cannot be drawn costs a warning, never the run (or its error)
            save_run_curves(self.records(), summary, self.run_dir / "curves.png")
        except Exception as e:
            log.warning("curves.png not written: %s: %s", type(e).__name__, e)


class Loggers(Callback):
    """Each round's line to W&B (`logger=wandb`) and the progress bar, after the line was
    written and its round checkpointed; the summary at the end."""

    def __init__(self, loggers: list[MetricsLogger], progress: Progress, first_round: int) -> None:
        self.loggers, self.progress = loggers, progress
        self.first_round = first_round  # the bar starts here: a resume's unwritten line is not counted

    @property
    def meta(self) -> dict[str, Any]:
        """What a resume needs to go on logging to the same W&B run."""
        wandb_id = getattr(self.loggers[0], "id", None) if self.loggers else None
        return {"wandb_id": wandb_id} if wandb_id else {}

    def on_line(self, record: RoundRecord) -> None:
        line = record.line()
        for lg in self.loggers:
            lg.log_round(record.round, line)
        if record.round > self.first_round:
            self.progress.update(record.round, line)

    def on_run_end(self, status: str, summary: dict[str, Any]) -> None:
        self.progress.close()
        for lg in self.loggers:
            lg.log_summary(summary)
            lg.close(status == "completed")


def wandb_loggers(p: Prepared, run_dir: Path, meta: dict[str, Any]) -> list[MetricsLogger]:
    """The W&B logger of a run (`logger=wandb`, not disabled), continuing the W&B run of
    `meta["wandb_id"]` on resume; none otherwise."""
    from ...tracking.loggers import WandbLogger

    cfg = p.cfg
    lc = cfg.logger
    if lc.backend != "wandb" or lc.mode == "disabled":
        return []
    config = tree(cfg)
    extra = strategy_extras(p.strategy.summary(), config)
    if extra:
        config["strategy"] = extra
    config["partition"] = {"train_sizes": [int(len(t)) for t in p.split.train]}
    method, data, variant = cfg.method.name, cfg.data, variant_of(cfg)
    paper = about(type(p.strategy), method).tag()  # paper:arXiv:<id>, where it has one
    tags = [method, data.name, f"seed:{cfg.seed}", *([paper] if paper else []), *lc.tags]
    if data.partition:
        tags.insert(2, f"partition:{data.partition}")
    wb = WandbLogger(
        run_dir, run_dir.name, lc.project, lc.entity, lc.group or cfg.experiment,
        tags, lc.mode, config, meta.get("wandb_id"), name=f"{variant}-s{cfg.seed}",
        job_type=job_type(variant),
    )  # fmt: skip
    if not meta.get("wandb_id"):  # once per W&B run (a resumed run has it already)
        wb.log_partition(run_dir / "partition.json", run_dir / "partition.png")
    return [wb]


def strategy_extras(summary: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """What the method's `Strategy.summary()` says that the run's config does not (e.g. the
    participation weights, a `clients_per_round` the config left null): W&B's config holds each
    hyperparameter once, as `method.<k>`."""
    method = config.get("method", {})
    said = {**config.get("fl", {}), **method, "method": method.get("name")}
    text = partial(json.dumps, default=str)
    return {k: v for k, v in summary.items() if k not in said or text(said[k]) != text(v)}


def job_type(variant: str) -> str:
    """The variant as W&B's job type, which holds 64 characters: a longer one is cut, with a
    digest of the whole so that two variants cut alike stay apart."""
    if len(variant) <= 64:
        return variant
    return f"{variant[:55]}~{hashlib.sha1(variant.encode()).hexdigest()[:8]}"
