"""Evaluation on the driver (`GlobalEval`) and on the clients' own test splits (`ClientEval`),
every `eval.every` rounds and at the last."""

from __future__ import annotations

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
from ...core.metrics import domain_accuracy
from ...core.objective import Rows, evaluate
from ...core.types import ClientId
from ...data.registry import DATASETS
from ..build import Prepared
from ..executor import Executor
from ..host import encode_batches, frozen_tower
from ..record import RoundRecord, client_metrics, majority_accuracies
from .clock import WallClock

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


class Line:
    """A round's line: complete (`waits` false), or waiting for its global evaluation, which
    runs on the evaluation thread beside the next round's fit. `take` completes it (waiting
    for the evaluation first) and gives it once: a line is written once, whatever fails."""

    def __init__(
        self,
        record: RoundRecord,
        evaluation: Future[EvalResult] | None = None,
        clock: WallClock | None = None,
    ) -> None:
        self.record, self.evaluation, self.clock = record, evaluation, clock
        self.waits = evaluation is not None
        self._taken = False

    def take(self) -> RoundRecord | None:
        if self._taken:
            return None
        self._taken = True
        if self.evaluation is not None:
            assert self.clock is not None and self.record.time_eval_s is not None
            metrics, eval_s, eval_end = self.evaluation.result()
            self.record.evaluation = metrics
            self.record.time_eval_s += eval_s
            self.record.wall_time_s = self.clock.wall(max(self.record.done, eval_end))
        return self.record


class GlobalEval:
    """The global model (`strategy.eval_broadcast`) on the test set, in the driver, every
    `eval.every` rounds and at the last.

    `start` evaluates round r in line, or (`eval.overlap`, not the last round) submits it to
    a thread of its own and returns at once: round r's `Line` then waits for it, and
    `run_rounds` takes that line after round r + 1's fit. Its numbers equal those of an
    evaluation in line because of three rules:

    1. Round r's evaluation ends before round r + 1's is prepared. There is one driver
       objective; `start` loads the round's weights into it. `run_rounds` takes round r's line
       before round r + 1 evaluates, and `start` refuses to run while the previous evaluation
       does; the weights are a deep copy, so nothing the next round does changes them.
    2. The evaluation thread never touches torch's process-wide state: not the global RNG
       (the serial executor seeds it before each client's fit, at the same time). `evaluate`
       is a forward pass in eval mode under `no_grad`: no dropout, no sampling, no seeding.
    3. Every evaluation runs on one intra-op thread (`EVAL_THREADS`), in line or on the thread.
       A new thread takes the intra-op count that any thread set last (`torch_threads` sets one
       around each fit), and with more than one, ops running beside a fit may split their
       reductions otherwise: measured, the same evaluation differed in its last digits with
       the timing of the fit beside it. The count is per thread: the fit's is untouched.
    """

    def __init__(self, p: Prepared, run_dir: Path, clock: WallClock) -> None:
        ev = p.cfg.eval
        self.p, self.run_dir, self.clock = p, run_dir, clock
        self.every, self.last_round = int(ev.every), int(p.cfg.fl.rounds)
        self.batch_size, self.save_predictions = int(ev.batch_size), bool(ev.save_predictions)
        self.device = driver_device(str(ev.device))
        # the test images as stored (uint8), normalised a batch at a time as they are scored:
        # a float copy of the whole set is 4x the images (~45 GB for data=coop_multi at 224 px)
        self.test = p.dataset.stored(p.dataset.test_x, p.dataset.test_y)
        self.test_features: torch.Tensor | None = None  # a frozen image tower's, once (`_inputs`)
        #: the dataset's own metrics from the test scores (`DatasetEntry.extra_metrics`: the
        #: themed mosaics' AP on blanked labels); None: none
        self.extra_metrics = DATASETS.get(p.cfg.data.name).extra_metrics
        #: each test image's domain (feature skew, single-label), for the per-domain accuracies
        #: and their mean (`core.metrics.domain_accuracy`); None: no domains
        doms = p.dataset.test_domains
        by_domain = doms is not None and len(doms) == len(p.dataset.test_y) and not p.dataset.multilabel
        self.domains = torch.from_numpy(np.asarray(doms, dtype=np.int64)) if by_domain else None
        self.pool = (
            ThreadPoolExecutor(
                1, thread_name_prefix="fl-eval", initializer=torch.set_num_threads, initargs=(EVAL_THREADS,)
            )
            if ev.overlap
            else None
        )
        self.running: Future[EvalResult] | None = None  # the evaluation on the thread (rule 1)

    def job(self, state: ServerState) -> Callable[[], EvalResult] | None:
        """The global evaluation of `state`, ready to run: the driver's objective takes a copy
        of the round's weights here, so the job may run on the evaluation thread while the
        next round trains and aggregates."""
        if self.running is not None and not self.running.done():
            raise RuntimeError("a global evaluation was prepared while the previous one ran (rule 1)")
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
            wanted = keep or self.extra_metrics is not None or self.domains is not None
            scores: list[torch.Tensor] | None = [] if wanted else None
            out = evaluate(
                obj,
                self._inputs(obj),
                self.test[1],
                spec=self.p.eval_spec,
                batch_size=self.batch_size,
                scores_out=scores,
            )
            every = torch.cat(scores) if scores else None  # the main head's, in test-set order
            if every is not None and self.extra_metrics is not None:  # the dataset's own
                out.update(self.extra_metrics(self.p.dataset, every, self.test[1]))
            if every is not None and self.domains is not None:
                out.update(domain_accuracy(every, self.test[1], self.domains, self.p.dataset.domain_names))
            if every is not None and keep:
                self._save_predictions(every, rnd)
            end = time.perf_counter()
            return out, end - t, end

        return job

    def _inputs(self, obj: Any) -> Rows:
        """The test images, or, for a model with a frozen image tower (`frozen_image_features`:
        the CLIP prompt learner, which takes its own features as input), their pooled features,
        computed at the first evaluation, a batch at a time on the device (`encode_batches`),
        and kept: each later evaluation runs the text side only, as the clients' own test
        splits do (`ClientHost._frozen_features`). Patch tokens (`image_tokens`: ~200x the
        pooled size) are computed each time instead."""
        tower = frozen_tower(obj.model)
        if tower is None or getattr(tower, "image_tokens", False):
            return self.test[0]
        if self.test_features is None:
            with torch.no_grad():
                self.test_features = encode_batches(tower, self.test[0], self.device)
        return self.test_features

    def now(self, state: ServerState) -> dict[str, float]:
        """The evaluation of `state`, in line (a resume's line whose evaluation never ended)."""
        job = self.job(state)
        return in_line(job)[0] if job is not None else {}

    def start(self, state: ServerState, record: RoundRecord, overlap: bool) -> Line:
        """Round `record.round`'s line: evaluated here, or (`overlap` and `eval.overlap`) waiting
        for its evaluation on the thread."""
        if not evaluation_round(record.round, self.every, self.last_round):
            return Line(record)
        job = self.job(state)
        if job is None:
            return Line(record)
        if self.pool is not None and overlap:
            self.running = self.pool.submit(job)
            return Line(record, self.running, self.clock)
        record.evaluation = in_line(job)[0]
        return Line(record)

    def close(self) -> None:
        """Stop the evaluation thread (after summary.json: it may wait for an evaluation).
        Called again on the way out whatever happened (a second call does nothing)."""
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


class ClientEval:
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
        #: each client's majority-class accuracy (`record.majority_accuracies`), single-label data
        self.majority = (
            majority_accuracies(p.dataset.train_y, p.split.train, p.split.test)
            if self.enabled and not p.dataset.multilabel
            else None
        )

    def before_upload(self, plan: RoundPlan) -> RoundPlan:
        """`plan` with, on an evaluation round of `eval.timing=trained`, every payload asking its
        client to evaluate before it uploads (in whichever executor it trains)."""
        if not (self.trained and evaluation_round(plan.round, self.every, self.last_round)):
            return plan
        return dataclasses.replace(
            plan, payloads=[dataclasses.replace(p, evaluate=True) for p in plan.payloads]
        )

    def evaluate(
        self, state: ServerState, updates: Sequence[ClientUpdate], record: RoundRecord, executor: Executor
    ) -> None:
        """Fill `record.client_evaluation` on an evaluation round: the updates' own (trained),
        or each evaluated client's model as it would start the next round (`received`)."""
        if not (self.enabled and evaluation_round(record.round, self.every, self.last_round)):
            return
        if self.trained:  # measured by the clients before they uploaded
            evals = [u.evaluation for u in updates if u.evaluation is not None]
        else:
            plan = self.p.strategy.configure_evaluate(state, self.eval_clients())
            evals = sorted(executor.evaluate(plan), key=lambda e: e.client_id)
        evals = [e for e in evals if e.num_examples > 0]  # a client with no test images: none
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
