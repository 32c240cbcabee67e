"""Running a built run: `run_rounds` is the algorithm's loop (pfl-research's
`FederatedAlgorithm.run`, Flower's `Strategy.start`); evaluation, checkpoints, the divergence
guard and batch-norm statistics are its steps (`steps/`), metrics and loggers observe it as
callbacks (`callbacks/`), and `Run` wires them up. `start_run` and `resume_run` are the entry
points.

All randomness is derived from (seed, round, client), and state is only `ServerState`
plus each client's resident state, so a run resumed from any checkpoint repeats exactly
what the uninterrupted run would do. `build.py` builds what this runs; `session.py` holds
Ray and its workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import RootConfig, to_yaml
from ..core.aggregation import Summed
from ..core.errors import DivergedError, StoppedAfterCompletion
from ..core.files import open_new
from ..core.messages import RoundPlan, ServerState
from ..core.privacy.plan import BudgetSpent, PrivacyPlan
from ..core.strategy import (
    ServerContext,
    Strategy,
    aggregate_with,
    aggregated,
    chain_metrics_of,
    round_rng,
    server_rng,
)
from ..core.types import ClientId
from ..data.federated import partition_cache_dir
from ..data.stats import save_partition_plot
from ..models import build_client_model
from ..models.weights import keep_weights, kept_weights
from ..tracking.chance import chance_level
from . import checkpoint, outcome, signals
from .build import Prepared, prepare
from .callbacks import Callback, CallbackList, Loggers, MetricsWriter, RunContext
from .callbacks.metrics import wandb_loggers
from .executor import Executor
from .placement import Placement
from .record import RoundRecord
from .scheduler import Scheduler, Synchronous, scheduler_for, virtual_time
from .session import Session, Workers
from .steps import (
    Checkpointer,
    ClientEval,
    GlobalEval,
    Line,
    WallClock,
    driver_device,
    finite_losses,
    finite_weights,
    recompute_bn_stats,
    unwritten_line,
)
from .summary import run_summary
from .summing import SummingExecutor, sums_on_arrival

log = logging.getLogger("fl_lightning")

__all__ = ["Prepared", "Run", "prepare", "resume_run", "run_rounds", "start_run"]


@dataclasses.dataclass(frozen=True)
class RoundSteps:
    """What a run does each round beside the strategy's hooks, as its config chose it."""

    global_eval: GlobalEval
    client_eval: ClientEval
    checkpointer: Checkpointer | None = None  # None: no checkpoints (a test's rounds)
    bn_stats: bool = False  # fl.bn_stats=recompute
    #: privacy=dp_fedavg: the budget stop before each round and ε after it (the noise is the
    #: aggregation chain's); None: no privacy
    privacy: PrivacyPlan | None = None
    #: add each update to the aggregation chain's running sum as it arrives and drop its params
    #: where the method allows it (`summing.py`): the driver holds one sum, not the round's
    #: updates. False: every update kept whole (the testing kit's golden tests read them).
    sum_on_arrival: bool = True


def run_rounds(
    state: ServerState,
    last_round: int,
    strategy: Strategy[Any, Any, Any],
    executor: Executor,
    seed: int,
    context: Callable[[int], ServerContext],
    steps: RoundSteps,
    callbacks: Callback,
    clock: WallClock,
    scheduler: Scheduler | None = None,
) -> ServerState:
    """Rounds (server steps) `state.round + 1` to `last_round`: the algorithm, in order;
    callbacks observe. `scheduler` decides each step's updates (`scheduler.py`; default:
    synchronous rounds, every client taking no time)."""
    scheduler = scheduler if scheduler is not None else Synchronous()
    line: Line | None = None  # the newest round's line until it is written (`waits`: its evaluation runs)

    started: set[int] = set()  # the rounds whose plan `on_round_start` saw

    def configure(state: ServerState, rnd: int) -> RoundPlan:
        # sample clients, the broadcast and each client's payload (to evaluate before it
        # uploads, eval.timing=trained)
        plan = steps.client_eval.before_upload(strategy.configure_round(state, rnd, round_rng(seed, rnd)))
        callbacks.on_round_start(plan)
        started.add(rnd)
        return plan

    try:
        for rnd in range(state.round + 1, last_round + 1):
            if steps.privacy is not None:  # BudgetSpent: this round would pass privacy.max_epsilon
                steps.privacy.check_budget(rnd, privacy_memory(state))  # (and σ is the rounds' so far)
            t0 = time.perf_counter()
            # 1. configure, 2. fit: the scheduler's updates for this step, in client-id order
            # (each added to the chain's running sum as it arrives, where the method allows it)
            failed, retried = len(executor.failures), len(executor.retries)
            ctx = context(rnd)
            if steps.sum_on_arrival and sums_on_arrival(strategy, scheduler, state):
                summed = Summed(strategy.aggregator, strategy.aggregator.start(state, ctx))
                got = scheduler.collect(state, rnd, SummingExecutor(executor, summed, ctx), configure)
                ctx = dataclasses.replace(ctx, summed=summed)
            else:
                got = scheduler.collect(state, rnd, executor, configure)
            plan, updates = got.plan, got.updates
            if rnd not in started:  # an asynchronous step: the clients it took, once they are known
                callbacks.on_round_start(plan)
            tf = time.perf_counter()
            # the clients' last act before anything of the server's reads their updates
            # (secure aggregation masks them here: core/secagg.py)
            if got.staleness:
                ctx = dataclasses.replace(ctx, staleness=got.staleness)
            updates = strategy.aggregator.upload(state, updates, ctx)
            # the previous round's evaluation ends before this round's is prepared: its line now
            _write(line, callbacks)
            record = RoundRecord.of_fit(
                rnd, plan, updates, executor.failures[failed:], executor.retries[retried:]
            )
            record.system, record.staleness_hist = got.system, got.staleness_hist
            finite_losses(record, updates)
            callbacks.on_updates(record, updates)
            t1 = time.perf_counter()
            # 3. aggregate, 4. server update (then fl.bn_stats=recompute: the clients that trained
            #    measure the new global model's batch-norm statistics)
            state, aggregate_metrics = aggregated(aggregate_with(strategy, state, updates, ctx))
            state, chain_metrics = chain_metrics_of(state)
            state, server_metrics = strategy.server_update(state, updates, ctx)
            record.server = {**chain_metrics, **aggregate_metrics, **server_metrics}
            if steps.privacy is not None:  # every round composes one mechanism: ε after `rnd` rounds
                clip = chain_metrics.get("dp_fedavg/clip")
                record.privacy = steps.privacy.report(rnd, privacy_memory(state), clip)
            state = finite_weights(dataclasses.replace(state, round=rnd), record)
            state = scheduler.stepped(state, rnd)
            record.virtual_time = virtual_time(state)
            if steps.bn_stats:
                state = recompute_bn_stats(state, plan, updates, record, strategy, executor)
            t2 = time.perf_counter()
            # 5. evaluate: the global model in line, or beside the next round's fit (eval.overlap;
            #    the last round in line), then the clients' own models
            line = steps.global_eval.start(state, record, overlap=rnd < last_round)
            steps.client_eval.evaluate(state, updates, record, executor)
            record.finish(plan, updates, t0, tf, t1, t2)
            record.wall_time_s = clock.wall(record.done)
            # the checkpoint holds the round's line as known now (and the clients in flight, in
            # `state.schedule`); the line is written once complete
            if steps.checkpointer is not None:
                steps.checkpointer.round_end(
                    state, updates, record, evaluating=line.waits, trained=got.trained, states=got.states
                )
            callbacks.on_round_end(state, record)
            if not line.waits:
                _write(line, callbacks)
    except BaseException:
        with contextlib.suppress(Exception):  # a finished round still gets its line
            _write(line, callbacks)
        raise
    return state


def privacy_memory(state: ServerState) -> dict[str, Any]:
    """The privacy step's memory in the chain (dp_fedavg's or dp_sgd's ledger)."""
    return dict(state.aggregation.get("dp_fedavg") or state.aggregation.get("dp_sgd") or {})


def _write(line: Line | None, callbacks: Callback) -> None:
    """`line`'s record to every `on_line`, once (after its evaluation, if it still runs)."""
    record = line.take() if line is not None else None
    if record is not None:
        callbacks.on_line(record)


class Run:
    """One federated run in a run directory: start, resume, or continue."""

    def __init__(
        self,
        prepared: Prepared,
        run_dir: Path,
        session: Session | None = None,
        resume: bool = False,
        console: bool = True,
        started_at: float | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        self.p, self.cfg = prepared, prepared.cfg
        self.run_dir, self.resume, self.console = Path(run_dir), resume, console
        self.session = session if session is not None else Session()
        self.extra_callbacks = list(callbacks)
        #: `time.perf_counter()` when the run began (before `prepare`): start-up is measured from it
        self.started_at = time.perf_counter() if started_at is None else started_at
        self.startup_s: float | None = None
        self.whole = False  # summary.json says completed and curves.png is drawn (`execute`)
        #: seconds from `started_at` to each step of the start-up before the first round
        #: (summary.json `startup_phases_s`, with `startup_s` last): where a slow start goes
        self.phases: dict[str, float] = {}
        sx = prepared.server_x
        self._unlabeled = None if sx is None else prepared.dataset.tensors(sx, np.zeros(len(sx)))[0]

    def execute(self) -> dict[str, Any]:
        """Run (or continue) the rounds; summary.json, curves.png and the console's table at the end.
        A signal once the run is whole raises `StoppedAfterCompletion`: nothing to resume."""
        self.whole = False  # summary.json says completed and its picture is drawn
        try:
            return self._execute()
        except KeyboardInterrupt as e:
            if self.whole and not isinstance(e, StoppedAfterCompletion):
                raise StoppedAfterCompletion(self.run_dir) from e
            raise

    def _execute(self) -> dict[str, Any]:
        from ..tracking.console import Progress, print_table

        p, cfg, run_dir = self.p, self.cfg, self.run_dir
        state, meta, client_index = self._initial_state()
        writer = MetricsWriter(run_dir, resumed_round=state.round if self.resume else None)
        unwritten, evaluating = unwritten_line(meta)
        if writer.has_line(state.round):
            unwritten = None
        clock = WallClock(writer.wall_time(unwritten))
        client_eval = ClientEval(p)
        try:
            self._write_partition()
            for w in p.strategy.warnings():
                log.warning(w)
            global_eval = GlobalEval(p, run_dir, clock)
            checkpointer = Checkpointer(run_dir, int(cfg.checkpoint.every), int(cfg.fl.rounds), client_index)
            workers = self.session.workers(p, restore=checkpointer.saved_states)
            self.phases["workers_ready"] = time.perf_counter() - self.started_at
        except BaseException as e:  # Ray did not start, Ctrl-C or SIGTERM while its workers start:
            # summary.json says why, as for any run that stops
            status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
            with signals.held():
                stopped = self._summary(writer, client_eval, None, status, outcome.reason(e))
                writer.write_summary(stopped, failing=True)
            raise
        self._record_choices(workers.placement)
        progress = Progress(cfg.fl.rounds, state.round, self.console, p.strategy.primary_metric())
        loggers = Loggers([], progress, first_round=state.round)
        # the line goes to metrics.jsonl before W&B and the progress bar: a run killed in
        # between writes it (from its checkpoint) and logs it once
        callbacks = CallbackList([writer, loggers, *self.extra_callbacks])
        steps = RoundSteps(
            global_eval, client_eval, checkpointer, cfg.fl.bn_stats == "recompute", privacy=p.privacy
        )
        status = "failed"
        error: str | None = None  # why it stopped (summary.json `error`)
        try:
            loggers.loggers = wandb_loggers(p, run_dir, meta)
            checkpointer.restore(workers.executor, loggers.meta)
            callbacks.on_run_start(RunContext(workers.executor, clock, loggers.meta))
            if unwritten is not None:  # killed after its round's checkpoint, before the line was written
                record = RoundRecord.from_line({"round": state.round, **unwritten})
                if evaluating:
                    record.evaluation = global_eval.now(state)
                callbacks.on_line(record)
            self.startup_s = clock.start() - self.started_at
            last, seed = int(cfg.fl.rounds), int(cfg.seed)
            sched = scheduler_for(p, run_dir)
            ex = workers.executor
            try:
                run_rounds(state, last, p.strategy, ex, seed, self.context, steps, callbacks, clock, sched)
                status = "completed"
            except BudgetSpent as e:  # a clean stop: the next round would pass privacy.max_epsilon
                status = "budget_spent"
                log.warning("%s", e)
        except BaseException as e:
            status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"  # interrupted: resumable
            status = "diverged" if isinstance(e, DivergedError) else status
            error = outcome.reason(e)
            callbacks.on_exception(e)
            raise
        finally:
            try:
                # summary.json first, whole: a second Ctrl-C while it is made waits for it (a third
                # does not), and one during the teardown below (the overlapped evaluation's
                # thread, Ray's shutdown: seconds) finds it written. A completed run's
                # curves.png is held with it: a signal then (S-5) left a `completed` summary
                # with no picture, which nothing drew later (`resume`: already finished)
                with signals.held():
                    summary = self._way_out_summary(writer, client_eval, workers, status, error)
                    writer.write_summary(summary, failing=error is not None)
                    if status == "completed":
                        self._end_callbacks(global_eval, callbacks, status, summary)
                        self.whole = True
                if status != "completed":  # a quick way out: no picture to wait for
                    self._end_callbacks(global_eval, callbacks, status, summary)
            finally:  # the run's workers end (or stay warm) whatever happened on the way out
                # and the evaluation thread with them: a second signal raised out of the block
                # above left it waiting for work, and the exit (which joins it) hung for good
                global_eval.close()
                self.session.end_run(workers.executor, completed=status == "completed")
        if self.console:
            print_table(writer.records(), summary, run_dir)
            if p.privacy is not None:
                done = int(summary.get("rounds_completed", 0))
                print(p.privacy.console_line(done, (summary.get("privacy") or {}).get("epsilon")))
        return summary

    @staticmethod
    def _end_callbacks(
        global_eval: GlobalEval, callbacks: CallbackList, status: str, summary: dict[str, Any]
    ) -> None:
        global_eval.close()
        callbacks.on_run_end(status, summary)

    def _record_choices(self, placement: Placement) -> None:
        """config.yaml as this run goes: the run id and the choices only now made (placement,
        accelerator, evaluation device, W&B mode; a resume's new `fl.rounds`), written in
        place of `auto`/null, W&B's config taken from the same (`load_run_config` lets a
        resume on another machine choose the machine's parts again)."""
        cfg = self.cfg
        cfg.runtime.placement = "per_client" if placement.mode == "per_client" else "pool"
        cfg.runtime.accelerator = "gpu" if placement.accelerator == "gpu" else "cpu"
        if cfg.runtime.executor == "ray":
            cfg.runtime.num_actors = placement.num_actors  # null: the number Ray's resources gave
        cfg.eval.device = "cuda" if driver_device(cfg.eval.device).type == "cuda" else "cpu"
        cfg.run_id = self.run_dir.name
        if cfg.logger.backend == "wandb":  # online with an API key, else offline
            from ..tracking.loggers import wandb_mode

            cfg.logger.mode = wandb_mode(cfg.logger.mode)
        write_config(self.run_dir, cfg)

    def _summary(
        self,
        writer: MetricsWriter,
        client_eval: ClientEval,
        workers: Workers | None,
        status: str,
        error: str | None,
    ) -> dict[str, Any]:
        """summary.json of the run as it stands (`workers` None: Ray did not start)."""
        p = self.p
        records = writer.records()
        chance = None
        if status == "completed":  # a run that learned nothing, yet did not diverge, says so
            chance = chance_level(np.asarray(p.dataset.test_y), p.strategy.task.multilabel)
        return run_summary(
            self.cfg, records, p.strategy.primary_metric(), self.run_dir.name, status,
            None if workers is None else workers.placement,
            0 if workers is None else workers.reused, 0 if workers is None else workers.prestarted,
            self.startup_s, client_eval.sampled_clients(), self._summary_extra(client_eval, records), error,
            chance,
        )  # fmt: skip

    def _way_out_summary(
        self, writer: MetricsWriter, client_eval: ClientEval, workers: Workers, status: str, error: str | None
    ) -> dict[str, Any]:
        """The run's summary as it ends; a failing run's names its own error, never one of making it."""
        try:
            return self._summary(writer, client_eval, workers, status, error)
        except Exception as e:
            if error is None:
                raise
            log.warning("summary.json of the failed run keeps to its error (%s)", outcome.reason(e))
            return self._bare_summary(status, error)

    def _bare_summary(self, status: str, error: str) -> dict[str, Any]:
        """What any summary.json holds, for a failing run whose full summary cannot be made."""
        cfg = self.cfg
        return {
            "method": cfg.method.name, "dataset": cfg.data.name, "model": cfg.model["name"],
            "seed": int(cfg.seed), "experiment": cfg.experiment, "run_id": self.run_dir.name,
            "status": status, "error": error,
        }  # fmt: skip

    def _summary_extra(self, client_eval: ClientEval, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The method's own summary keys, the pretrained trunk the run started from and each
        client's majority-class accuracy (the reference of `client_accuracy`)."""
        extra = dict(self.p.strategy.run_summary())
        if self.p.privacy is not None:  # ε after the rounds done, and what it covers
            done = max((int(r["round"]) for r in records if not r.get("diverged")), default=0)
            last = next((r["privacy/epsilon"] for r in reversed(records) if "privacy/epsilon" in r), None)
            extra["privacy"] = self.p.privacy.summary(done, last)
        if client_eval.majority is not None:
            extra["client_majority_accuracies"] = [round(a, 6) for a in client_eval.majority]
        if self.p.weights_info is not None:
            extra["model_weights"] = self.p.weights_info
        phases = self.phases if self.startup_s is None else {**self.phases, "first_round": self.startup_s}
        if phases:
            extra["startup_phases_s"] = {k: round(v, 3) for k, v in phases.items()}
        return extra

    def _initial_state(self) -> tuple[ServerState, dict[str, Any], dict[ClientId, int]]:
        path = checkpoint.latest(self.run_dir) if self.resume else None
        if path is not None:
            return checkpoint.load(path)
        return self.p.strategy.init_state(self.p.init_params), {}, {}  # new, or killed before round 1

    def _write_partition(self) -> None:
        stats = self.p.split.stats(self.p.dataset)
        (self.run_dir / "partition.json").write_text(json.dumps(stats) + "\n")
        save_partition_plot(stats, self.run_dir / "partition.png", partition_cache_dir(self.cfg.data))

    def context(self, rnd: int) -> ServerContext:
        """What round `rnd`'s server step may use besides the state and the updates."""
        spec = self.p.spec

        def build_model() -> torch.nn.Module:
            return build_client_model(
                spec.model, 0, spec.num_classes, spec.in_channels, spec.image_size, **spec.model_kwargs
            )

        device, rng = driver_device(str(self.cfg.eval.device)), server_rng(self.cfg.seed, rnd)
        return ServerContext(
            rnd,
            device,
            rng,
            self.p.strategy.task,
            build_model,
            unlabeled=self._unlabeled,
            seed=int(self.cfg.seed),
        )


@contextlib.contextmanager
def _in(session: Session | None) -> Iterator[Session]:
    """`session`, or a new one for this run alone."""
    if session is not None:
        yield session
        return
    with Session() as own:
        yield own


def start_run(
    cfg: RootConfig,
    console: bool = True,
    run_dir: Path | None = None,
    started_at: float | None = None,
    session: Session | None = None,
    callbacks: Sequence[Callback] = (),
) -> tuple[dict[str, Any], Path]:
    """A new run: check where it goes (`run_dir`: already checked by `lock.new_run_path`),
    prepare (fails before writing anything), then create its directory atomically and hold
    its lock (`lock.py`) while anything is written. `started_at`: the `perf_counter()` its
    start-up is measured from (default: now); `session`: the process's Ray and workers
    (default: its own); `callbacks`: more, after the run's own."""
    from .lock import RunLock, create_run_dir, new_run_path
    from .paths import run_dir_message

    t0 = time.perf_counter() if started_at is None else started_at
    if run_dir is None:
        run_dir = new_run_path(cfg)
    # fails before any file is written, also where this machine cannot hold the run
    prepared = prepare(cfg, placement=session.planned if session is not None else None)
    prepared_at = time.perf_counter()
    create_run_dir(run_dir)
    with _in(session) as s, RunLock(run_dir):
        prepared.cfg.run_id = run_dir.name
        write_config(run_dir, prepared.cfg)
        if prepared.weights_info is not None:  # its own: `resume` needs no file outside the run
            keep_weights(cfg.model["weights"], run_dir)
        if console:
            print(run_dir_message(run_dir), file=sys.stderr)
        run = Run(prepared, run_dir, s, console=console, started_at=t0, callbacks=callbacks)
        run.phases["prepared"] = prepared_at - t0  # config, imports, data and model
        return run.execute(), run_dir


def write_config(run_dir: Path, cfg: RootConfig) -> None:
    """`<run_dir>/config.yaml`, replaced whole (a reader never sees half of it)."""
    tmp = run_dir / ".config.yaml.tmp"
    with open_new(tmp) as f:  # not through a link planted under this name
        f.write(to_yaml(cfg).encode())
    tmp.replace(run_dir / "config.yaml")


def finished_message(run_dir: Path, rounds_done: int) -> str:
    return (
        f"fl-lightning: run {run_dir} is already finished ({rounds_done} rounds); nothing to do "
        f"(more rounds: fl-lightning resume {run_dir} fl.rounds=N)"
    )


def _last_line_round(run_dir: Path) -> int:
    """The round of metrics.jsonl's last whole line (0 if none)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return int(json.loads(lines[-1])["round"]) if lines else 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _summary_of(run_dir: Path) -> dict[str, Any]:
    """A run directory's summary.json, {} where it is missing or unreadable."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _draw_missing_curves(run_dir: Path, summary: dict[str, Any]) -> None:
    """curves.png of a completed run that has none (killed while it was drawn)."""
    from ..tracking.curves import save_run_curves
    from ..tracking.loggers import RunFiles

    if (run_dir / "curves.png").exists():
        return
    try:  # a picture that cannot be drawn costs a warning, as at the run's end
        save_run_curves(RunFiles(run_dir).records(), summary, run_dir / "curves.png")
    except Exception as e:
        log.warning("curves.png not written: %s: %s", type(e).__name__, e)


def resume_run(
    run_dir: Path, cfg: RootConfig, console: bool = True, session: Session | None = None
) -> dict[str, Any]:
    """Continue a run from its newest intact checkpoint (`checkpoint.recover`), holding the run
    directory's lock from before anything is read or written. A finished run returns at once,
    with one line on stderr, before any data is loaded or Ray started."""
    from ..config import method_modules
    from ..methods import METHODS, import_methods
    from .lock import RunLock

    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    with _in(session) as s, RunLock(run_dir):
        # the run's own modules (`methods=`, given again on resume) first: their methods'
        # state classes are what its checkpoints may rebuild, and `recover` reads them
        import_methods(method_modules(cfg.methods))
        METHODS.get(cfg.method.name)  # its strategy: declares the state classes checkpoints rebuild
        done = checkpoint.recover(run_dir)  # newer broken checkpoints are set aside, with a warning
        if done >= int(cfg.fl.rounds) and _last_line_round(run_dir) >= done:
            summary = _summary_of(run_dir)
            # a run stopped after its last line but before it was whole (a signal then: S-5,
            # summary.json `interrupted`) is ended below: no round runs, its summary and
            # picture are made as at any run's end
            if summary.get("status") == "completed":
                _draw_missing_curves(run_dir, summary)
                print(finished_message(run_dir, done), file=sys.stderr)
                return summary
        trunk = kept_weights(run_dir, str(cfg.model["weights"])) if cfg.model.get("weights") else None
        prepared = prepare(cfg, trunk, first_round=done + 1)  # a slow run announces what is left
        return Run(prepared, run_dir, s, resume=True, console=console, started_at=t0).execute()
