"""Evaluation on the driver (`GlobalEval`) and on the clients' own test splits (`ClientEval`),
every `eval.every` rounds and at the last."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...core.centralized import torch_threads
from ...core.files import open_new
from ...core.messages import ClientUpdate, RoundPlan, ServerState
from ...core.objective import evaluate
from ...core.types import ClientId
from ..build import Prepared
from ..executor import Executor
from ..record import RoundRecord, client_metrics, majority_accuracies
from .base import Callback, RunContext, WallClock

#: a global evaluation's metrics, its own duration and when it ended (perf_counter)
EvalResult = tuple[dict[str, float], float, float]


def evaluation_round(rnd: int, every: int, last_round: int) -> bool:
    return rnd % every == 0 or rnd == last_round


def driver_device(device: str) -> torch.device:
    """`eval.device`: where the driver evaluates and runs server steps (auto: CUDA if any)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


#: Intra-op threads of every global evaluation (rule 3 of `GlobalEval`)
EVAL_THREADS = 1


def in_line(job: Callable[[], EvalResult]) -> EvalResult:
    """`job` on this thread, at the evaluation thread's intra-op count (the same numbers)."""
    with torch_threads(EVAL_THREADS):
        return job()


class GlobalEval(Callback):
    """The global model (`strategy.eval_broadcast`) on the test set, in the driver.

    With `eval.overlap`, round r's evaluation runs on a thread of its own while round r + 1's
    clients train; round r's line waits for it and is written once it ends (`settle`, at
    round r + 1's `on_fit_end`); the last round waits for its own. Its numbers equal those of
    an evaluation in line because of two rules, which the code below keeps:

    1. Settle before the next evaluation is prepared. There is one driver objective; `job`
       loads the round's weights into it, so round r + 1's `on_evaluate` must not run while
       round r's evaluation reads it. `on_fit_end` (settle) precedes `on_evaluate` in every
       round, and the weights are a deep copy, so nothing the next round does changes them.
    2. The evaluation thread never touches torch's process-wide state: not the global RNG
       (the serial executor seeds it before each client's fit, at the same time). `evaluate`
       is a forward pass in eval mode under `no_grad`: no dropout, no sampling, no seeding.
    3. Every evaluation runs on one intra-op thread (`EVAL_THREADS`), in line or on the thread.
       A new thread takes the intra-op count that any thread set last (`torch_threads` sets one
       around each fit), and with more than one, ops running beside a fit may split their
       reductions otherwise: measured, the same evaluation differed in its last digits with
       the timing of the fit beside it. The count is per thread: the fit's is untouched.
    """

    def __init__(self, p: Prepared, run_dir: Path) -> None:
        ev = p.cfg.eval
        self.p, self.run_dir = p, run_dir
        self.every, self.last_round = int(ev.every), int(p.cfg.fl.rounds)
        self.batch_size, self.save_predictions = int(ev.batch_size), bool(ev.save_predictions)
        self.device = driver_device(str(ev.device))
        self.test = p.dataset.tensors(p.dataset.test_x, p.dataset.test_y)
        self.pool = (
            ThreadPoolExecutor(
                1, thread_name_prefix="fl-eval", initializer=torch.set_num_threads, initargs=(EVAL_THREADS,)
            )
            if ev.overlap
            else None
        )
        self.pending: tuple[RoundRecord, Future[EvalResult]] | None = None
        self.clock = WallClock()
        self.write_line: Callable[[RoundRecord], None] = lambda record: None

    def on_run_start(self, ctx: RunContext) -> None:
        self.clock, self.write_line = ctx.clock, ctx.write_line

    def job(self, state: ServerState) -> Callable[[], EvalResult] | None:
        """The global evaluation of `state`, ready to run: the driver's objective takes a copy
        of the round's weights here, so the job may run on the evaluation thread while the
        next round trains and aggregates."""
        broadcast = self.p.strategy.eval_broadcast(state)
        if broadcast is None:
            return None
        obj = self.p.objective.to(self.device)
        obj.client_state = {}
        obj.begin_round(copy.deepcopy(broadcast), None)  # nothing the next round changes in place
        keep = self.save_predictions and state.round == self.last_round
        rnd = state.round

        def job() -> EvalResult:
            t = time.perf_counter()
            scores: list[torch.Tensor] | None = [] if keep else None
            out = evaluate(
                obj, *self.test, spec=self.p.eval_spec, batch_size=self.batch_size, scores_out=scores
            )
            if scores:
                self._save_predictions(torch.cat(scores), rnd)
            end = time.perf_counter()
            return out, end - t, end

        return job

    def evaluate_now(self, state: ServerState) -> dict[str, float]:
        job = self.job(state)
        return in_line(job)[0] if job is not None else {}

    def on_fit_end(self, rnd: int) -> None:
        self.settle()  # rule 1: before this round's `on_evaluate`

    def on_evaluate(self, state: ServerState, updates: Sequence[ClientUpdate], record: RoundRecord) -> None:
        if not evaluation_round(record.round, self.every, self.last_round):
            return
        job = self.job(state)
        if job is None:
            return
        if self.pool is not None and record.round < self.last_round:  # the last round waits for its own
            record.awaiting_evaluation = True
            self.pending = (record, self.pool.submit(job))
        else:
            record.evaluation = in_line(job)[0]

    def settle(self) -> None:
        """Wait for the overlapped evaluation, if any, and write its round's line."""
        if self.pending is None:
            return
        (record, future), self.pending = self.pending, None
        metrics, eval_s, eval_end = future.result()
        record.evaluation = metrics
        assert record.time_eval_s is not None
        record.time_eval_s += eval_s
        record.wall_time_s = self.clock.wall(max(record.done, eval_end))
        record.awaiting_evaluation = False
        self.write_line(record)

    def on_exception(self, error: BaseException) -> None:
        with contextlib.suppress(Exception):  # the finished round before it gets its line
            self.settle()

    def on_run_end(self, status: str, summary: dict[str, Any]) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def _save_predictions(self, scores: torch.Tensor, rnd: int) -> None:
        """`eval.save_predictions`: the global model's raw scores (logits) and the targets
        on the test set, for metrics of one's own (`np.load(run_dir / "predictions.npz")`)."""
        path = self.run_dir / "predictions.npz"
        tmp = path.with_name(".predictions.tmp.npz")
        with open_new(tmp) as f:  # not through a link planted under this name
            np.savez_compressed(f, scores=scores.float().numpy(), targets=self.test[1].numpy(), round=rnd)
        tmp.replace(path)


class ClientEval(Callback):
    """`client_*` metrics: each client's model on its own test split (`eval.clients`), either
    as it trained this round (`eval.timing=trained`: measured by the participants before they
    upload) or as it would start the next round (`received`: all clients, or a fixed sample)."""

    def __init__(self, p: Prepared) -> None:
        ev = p.cfg.eval
        self.p = p
        self.enabled = bool(ev.clients and p.split.test)
        self.trained = ev.timing == "trained"
        self.every, self.last_round = int(ev.every), int(p.cfg.fl.rounds)
        self.sample, self.seed = ev.clients_sample, int(p.cfg.seed)
        self.executor: Executor | None = None
        #: each client's majority-class accuracy (`record.majority_accuracies`), single-label data
        self.majority = (
            majority_accuracies(p.dataset.train_y, p.split.train, p.split.test)
            if self.enabled and not p.dataset.multilabel
            else None
        )

    def on_run_start(self, ctx: RunContext) -> None:
        self.executor = ctx.executor

    def on_round_start(self, plan: RoundPlan) -> RoundPlan:
        if not (self.trained and evaluation_round(plan.round, self.every, self.last_round)):
            return plan
        # eval.timing=trained: the clients evaluate before they upload (this executor's or Ray's)
        return dataclasses.replace(
            plan, payloads=[dataclasses.replace(p, evaluate=True) for p in plan.payloads]
        )

    def on_evaluate(self, state: ServerState, updates: Sequence[ClientUpdate], record: RoundRecord) -> None:
        if not (self.enabled and evaluation_round(record.round, self.every, self.last_round)):
            return
        if self.trained:  # measured by the clients before they uploaded
            evals = [u.evaluation for u in updates if u.evaluation is not None]
        else:
            assert self.executor is not None
            plan = self.p.strategy.configure_evaluate(state, self.eval_clients())
            evals = sorted(self.executor.evaluate(plan), key=lambda e: e.client_id)
        if not evals:
            return
        primary = self.p.strategy.primary_metric().removeprefix("client_")
        out = client_metrics(evals, primary if primary in evals[0].metrics else next(iter(evals[0].metrics)))
        # the reference of client_accuracy: over the same clients, with the same weights
        if self.majority is not None and "accuracy" in evals[0].metrics:
            n = sum(e.num_examples for e in evals)
            ref = sum(self.majority[e.client_id] * e.num_examples for e in evals) / max(n, 1)
            out["client_majority_accuracy"] = float(ref)
        record.client_evaluation = {**out, "clients_evaluated": len(evals)}

    def sampled_clients(self) -> Sequence[ClientId] | None:
        """The fixed sample of `eval.clients_sample` (whose splits client_* averages); None
        without one."""
        return None if self.sample is None or self.trained else self.eval_clients()

    def eval_clients(self) -> Sequence[ClientId]:
        """Whose own test splits an evaluation round uses: all clients, or `eval.clients_sample`
        of them drawn once from the seed (its own stream: the training draws are untouched)."""
        n, k = self.p.split.num_clients, self.sample
        if k is None or k >= n:
            return range(n)
        rng = np.random.default_rng([self.seed, 0xE7A1])
        return [int(c) for c in np.sort(rng.choice(n, size=int(k), replace=False))]
