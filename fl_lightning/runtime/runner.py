"""Running a built run (the round loop, Flower's `Strategy.start` analogue), in data:

    plan    = strategy.configure_round(state, rnd, rng)       # sample, broadcast, payloads
    updates = executor.fit(plan)                                # clients, completion order
    state   = strategy.aggregate(state, sorted(updates))        # then server_update(ctx)
    metrics = evaluate(state)                                   # global and/or per client
    metrics.jsonl, checkpoint (server state + the clients' resident state), loggers

All randomness is derived from (seed, round, client), and state is only `ServerState`
plus each client's resident state, so a run resumed from any checkpoint repeats exactly
what the uninterrupted run would do. `build.py` builds what this runs.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ..config import to_yaml
from ..core.about import about
from ..core.bn_stats import bn_stats_nbytes, pooled_bn_params
from ..core.errors import ClientFailure, DivergedError, StartupError
from ..core.files import open_new
from ..core.messages import ClientEval, ClientUpdate, RoundPlan, ServerState
from ..core.objective import evaluate
from ..core.strategy import ServerContext, round_rng, server_rng
from ..core.types import ClientId, ClientState
from ..data.stats import save_partition_plot
from ..models import build_client_model
from ..tracking.chance import chance_level, chance_note
from . import checkpoint, outcome, signals
from .build import Prepared, local_resources, prepare
from .executor import Executor, SerialExecutor
from .host import ClientHost
from .local_ray import ray_kept
from .paths import run_dir_message
from .placement import Placement, placement_for

log = logging.getLogger("fl_lightning")

__all__ = ["Prepared", "Run", "client_metrics", "prepare", "resume_run", "start_run"]

#: a global evaluation's metrics, its own duration and when it ended (perf_counter)
EvalResult = tuple[dict[str, float], float, float]


@dataclasses.dataclass
class _Pending:
    """A round done but not yet written: its line waits for its overlapped evaluation."""

    rnd: int
    record: dict[str, Any]
    future: Future[EvalResult] | None
    done: float  # perf_counter when the round's own work ended


def client_metrics(evals: Sequence[ClientEval], primary: str = "accuracy") -> dict[str, float]:
    """Personalised metrics over clients' own test splits: `client_<m>` (sample-weighted
    mean over clients) for every metric m, and for the primary one also the unweighted
    mean, std and the mean of the worst 10% of clients."""
    n = np.array([e.num_examples for e in evals], dtype=float)
    out: dict[str, float] = {}
    for key in evals[0].metrics:
        vals = np.array([e.metrics[key] for e in evals if key in e.metrics])
        if len(vals) == len(evals):
            out[f"client_{key}"] = float((vals * n).sum() / n.sum())
    acc = np.array([e.metrics[primary] for e in evals])
    worst = np.sort(acc)[: max(1, int(np.ceil(0.1 * len(acc))))]
    out.update({
        f"client_{primary}_mean": float(acc.mean()),
        f"client_{primary}_std": float(acc.std()),
        f"client_{primary}_worst10": float(worst.mean()),
    })  # fmt: skip
    return out


def weighted_client_metrics(updates: Sequence[ClientUpdate]) -> dict[str, float]:
    """Every metric the clients report, sample-weighted over the clients that report it."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for u in updates:
        for k, v in u.metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v) * u.num_examples
            weights[k] = weights.get(k, 0.0) + u.num_examples
    return {k: sums[k] / max(weights[k], 1.0) for k in sums}


def driver_memory_mb() -> dict[str, float]:
    """The driver's memory in MiB (Linux; empty elsewhere): `driver_rss_mb` (resident now),
    `driver_anon_mb` (its private heap now: what it holds itself, without the shared pages of
    Ray's object store it has read through) and `driver_peak_rss_mb` (resident at its peak)."""
    keys = {"VmRSS": "driver_rss_mb", "RssAnon": "driver_anon_mb", "VmHWM": "driver_peak_rss_mb"}
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in keys:
                    out[keys[name]] = int(rest.split()[0]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return {}
    return out


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """Strict JSON: non-finite numbers become null, named under `nonfinite`."""
    bad = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return record
    return {**{k: (None if k in bad else v) for k, v in record.items()}, "nonfinite": bad}


class Run:
    """One federated run in a run directory: start, resume, or continue."""

    def __init__(
        self,
        prepared: Prepared,
        run_dir: Path,
        resume: bool = False,
        console: bool = True,
        started_at: float | None = None,
    ) -> None:
        self.p = prepared
        #: `time.perf_counter()` when the run began (before `prepare`): start-up is measured from it
        self.started_at = time.perf_counter() if started_at is None else started_at
        self.startup_s: float | None = None
        self.actors_reused = 0
        self.actors_prestarted = 0  # created by `early.early_start` while the driver imported
        self.cfg = prepared.cfg
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.console = console
        self._test = prepared.dataset.tensors(prepared.dataset.test_x, prepared.dataset.test_y)
        sx = prepared.server_x
        self._unlabeled = None if sx is None else prepared.dataset.tensors(sx, np.zeros(len(sx)))[0]
        #: client id -> round of its newest state file in the last committed checkpoint
        self.client_index: dict[ClientId, int] = {}
        #: clients that trained since the last checkpoint (their resident state changed)
        self._dirty: set[ClientId] = set()
        self._pool: ThreadPoolExecutor | None = None

    # --- setup -------------------------------------------------------------------------
    def _initial_state(self) -> tuple[ServerState, dict[str, Any]]:
        path = checkpoint.latest(self.run_dir) if self.resume else None
        if path is not None:
            state, meta, self.client_index = checkpoint.load(path)
            return state, meta
        return self.p.strategy.init_state(self.p.init_params), {}  # new, or killed before round 1

    def _saved_states(self, client_ids: Sequence[ClientId]) -> Iterator[tuple[ClientId, ClientState]]:
        """The clients' states of the last committed checkpoint, read one at a time."""
        for c in client_ids:
            if c in self.client_index:
                yield c, checkpoint.load_client_state(self.run_dir, c, self.client_index[c])

    def _executor(self) -> tuple[Executor, Placement, bool]:
        cfg = self.cfg
        if cfg.runtime.executor == "serial":
            placement = placement_for(cfg, *local_resources(cfg))
            self.p.spec.threads = placement.threads
            self.p.spec.accelerator = placement.accelerator
            host = ClientHost(
                self.p.spec,
                self.p.dataset,
                dict(enumerate(self.p.split.train)),
                dict(enumerate(self.p.split.test)),
            )
            return SerialExecutor(host), placement, False
        from .local_ray import init_ray

        started = init_ray(cfg.runtime.address, cfg.runtime.num_cpus, cfg.runtime.num_gpus)
        import ray

        from .ray_executor import RayExecutor

        try:
            res = ray.cluster_resources()
            placement = placement_for(cfg, res.get("CPU", 1.0), res.get("GPU", 0.0))
            self.p.spec.threads = placement.threads
            self.p.spec.accelerator = placement.accelerator
            ex = RayExecutor(
                self.p.spec, self.p.dataset, self.p.split.train, self.p.split.test,
                placement, cfg.fl.max_client_failures,
                cfg.runtime.placement_strategy, cfg.runtime.schedule_timeout_s,
                restore=self._saved_states,
            )  # fmt: skip
            ex.ready()
            self.actors_reused = ex.reused
            self.actors_prestarted = ex.prestarted
        except BaseException:
            if started:
                ray.shutdown()
            raise
        return ex, placement, started

    def _record_choices(self, placement: Placement) -> None:
        """config.yaml as this run goes: the run id and the choices only now made (placement,
        accelerator, evaluation device, W&B mode; a resume's new `fl.rounds`), written in
        place of `auto`/null, W&B's config taken from the same (`load_run_config` lets a
        resume on another machine choose the machine's parts again)."""
        rt = self.cfg.runtime
        rt.placement, rt.accelerator = placement.mode, placement.accelerator
        self.cfg.eval.device = self._device().type
        self.cfg.run_id = self.run_dir.name
        if self.cfg.logger.backend == "wandb":  # online with an API key, else offline
            from ..tracking.loggers import wandb_mode

            self.cfg.logger.mode = wandb_mode(self.cfg.logger.mode)
        write_config(self.run_dir, self.cfg)

    def _loggers(self, meta: dict[str, Any]) -> list[Any]:
        from ..tracking.loggers import WandbLogger

        lc = self.cfg.logger
        if lc.backend != "wandb" or lc.mode == "disabled":
            return []
        tree = OmegaConf.to_container(self.cfg, resolve=True)
        assert isinstance(tree, dict)
        config = {str(k): v for k, v in tree.items()}
        config["strategy"] = self.p.strategy.summary()
        config["partition"] = {"train_sizes": [int(len(t)) for t in self.p.split.train]}
        method, data = self.cfg.method.name, self.cfg.data
        paper = about(type(self.p.strategy), method).tag()  # paper:arXiv:<id>, where it has one
        tags = [method, data.name, f"seed:{self.cfg.seed}", *([paper] if paper else []), *lc.tags]
        if data.get("partition"):
            tags.insert(2, f"partition:{data.partition}")
        wb = WandbLogger(
            self.run_dir, self.run_dir.name, lc.project, lc.entity, lc.group or self.cfg.experiment,
            tags, lc.mode, config, meta.get("wandb_id"), name=f"{method}-s{self.cfg.seed}", job_type=method,
        )  # fmt: skip
        if not meta.get("wandb_id"):  # once per W&B run (a resumed run has it already)
            wb.log_partition(self.run_dir / "partition.json", self.run_dir / "partition.png")
        return [wb]

    # --- evaluation ----------------------------------------------------------------------
    def _device(self) -> torch.device:
        device = self.cfg.eval.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.device(device)

    def _global_eval(self, state: ServerState) -> Callable[[], EvalResult] | None:
        """The global evaluation of `state`, ready to run: the driver's objective takes a copy
        of the round's weights here, so the returned job may run on the evaluation thread
        while the next round trains and aggregates (`eval.overlap`)."""
        broadcast = self.p.strategy.eval_broadcast(state)
        if broadcast is None:
            return None
        obj = self.p.objective.to(self._device())
        obj.client_state = {}
        obj.begin_round(copy.deepcopy(broadcast), None)  # nothing the next round changes in place
        keep = self.cfg.eval.save_predictions and state.round == self.cfg.fl.rounds
        rnd, batch = state.round, self.cfg.eval.batch_size

        def job() -> EvalResult:
            t = time.perf_counter()
            scores: list[torch.Tensor] | None = [] if keep else None
            out = evaluate(obj, *self._test, spec=self.p.eval_spec, batch_size=batch, scores_out=scores)
            if scores:
                self._save_predictions(torch.cat(scores), rnd)
            end = time.perf_counter()
            return out, end - t, end

        return job

    def _save_predictions(self, scores: torch.Tensor, rnd: int) -> None:
        """`eval.save_predictions`: the global model's raw scores (logits) and the targets
        on the test set, for metrics of one's own (`np.load(run_dir / "predictions.npz")`)."""
        import numpy as np

        path = self.run_dir / "predictions.npz"
        tmp = path.with_name(".predictions.tmp.npz")
        with open_new(tmp) as f:  # not through a link planted under this name
            np.savez_compressed(f, scores=scores.float().numpy(), targets=self._test[1].numpy(), round=rnd)
        tmp.replace(path)

    def _client_eval(
        self, executor: Executor, state: ServerState, updates: Sequence[ClientUpdate]
    ) -> dict[str, float]:
        if not (self.cfg.eval.clients and self.p.split.test):
            return {}
        if self.cfg.eval.timing == "trained":  # measured by the clients before they uploaded
            evals = [u.evaluation for u in updates if u.evaluation is not None]
        else:
            plan = self.p.strategy.configure_evaluate(state, self._eval_clients())
            evals = sorted(executor.evaluate(plan), key=lambda e: e.client_id)
        if not evals:
            return {}
        primary = self.p.strategy.primary_metric().removeprefix("client_")
        out = client_metrics(evals, primary if primary in evals[0].metrics else next(iter(evals[0].metrics)))
        return {**out, "clients_evaluated": len(evals)}

    def _eval_clients(self) -> Sequence[ClientId]:
        """Whose own test splits an evaluation round uses: all clients, or `eval.clients_sample`
        of them drawn once from the seed (its own stream: the training draws are untouched)."""
        n, k = self.p.split.num_clients, self.cfg.eval.clients_sample
        if k is None or k >= n:
            return range(n)
        rng = np.random.default_rng([int(self.cfg.seed), 0xE7A1])
        return [int(c) for c in np.sort(rng.choice(n, size=int(k), replace=False))]

    def _context(self, rnd: int) -> ServerContext:
        spec = self.p.spec

        def build_model() -> torch.nn.Module:
            return build_client_model(
                spec.model, 0, spec.num_classes, spec.in_channels, spec.image_size, **spec.model_kwargs
            )

        return ServerContext(
            rnd, self._device(), server_rng(self.cfg.seed, rnd), self.p.strategy.task, build_model,
            unlabeled=self._unlabeled,
        )  # fmt: skip

    # --- checkpoints ----------------------------------------------------------------------
    def _checkpoint(self, executor: Executor, state: ServerState, meta: dict[str, Any]) -> None:
        # held: a Ctrl-C mid-write raises after it, so the run ends `interrupted`, not crashed
        with signals.held():
            if self._dirty:
                written = checkpoint.save_client_states(
                    self.run_dir, state.round, executor.collect_states(sorted(self._dirty))
                )
                self.client_index.update(written)
                self._dirty.clear()
            checkpoint.save(self.run_dir, state, meta, self.client_index)

    # --- the loop ---------------------------------------------------------------------------
    def execute(self) -> dict[str, Any]:
        from ..tracking.console import Progress, print_table
        from ..tracking.loggers import RunFiles

        cfg, strategy = self.cfg, self.p.strategy
        state, meta = self._initial_state()
        files = RunFiles(self.run_dir, keep_until_round=state.round if self.resume else None)
        prior = files.records()
        backfill = meta.get("pending_line") if not prior or prior[-1]["round"] < state.round else None
        wall_offset = float((backfill or (prior[-1] if prior else {})).get("wall_time_s", 0.0))
        stats = self.p.split.stats(self.p.dataset)
        (self.run_dir / "partition.json").write_text(json.dumps(stats) + "\n")
        save_partition_plot(stats, self.run_dir / "partition.png")
        for w in strategy.warnings():
            log.warning(w)
        try:
            executor, placement, started_ray = self._executor()
        except StartupError as e:  # Ray did not start: summary.json says why, as for any failed run
            failed = self._summary(files.records(), None, "failed", outcome.reason(e))
            outcome.write_summary(files, failed, failing=True)
            raise
        self._record_choices(placement)
        loggers: list[Any] = []
        status = "failed"
        error: str | None = None  # why it stopped (summary.json `error`)
        progress = Progress(
            cfg.fl.rounds, initial=state.round, enabled=self.console, metric=strategy.primary_metric()
        )
        # eval.overlap: round r's global evaluation runs here while round r + 1 trains
        pool = ThreadPoolExecutor(1, thread_name_prefix="fl-eval") if cfg.eval.overlap else None
        self._pool = pool
        pending: _Pending | None = None
        try:
            if self.client_index:  # resume: the clients' state goes back to their hosts
                executor.restore_states(self._saved_states(sorted(self.client_index)))
            loggers = self._loggers(meta)
            meta = {"wandb_id": loggers[0].id} if loggers else {}
            if backfill is not None:  # killed after the checkpoint, before its evaluation ended
                job = self._global_eval(state)
                line = {**backfill, **(job()[0] if job else {})}
                files.log_round(state.round, _finite(line))
                for lg in loggers:
                    lg.log_round(state.round, line)
            start = time.perf_counter()
            self.startup_s = start - self.started_at

            def finish(p: _Pending, checkpoint_first: dict[str, Any] | None = None) -> None:
                """Round `p.rnd`'s line, its checkpoint if `checkpoint_first` (the meta) is given,
                then its loggers and progress (a run killed in between repeats the round and
                logs it to W&B once)."""
                files.log_round(p.rnd, _finite(p.record))
                if checkpoint_first is not None:
                    self._checkpoint(executor, state, checkpoint_first)
                for lg in loggers:
                    lg.log_round(p.rnd, p.record)
                progress.update(p.rnd, p.record)

            def settle() -> None:
                """Wait for the previous round's overlapped evaluation and finish that round."""
                nonlocal pending
                if pending is None or pending.future is None:
                    return
                p, pending = pending, None
                assert p.future is not None
                metrics, eval_s, eval_end = p.future.result()
                p.record.update(metrics)
                p.record["time_eval_s"] += eval_s
                p.record["wall_time_s"] = wall_offset + max(p.done, eval_end) - start
                finish(p)

            for rnd in range(state.round + 1, cfg.fl.rounds + 1):
                try:
                    state, record, future = self._round(executor, state, rnd, settle)
                except DivergedError as e:
                    status = "diverged"
                    files.log_round(
                        rnd, _finite({**e.record, "wall_time_s": wall_offset + time.perf_counter() - start})
                    )
                    raise
                done = time.perf_counter()
                record["wall_time_s"] = wall_offset + done - start
                due = rnd % cfg.checkpoint.every == 0 or rnd == cfg.fl.rounds
                if future is None:
                    finish(_Pending(rnd, record, None, done), meta if due else None)
                    continue
                if due:  # before the line, which waits for the evaluation: the checkpoint carries
                    # the line without it, and a resume evaluates the same state again (backfill above)
                    self._checkpoint(executor, state, {**meta, "pending_line": record})
                pending = _Pending(rnd, record, future, done)
            settle()
            status = "completed"
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                status = "interrupted"  # a partial run: `resume` continues it
            error = outcome.reason(e)
            with contextlib.suppress(Exception):  # the finished round before it gets its line
                settle()
            raise
        finally:
            # summary.json first: a second Ctrl-C during the teardown below (Ray's shutdown
            # takes seconds) must not leave the run without one
            summary = self._summary(files.records(), placement, status, error)
            outcome.write_summary(files, summary, failing=error is not None)
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            progress.close()
            executor.close(reuse=status == "completed")
            if started_ray and not ray_kept():
                import ray

                ray.shutdown()
            for lg in loggers:
                lg.log_summary(summary)
                lg.close(status == "completed")
            self._save_curves(files.records(), summary)
        if self.console:
            print_table(files.records(), summary, self.run_dir)
        return summary

    def _save_curves(self, records: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        """`curves.png`; a picture that cannot be drawn costs a warning, never the run (or, on
        the way out of a failed run, its error)."""
        from ..tracking.curves import save_run_curves

        if not self.run_dir.is_dir():  # removed mid-run: not made again for a picture
            return
        try:
            save_run_curves(records, summary, self.run_dir / "curves.png")
        except Exception as e:
            log.warning("curves.png not written: %s: %s", type(e).__name__, e)

    def _round(
        self, executor: Executor, state: ServerState, rnd: int, settle: Callable[[], None] = lambda: None
    ) -> tuple[ServerState, dict[str, Any], Future[EvalResult] | None]:
        """One round. `settle` finishes the previous round once this one's clients have
        trained. Returns the future of this round's overlapped global evaluation, if any."""
        strategy = self.p.strategy
        t0 = time.perf_counter()
        plan = strategy.configure_round(state, rnd, round_rng(self.cfg.seed, rnd))
        evaluating = rnd % self.cfg.eval.every == 0 or rnd == self.cfg.fl.rounds
        if evaluating and self.cfg.eval.timing == "trained":  # clients evaluate before they upload
            plan = dataclasses.replace(
                plan, payloads=[dataclasses.replace(p, evaluate=True) for p in plan.payloads]
            )
        failed_before, retried_before = len(executor.failures), len(executor.retries)
        updates = sorted(executor.fit(plan), key=lambda u: u.client_id)
        tf = time.perf_counter()
        settle()
        failures = executor.failures[failed_before:]
        retries = executor.retries[retried_before:]
        if not updates:
            causes = "; ".join(f.split(": ", 1)[1] for f in failures) or "no update returned"
            raise ClientFailure(f"round {rnd}: every client failed ({causes})")
        self._dirty.update(u.client_id for u in updates)
        t1 = time.perf_counter()
        client = weighted_client_metrics(updates)
        record: dict[str, Any] = {
            "train_loss": client.get("train_loss", 0.0),
            "clients": len(updates),
            "clients_failed": len(plan.payloads) - len(updates),
            "clients_retried": len(retries),
        }
        if failures or retries:
            record["client_failures"] = failures + [f"retried {r}" for r in retries]
        record.update({f"client/{k}": v for k, v in client.items()})
        diverged = sorted(u.client_id for u in updates if not math.isfinite(u.metrics.get("train_loss", 0.0)))
        if diverged:
            raise DivergedError(
                f"round {rnd}: non-finite training loss on client(s) {', '.join(map(str, diverged[:10]))}",
                {"round": rnd, **record},
            )
        state = strategy.aggregate(state, updates)
        state, server = strategy.server_update(state, updates, self._context(rnd))
        state = dataclasses.replace(state, round=rnd)
        if state.global_params is not None and not all(
            bool(torch.isfinite(v).all()) for v in state.global_params.values() if v.is_floating_point()
        ):
            raise DivergedError(
                f"round {rnd}: the aggregated global model has non-finite weights", {"round": rnd, **record}
            )
        record.update({f"server/{k}": v for k, v in server.items()})
        bn_up = bn_down = 0
        if self.cfg.fl.bn_stats == "recompute" and state.global_params is not None:
            state, bn_up, bn_down = self._recompute_bn(executor, state, plan, updates)
        t2 = time.perf_counter()
        future: Future[EvalResult] | None = None
        job = self._global_eval(state) if evaluating else None
        if job is not None and self._pool is not None and rnd < self.cfg.fl.rounds:
            future = self._pool.submit(job)  # the last round waits for its evaluation
        elif job is not None:
            record.update(job()[0])
        if evaluating:
            record.update(self._client_eval(executor, state, updates))
        t3 = time.perf_counter()
        record.update(
            bytes_down=plan.broadcast.nbytes() * len(plan.payloads) + bn_down,
            bytes_up=sum(u.upload_nbytes() for u in updates) + bn_up,
            time_fit_s=tf - t0,
            time_eval_wait_s=t1 - tf,  # the previous round's overlapped evaluation, if it was not done
            time_server_s=t2 - t1,
            time_eval_s=t3 - t2,  # an overlapped global evaluation adds its own time when it ends
            round_time_s=t3 - t0,
        )
        record.update(driver_memory_mb())
        return state, record, future

    def _recompute_bn(
        self, executor: Executor, state: ServerState, plan: RoundPlan, updates: Sequence[ClientUpdate]
    ) -> tuple[ServerState, int, int]:
        """`fl.bn_stats=recompute`: the clients that trained this round measure their data
        under the new global weights; the server pools the sums (core/bn_stats.py)."""
        assert state.global_params is not None
        if not any(k.endswith("running_mean") for k in state.global_params):
            return state, 0, 0
        trained = {u.client_id for u in updates}
        bplan = RoundPlan(
            plan.round,
            self.p.strategy.broadcast(state, plan.round),
            [p for p in plan.payloads if p.client_id in trained],
        )
        stats = sorted(executor.bn_stats(bplan), key=lambda s: s.client_id)
        params = pooled_bn_params(stats, state.global_params)
        up = sum(bn_stats_nbytes(s) for s in stats)
        return dataclasses.replace(state, global_params=params), up, bplan.broadcast.nbytes() * len(stats)

    def _summary(
        self,
        records: list[dict[str, Any]],
        placement: Placement | None,
        status: str = "completed",
        error: str | None = None,
    ) -> dict[str, Any]:
        primary = self.p.strategy.primary_metric()
        evald = [r for r in records if r.get(primary) is not None and not r.get("diverged")]
        out: dict[str, Any] = {
            "method": self.cfg.method.name,
            "dataset": self.cfg.data.name,
            "model": self.cfg.model.name,
            "seed": int(self.cfg.seed),
            "experiment": self.cfg.experiment,
            "run_id": self.run_dir.name,
            "status": status,
            "executor": self.cfg.runtime.executor,
            "num_clients": int(self.cfg.fl.num_clients),
            "rounds": int(self.cfg.fl.rounds),
            "rounds_completed": max((int(r["round"]) for r in records if not r.get("diverged")), default=0),
            "primary_metric": primary,
            f"final_{primary}": None,
            f"best_{primary}": None,
            "best_round": None,
            "wall_time_s": float(records[-1]["wall_time_s"]) if records else 0.0,
            "bytes_up_total": int(sum(r.get("bytes_up", 0) for r in records)),
            "bytes_down_total": int(sum(r.get("bytes_down", 0) for r in records)),
            "clients_failed_total": int(sum(r.get("clients_failed", 0) for r in records)),
            "driver_peak_rss_mb": driver_memory_mb().get("driver_peak_rss_mb"),
            "driver_anon_max_mb": max((r.get("driver_anon_mb", 0.0) for r in records), default=None),
            "num_actors": placement.num_actors if placement else 0,  # None: Ray did not start
            "actors_reused": self.actors_reused,  # warm workers of a sweep's previous run
            "actors_prestarted": self.actors_prestarted,  # started while the driver imported
            "startup_s": None if self.startup_s is None else round(self.startup_s, 3),
            "threads_per_client": placement.threads if placement else None,
        }
        out.update(self.p.strategy.run_summary())
        if self.p.weights_info is not None:  # the pretrained trunk the run started from
            out["model_weights"] = self.p.weights_info
        if self.cfg.eval.clients_sample is not None and self.cfg.eval.timing == "received":
            out["clients_evaluated_ids"] = list(self._eval_clients())  # whose splits client_* averages
        single_label = primary in ("accuracy", "client_accuracy")
        if single_label:  # the keys every earlier result and tool reads
            out.update(accuracy_metric=primary, final_accuracy=None, best_accuracy=None)
        if evald:
            best = max(evald, key=lambda r: r[primary])
            out.update(
                {
                    f"final_{primary}": evald[-1][primary],
                    f"best_{primary}": best[primary],
                    "best_round": best["round"],
                }
            )
            if single_label:
                out.update(final_accuracy=evald[-1][primary], best_accuracy=best[primary])
            for k, v in evald[-1].items():
                if (
                    (k.startswith("client_") or k.startswith(("many_", "medium_", "few_")))
                    and k != primary
                    and isinstance(v, float)
                ):
                    out[f"final_{k}"] = v
        if error is not None:
            out["error"] = error
        elif status == "completed":  # learned nothing, yet nothing diverged: say so
            level = chance_level(np.asarray(self._test[1]), self.p.strategy.task.multilabel)
            out.update(chance_note(records, level))
        return out


@contextlib.contextmanager
def shared_ray() -> Iterator[None]:
    """For several `start_run`s in a row (a sequential sweep): Ray is started once and the
    client workers of a finished run are set up again for the next (`reuse_actors`)."""
    from .local_ray import keep_ray
    from .ray_executor import reuse_actors

    with keep_ray(), reuse_actors():
        yield


def start_run(
    cfg: DictConfig, console: bool = True, run_dir: Path | None = None, started_at: float | None = None
) -> tuple[dict[str, Any], Path]:
    """A new run: check where it goes (`run_dir`: already checked by `lock.new_run_path`),
    prepare (fails before writing anything), then create its directory atomically and hold
    its lock (`lock.py`) while anything is written. `started_at`: the `perf_counter()` its
    start-up is measured from (default: now)."""
    from .local_ray import cluster_address, stop_local_ray
    from .lock import RunLock, create_run_dir, new_run_path

    t0 = time.perf_counter() if started_at is None else started_at
    if run_dir is None:
        run_dir = new_run_path(cfg)
    prepared = prepare(cfg)
    if cfg.runtime.executor == "serial" or not cluster_address(cfg.runtime.address):
        placement_for(cfg, *local_resources(cfg))  # this machine cannot hold it: fail before any file
    create_run_dir(run_dir)
    try:
        with RunLock(run_dir):
            prepared.cfg.run_id = run_dir.name
            write_config(run_dir, prepared.cfg)
            if console:
                print(run_dir_message(run_dir), file=sys.stderr)
            return Run(prepared, run_dir, console=console, started_at=t0).execute(), run_dir
    finally:
        stop_local_ray()  # what a local Ray this run started left behind (a no-op otherwise)


def write_config(run_dir: Path, cfg: DictConfig) -> None:
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


def resume_run(run_dir: Path, cfg: DictConfig, console: bool = True) -> dict[str, Any]:
    """Continue a run from its newest intact checkpoint (`checkpoint.recover`), holding the run
    directory's lock from before anything is read or written. A finished run returns at once,
    with one line on stderr, before any data is loaded or Ray started."""
    from ..config import method_modules
    from ..methods import import_methods
    from .local_ray import stop_local_ray
    from .lock import RunLock

    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    try:
        with RunLock(run_dir):
            # the run's own modules (`methods=`, given again on resume) first: their methods'
            # state classes are what its checkpoints may rebuild, and `recover` reads them
            import_methods(method_modules(cfg.methods))
            done = checkpoint.recover(run_dir)  # newer broken checkpoints are set aside, with a warning
            if done >= int(cfg.fl.rounds) and _last_line_round(run_dir) >= done:
                print(finished_message(run_dir, done), file=sys.stderr)
                try:
                    summary = json.loads((run_dir / "summary.json").read_text())
                except (OSError, ValueError):
                    summary = {}
                return summary if isinstance(summary, dict) else {}
            prepared = prepare(cfg)
            return Run(prepared, run_dir, resume=True, console=console, started_at=t0).execute()
    finally:
        stop_local_ray()
