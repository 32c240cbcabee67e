"""Clients on a virtual clock (`system=`): synchronous rounds with a deadline, FedBuff and FedAsync
(`runtime/scheduler.py`), FLSim's checks (its `test_async_trainer.py`, `test_fedbuff.py`): K = the
cohort with constant durations is synchronous FedAvg bit for bit; one client in flight is
sequential training; the concurrency is M; staler than `max_staleness` is dropped and counted;
a zero-weight update leaves the model unchanged; the server updates over a scripted sequence of
arrivals, written out; serial == Ray and kill -9 + resume with clients in flight."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.aggregation import Aggregator
from fl_lightning.core.errors import ConfigError
from fl_lightning.core.messages import Broadcast, ClientPayload, ClientUpdate, ServerState
from fl_lightning.core.staleness import Staleness, staleness_weight
from fl_lightning.core.strategy import ServerContext, TaskInfo, aggregate_with, aggregated, server_rng
from fl_lightning.methods import METHODS
from fl_lightning.runtime.runner import start_run
from fl_lightning.runtime.scheduler import Buffered
from fl_lightning.runtime.system import SystemModel
from fl_lightning.testing import Toy

from .conftest import small
from .run_files import assert_equal, assert_same_run, final_state, kill_after_checkpoint, records
from .wandb_files import read_finished_run


def _lines(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _trace(tmp_path: Path, durations: list[float]) -> str:
    path = tmp_path / "durations.txt"
    path.write_text("".join(f"{d}\n" for d in durations))
    return str(path)


FEDBUFF = ["system.mode=fedbuff", "system.seconds_per_example=0.001", "system.speed=tiers",
           "system.tiers=[1.0,4.0]", "system.noise=exponential"]  # fmt: skip


# --- FLSim's checks, on real runs (serial executor) ---------------------------------------


def test_fedbuff_with_k_the_cohort_and_constant_durations_is_synchronous_fedavg(tmp_path, data_root):
    """M = K = every client, each update taking 2 s: every server step buffers the whole
    cohort, all fresh, so FedBuff is FedAvg's rounds, model for model."""
    args = small(tmp_path, "runtime=serial", "fl.rounds=2", "data.train_subset=600")
    _, sync = start_run(compose([*args, "run_id=sync"]), console=False)
    buff = ["system.mode=fedbuff", "system.concurrency=4", "system.buffer=4", "system.staleness=constant",
            "system.speed=trace", f"system.trace={_trace(tmp_path, [2.0] * 4)}"]  # fmt: skip
    _, fb = start_run(compose([*args, *buff, "run_id=fedbuff"]), console=False)
    a, b = _lines(sync), _lines(fb)
    for x, y in zip(a, b, strict=True):
        for k in ("accuracy", "loss", "train_loss", "clients", "bytes_up"):
            assert x[k] == y[k], k
    assert [x["virtual_time"] for x in a] == [0.0, 0.0]  # no system model: no clock
    assert [y["virtual_time"] for y in b] == [2.0, 4.0]
    assert [y["system/staleness_max"] for y in b] == [0.0, 0.0]
    (sa, _), (sb, _) = final_state(sync), final_state(fb)
    params_a, params_b = sa["fields"]["global_params"], sb["fields"]["global_params"]
    assert params_a.keys() == params_b.keys()
    for k in params_a:
        assert torch.equal(params_a[k], params_b[k]), k


def test_one_client_in_flight_with_zero_durations_is_sequential_training(tmp_path, data_root):
    """M = K = 1, no time: each server step takes one fresh update and the model becomes it (a
    weight of s(0) = 1 on its delta), so the run is sequential training, client after client:
    its optimiser steps are epochs × clients × batches (one client's fit per server step)."""
    args = small(tmp_path, "runtime=serial", "fl.rounds=3", "data.train_subset=600", "system.mode=fedbuff",
                 "system.concurrency=1", "system.buffer=1", "checkpoint.every=1")  # fmt: skip
    _, run_dir = start_run(compose(args), console=False)
    lines = _lines(run_dir)
    assert [x["clients"] for x in lines] == [1, 1, 1]
    assert all(x["system/staleness_max"] == 0 and x["system/in_flight"] == 1 for x in lines)
    assert all(x["server/staleness/scale"] == 1.0 for x in lines)
    assert all(x["virtual_time"] == 0.0 for x in lines)


def test_mean_concurrency_is_m_and_staler_than_max_staleness_is_dropped_and_counted(
    tmp_path, data_root, monkeypatch
):
    """... and what W&B shows of it: each step's staleness histogram, the evaluation over the
    virtual clock (`time/*`, its x-axis `system/virtual_time`)."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    args = small(tmp_path, "runtime=serial", "fl.rounds=4", "data.train_subset=600", "fl.num_clients=6",
                 *FEDBUFF, "system.concurrency=4", "system.buffer=2", "system.max_staleness=1",
                 "logger=wandb", "logger.mode=offline")  # fmt: skip
    _, run_dir = start_run(compose(args), console=False)
    lines = _lines(run_dir)
    assert all(x["system/in_flight"] == 4 for x in lines)  # refilled at every arrival: M = 4 throughout
    assert all(x["system/staleness_max"] <= 1 for x in lines)  # staler ones are dropped
    dropped = [x["system/dropped_stale"] for x in lines]
    assert sum(dropped) > 0  # with 4 in flight and K = 2, some arrivals are 2 versions stale
    assert lines[-1]["system/dropped_stale_total"] == sum(dropped)
    times = [x["virtual_time"] for x in lines]
    assert times == sorted(times) and times[0] > 0
    for x in lines:  # the histogram of the kept updates' staleness: their count, mean and max
        hist = x["system/staleness_hist"]
        assert sum(hist) == x["clients"] == 2 and len(hist) == x["system/staleness_max"] + 1
        assert sum(t * n for t, n in enumerate(hist)) / sum(hist) == x["system/staleness_mean"]
    assert any(x["system/staleness_hist"][-1] and len(x["system/staleness_hist"]) == 2 for x in lines)

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    logged = read_finished_run(path)
    assert {m.glob_name: m.step_metric for m in logged["metrics"] if m.glob_name}["time/*"] == (
        "system/virtual_time"
    )
    rows = [h for h in logged["history"] if h.get("round", 0) >= 1]
    assert len(rows) == len(lines)
    for h, x in zip(rows, lines, strict=True):
        assert h["system/virtual_time"] == x["virtual_time"]
        assert h["time/accuracy"] == h["eval/accuracy"] == x["accuracy"]
        assert h["system/staleness_max"] == x["system/staleness_max"]  # the scheduler's, under system/
        assert h["system/staleness_hist/_type"] == "histogram"
        counts, bins = h["system/staleness_hist/values"], h["system/staleness_hist/bins"]
        assert counts == x["system/staleness_hist"] and bins == list(range(len(counts) + 1))
        assert not [k for k in h if k.startswith(("eval/system", "time/system"))]


def test_a_zero_weight_update_leaves_the_model_unchanged():
    """s(τ) = (1 + τ)^-a with a = ∞: zero at τ ≥ 1; the one update of the step moves nothing, bit
    for bit; at τ = 0 it moves the model to its upload."""
    base = {"w": torch.linspace(-1, 1, 12).reshape(3, 4), "n": torch.tensor(3)}
    up = {"w": torch.full((3, 4), 0.25), "n": torch.tensor(3)}
    state = ServerState(round=1, global_params=base)
    cls = METHODS.get("fedavg")
    strategy = cls(cls.config_cls(), 4, 1, 0, TaskInfo(num_classes=10),
                   aggregator=Aggregator([Staleness("polynomial", a=math.inf)]))  # fmt: skip
    update = ClientUpdate(client_id=2, num_examples=7, params=up)
    stale, _ = aggregated(aggregate_with(strategy, state, [update], _ctx(2, {2: 1})))
    assert torch.equal(stale.global_params["w"], base["w"])
    fresh, _ = aggregated(aggregate_with(strategy, state, [update], _ctx(2, {2: 0})))
    assert torch.equal(fresh.global_params["w"], up["w"])


def test_staleness_weights_are_flsims():
    assert staleness_weight("constant", 9, 0.5, 4) == 1.0
    assert staleness_weight("polynomial", 3, 0.5, 4) == 0.5  # 1/sqrt(4)
    assert staleness_weight("hinge", 4, 10, 4) == 1.0 and staleness_weight("hinge", 6, 10, 4) == 1 / 21


# --- a scripted sequence of arrivals, written out ---------------------------------------------


def _ctx(rnd: int, staleness: dict[int, int]) -> ServerContext:
    return ServerContext(rnd, torch.device("cpu"), server_rng(0, rnd), TaskInfo(num_classes=10), Toy,
                         seed=0, staleness=staleness)  # fmt: skip


#: what client c "trains" from the params w it started from: 0.5 w + b_c (its update depends on
#: where it started, so staleness shows), with n_c examples
B = {0: 1.0, 1: -2.0, 2: 4.0}
N = {0: 10, 1: 30, 2: 20}


class Scripted:
    """An executor whose clients compute `0.5 w + b_c` from the broadcast they were given: the
    scheduler's arrivals and the server's steps can then be written out by hand."""

    failures: list[str] = []
    retries: list[str] = []

    def submit(self, broadcast: Broadcast, payload: ClientPayload) -> ClientUpdate:
        c = payload.client_id
        w = broadcast.global_params["w"]
        return ClientUpdate(client_id=c, num_examples=N[c], params={"w": 0.5 * w + B[c]})

    def take(self, handle: ClientUpdate) -> ClientUpdate:
        return handle

    def collect_states(self, client_ids):  # its clients keep no state
        return iter(())


def _scripted(mode: str, steps: int, buffer: int) -> list[torch.Tensor]:
    """Three clients (durations 1, 2, 3 s), all in flight (M = 3), `steps` server steps."""
    cls = METHODS.get("fedavg")
    stale = Staleness("polynomial", a=0.5, mix=0.6 if mode == "fedasync" else 1.0)
    strategy = cls(cls.config_cls(), 3, 3, 0, TaskInfo(num_classes=10), aggregator=Aggregator([stale]))
    system = SystemModel(0, np.array([1.0, 2.0, 3.0]))
    sched = Buffered(strategy, system, 0, 3, buffer, None, rebase=mode == "fedbuff")
    state = strategy.init_state({"w": torch.tensor([1.0, -1.0])})
    out = []
    for rnd in range(1, steps + 1):
        got = sched.collect(state, rnd, Scripted(), lambda s, r: None)  # type: ignore[arg-type,return-value]
        state, _ = aggregated(aggregate_with(strategy, state, got.updates, _ctx(rnd, got.staleness)))
        state = sched.stepped(ServerState(rnd, state.global_params, state.aggregation, state.schedule), rnd)
        out.append(state.global_params["w"].to(torch.float64))
    return out


def test_fedbuff_server_updates_over_scripted_arrivals_written_out():
    """K = 2 of M = 3 clients (all three: the buffered one is not dispatched again before the
    step). t = 0: clients 0, 1, 2 start from w0. Step 1 at t = 2: 0 (t = 1) and 1 (t = 2), fresh.
    Clients 0, 1 start again from w1 at t = 2. Step 2 at t = 3: 0 (from w1, τ = 0) and 2 (from
    w0, τ = 1, weight 1/sqrt(2)); FedBuff's update is each delta from where it started."""
    w0 = torch.tensor([1.0, -1.0], dtype=torch.float64)

    def x(c, w):
        return 0.5 * w + B[c]

    w1 = w0 + (N[0] * (x(0, w0) - w0) + N[1] * (x(1, w0) - w0)) / (N[0] + N[1])
    s = 1 / math.sqrt(2)
    w2 = w1 + (N[0] * (x(0, w1) - w1) + N[2] * s * (x(2, w0) - w0)) / (N[0] + N[2])
    got = _scripted("fedbuff", 2, 2)
    for a, b in zip(got, (w1, w2), strict=True):  # float32 params: a few ulps of |w|
        assert float((a - b).abs().max()) <= 8 * torch.finfo(torch.float32).eps * (1 + float(b.abs().max()))
    # a sign flip or a dropped staleness factor is far outside that
    wrong = w1 + (N[0] * (x(0, w1) - w1) + N[2] * (x(2, w0) - w0)) / (N[0] + N[2])
    assert float((got[1] - wrong).abs().max()) > 1e-3


def test_fedasync_server_updates_over_scripted_arrivals_written_out():
    """K = 1, α = 0.6, s(τ) = 1/sqrt(1 + τ). t = 1: client 0 (τ 0) mixes in, restarts from w1;
    t = 2: client 0 again (from w1, arriving with client 1; ties by id), τ 0; t = 2: client 1
    (from w0, τ 2): w ← w + α s(τ) (x − w), the client's model mixed into the current one."""
    w0 = torch.tensor([1.0, -1.0], dtype=torch.float64)

    def x(c, w):
        return 0.5 * w + B[c]

    a = 0.6
    w1 = w0 + a * (x(0, w0) - w0)
    w2 = w1 + a * (x(0, w1) - w1)
    w3 = w2 + a / math.sqrt(3) * (x(1, w0) - w2)
    got = _scripted("fedasync", 3, 1)
    for g, e in zip(got, (w1, w2, w3), strict=True):
        assert float((g - e).abs().max()) <= 8 * torch.finfo(torch.float32).eps * (1 + float(e.abs().max()))


# --- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, says",
    [
        (["method=fedtsp", "data.client_test_fraction=0.25", "system.mode=fedbuff"], "needs a whole round"),
        (["system.mode=fedbuff", "system.concurrency=8", "system.buffer=2"], "at most fl.num_clients"),
        (["system.mode=fedbuff", "system.buffer=20"], "must be <= system.concurrency"),
        (["system.mode=fedbuff", "system.deadline=3"], "for synchronous rounds"),
        (
            ["system.mode=fedbuff", "system.buffer=2", "aggregator.steps=[secagg_plus]"],
            "use system.mode=sync",
        ),
        (["system.clock=wall"], "runtime=serial trains one client at a time"),
        (["system.clock=wall", "system.seconds_per_example=0.01"], "system.clock=wall measures"),
        (["system.replay=nosuch/arrivals.jsonl"], "system.replay: cannot read"),
    ],
)
def test_a_setting_the_run_cannot_take_is_one_line_before_any_work(tmp_path, data_root, extra, says):
    from fl_lightning.runtime.build import prepare

    with pytest.raises(ConfigError, match=says):
        prepare(compose(small(tmp_path, "runtime=serial", *extra)))
    assert not any(tmp_path.iterdir())


# --- synchronous rounds with a deadline and over-selection ----------------------------------------


def test_a_deadline_drops_the_late_updates_and_over_selection_keeps_the_first_k(tmp_path, data_root):
    """Durations 1, 2, 3, 4 s: a deadline of 2.5 s keeps clients 0 and 1, drops 2 and 3 and ends
    the round at the deadline; over-selection of 2 among all 4 keeps the first two to arrive."""
    trace = _trace(tmp_path, [1.0, 2.0, 3.0, 4.0])
    args = small(tmp_path, "runtime=serial", "fl.rounds=2", "data.train_subset=600", "system.speed=trace",
                 f"system.trace={trace}")  # fmt: skip
    _, late = start_run(compose([*args, "system.deadline=2.5", "run_id=deadline"]), console=False)
    lines = _lines(late)
    assert [x["clients"] for x in lines] == [2, 2]
    assert [x["system/dropped_late"] for x in lines] == [2.0, 2.0]
    assert [x["virtual_time"] for x in lines] == [2.5, 5.0]
    over = ["fl.clients_per_round=2", "system.over_select=2", "run_id=over"]
    _, sel = start_run(compose([*args, *over]), console=False)
    lines = _lines(sel)
    assert [x["clients"] for x in lines] == [2, 2]
    assert [x["system/dropped_over_selected"] for x in lines] == [2.0, 2.0]
    assert [x["virtual_time"] for x in lines] == [2.0, 4.0]


# --- serial == Ray, kill -9 + resume with clients in flight -----------------------------------------


@pytest.mark.slow
def test_fedbuff_and_a_deadline_give_the_same_numbers_serial_and_on_ray(tmp_path, data_root, ray_workers):
    """Arrivals are ordered by virtual time, never by which actor answers first: a Ray run on
    two pooled workers (each answers whenever its client is done) is the serial run, metric for
    metric and state for state. Its four Ray runs take the same warm workers (`ray_workers`):
    each run after the first finds both warm."""
    on_ray = ["runtime=ray", "runtime.placement=pool", "runtime.num_actors=2"]
    for i, (name, extra) in enumerate(
        (
            ("fedbuff", [*FEDBUFF, "system.concurrency=3", "system.buffer=2", "method=fedavgm"]),
            (
                "deadline",
                ["system.seconds_per_example=0.001", "system.speed=lognormal", "system.deadline=0.3"],
            ),
        )
    ):
        args = small(tmp_path / name, "fl.rounds=3", "data.train_subset=600", "runtime.threads_per_client=1",
                     *extra)  # fmt: skip
        _, s = start_run(compose([*args, "runtime=serial", "run_id=serial"]), console=False)
        rs, r = start_run(compose([*args, *on_ray, "run_id=ray"]), console=False, session=ray_workers)
        assert rs["num_actors"] == 2 and (i == 0 or rs["actors_reused"] == 2)  # the first run's, warm
        assert_same_run(s, r, stateful=False)
        assert [x["virtual_time"] for x in _lines(s)] == [x["virtual_time"] for x in _lines(r)]

    # the wall clock: updates taken as Ray's workers finish them, each arrival recorded; the
    # recording replayed on the virtual clock (serial) is the same run, the clock included
    for name, extra in (
        (
            "wall_fedbuff",
            ["method=fedavgm", "system.mode=fedbuff", "system.concurrency=3", "system.buffer=2"],
        ),
        ("wall_sync", ["fl.clients_per_round=2", "system.over_select=2"]),  # the first 2 of 4 to finish
    ):
        args = small(tmp_path / name, "fl.rounds=3", "data.train_subset=600", "runtime.threads_per_client=1",
                     *extra)  # fmt: skip
        wall = [*on_ray, "system.clock=wall", "run_id=wall"]
        ws, w = start_run(compose([*args, *wall]), console=False, session=ray_workers)
        assert ws["actors_reused"] == ws["num_actors"] == 2
        got = [json.loads(x) for x in (w / "arrivals.jsonl").read_text().splitlines()]
        assert [a["arrival"] for a in got] == sorted({a["arrival"] for a in got})  # in the order taken
        assert all(a["arrival"] > a["start"] >= 0 for a in got)
        lines = _lines(w)
        assert [x["virtual_time"] for x in lines] == sorted(x["virtual_time"] for x in lines)
        if name == "wall_sync":  # every client of a round arrives; the first two are kept
            assert len(got) == 12 and [x["system/dropped_over_selected"] for x in lines] == [2.0] * 3
        replay = ["runtime=serial", f"system.replay={w / 'arrivals.jsonl'}", "run_id=replay"]
        _, r = start_run(compose([*args, *replay]), console=False)
        assert records(w) == records(r)
        assert [x["virtual_time"] for x in lines] == [x["virtual_time"] for x in _lines(r)]
        (sw, _), (sr, _) = final_state(w), final_state(r)
        for field in sw["fields"].keys() - {"schedule"}:  # in flight at the end: never arrived there
            assert_equal(sw["fields"][field], sr["fields"][field], field)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fedbuff", "fedbuff_scaffold", "deadline"])
def test_killed_with_clients_in_flight_resumes_to_the_same_run(tmp_path, data_root, mode):
    """kill -9 after round 2's checkpoint, whose schedule holds clients in flight (FedBuff: M − K
    of them, each with the version it started from): the resumed run ends as the uninterrupted
    one, every metric, the virtual clock and the final state. SCAFFOLD's clients keep state: each
    one's is checkpointed as its update arrived, not as its next fit (in flight) leaves it."""
    extra = {
        "fedbuff": [*FEDBUFF, "system.concurrency=3", "system.buffer=2"],
        # every 2 steps: a client that arrived in step 1 may be in flight again at step 2's checkpoint
        "fedbuff_scaffold": [
            *FEDBUFF,
            "system.concurrency=3",
            "system.buffer=2",
            "method=scaffold",
            "checkpoint.every=2",
        ],  # fmt: skip
        "deadline": ["system.seconds_per_example=0.001", "system.speed=lognormal", "system.deadline=0.3"],
    }[mode]
    args = small(tmp_path, "fl.rounds=4", "runtime=serial", "data.train_subset=600", *extra)
    _, full_dir = start_run(compose([*args, "experiment=full", "run_id=a"]), console=False)

    killed_dir = tmp_path / "killed" / "b"
    kill_after_checkpoint([*args, "experiment=killed", "run_id=b"], killed_dir)
    doc = json.loads((killed_dir / "checkpoints" / "round-000002.json").read_text())
    if mode != "deadline":  # the checkpoint holds the clients in flight
        assert "jobs" in json.dumps(doc["state"])
    assert main(["resume", str(killed_dir), "--quiet"]) == 0
    assert_same_run(killed_dir, full_dir, stateful=mode == "fedbuff_scaffold")
    assert [x["virtual_time"] for x in _lines(killed_dir)] == [x["virtual_time"] for x in _lines(full_dir)]
    assert records(killed_dir)[-1]["round"] == 4


def test_compare_against_virtual_time_gives_each_rows_time_to_a_target(tmp_path, data_root, capsys):
    """`compare --x time --target`: the plot is against the virtual clock, and each row's time to
    the target is the virtual time of its first line that reaches it."""
    trace = _trace(tmp_path, [1.0, 2.0, 3.0, 4.0])
    args = small(tmp_path / "runs", "runtime=serial", "fl.rounds=2", "data.train_subset=600",
                 "system.speed=trace", f"system.trace={trace}", "logger=none")  # fmt: skip
    _, sync = start_run(compose([*args, "run_id=sync"]), console=False)
    _, buff = start_run(compose([*args, "method=fedavgm", "system.mode=fedbuff", "system.concurrency=3",
                                 "system.buffer=2", "run_id=fedbuff"]), console=False)  # fmt: skip
    target = min(_lines(sync)[-1]["accuracy"], _lines(buff)[-1]["accuracy"])
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "runs"), "--x", "time", "--target", str(target),
                 "--out", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert (out / "accuracy_vs_time.png").is_file()
    for run_dir, name in ((sync, "fedavg"), (buff, "fedavgm")):
        first = next(x["virtual_time"] for x in _lines(run_dir) if x["accuracy"] >= target)
        assert f"  {name}  {first:.1f}  (1/1)" in text


@pytest.mark.parametrize("method", ["fedprox", "fedadam"])
def test_fedbuff_composes_with_methods_that_upload_a_model(tmp_path, data_root, method):
    """The staleness weights are a step of the chain: FedProx's clients and FedAdam's server
    optimiser run under FedBuff by configuration alone, stale updates weighted."""
    args = small(tmp_path, "runtime=serial", "fl.rounds=3", "data.train_subset=600", f"method={method}",
                 *FEDBUFF, "system.concurrency=3", "system.buffer=1")  # fmt: skip
    summary, run_dir = start_run(compose(args), console=False)
    lines = _lines(run_dir)
    assert summary["status"] == "completed" and [x["clients"] for x in lines] == [1, 1, 1]
    assert max(x["system/staleness_max"] for x in lines) >= 1  # some update was stale
    assert all(math.isfinite(x["accuracy"]) for x in lines)
