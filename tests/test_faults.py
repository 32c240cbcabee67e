"""A client whose actor dies is retried on a fresh actor; one that keeps failing is
dropped when fl.max_client_failures allows, else the run stops naming client and cause; a
round in which every client fails is one clear error; batched clients under Ray (a failing
batch is retried, then dropped client by client).

Two client workers on the session's Ray serve every test here (`workers`): each costs ~7
CPU-seconds to start, so each test's executor sets up the previous test's workers again (as a
sequential sweep's run does) where it would start its own; what a test does to them (a killed
actor is replaced, an error raised inside a client leaves its actor up) leaves them whole."""

import contextlib
import dataclasses

import pytest
import torch

from fl_lightning.config import compose
from fl_lightning.core.errors import ClientFailure
from fl_lightning.core.messages import Broadcast, ServerState
from fl_lightning.core.strategy import round_rng
from fl_lightning.runtime.callbacks import CallbackList
from fl_lightning.runtime.placement import plan_placement
from fl_lightning.runtime.runner import RoundSteps, Run, prepare, run_rounds
from fl_lightning.runtime.steps import ClientEval, GlobalEval, WallClock

from .conftest import small


@pytest.fixture(scope="module")
def workers(ray_session):
    """This module's idle client workers, between its tests (ended with it: they hold the
    session Ray's CPUs)."""
    from fl_lightning.runtime.workers import WorkerSource

    source = WorkerSource()
    yield source
    source.clear()


@contextlib.contextmanager
def _executor(workers, ray_session, *args, **kwargs):
    """A `RayExecutor` on `workers`' idle workers (new ones the first time), ready; given back
    to them after the test where all its actors are alive."""
    from fl_lightning.runtime.ray_executor import RayExecutor

    ex = RayExecutor(*args, **kwargs, source=workers)
    ex.ready()
    try:
        yield ex
    finally:
        try:
            ray_session.get([a.info.remote() for a in ex.actors], timeout=60)
            alive = True
        except Exception:  # noqa: BLE001  (a test that failed with a dead actor: end them)
            alive = False
        ex.close(reuse=alive)


@pytest.fixture(scope="module")
def prepared_run(tmp_path_factory, data_root):
    return prepare(
        compose(small(tmp_path_factory.mktemp("faults"), "fl.num_clients=2", "data.train_subset=400"))
    )


@pytest.fixture()
def executor_parts(prepared_run, workers, ray_session):
    """An executor of the prepared run's 2 clients, one actor each; no failures allowed."""
    p = prepared_run
    placement = plan_placement(2, total_cpus=2, total_gpus=0, placement="per_client")
    with _executor(workers, ray_session, p.spec, p.dataset, p.split.train, p.split.test, placement) as ex:
        yield p, ex


def _unloadable(b: Broadcast) -> Broadcast:
    """A broadcast no client can load: a real KeyError raised inside each actor, every try."""
    assert b.global_params is not None
    return Broadcast(b.round, {**b.global_params, "no.such.layer": b.global_params["head.bias"]})


def test_dead_actor_is_replaced_and_the_client_retried(executor_parts, ray_session):
    p, ex = executor_parts
    dead = ex.actors[0]
    ray_session.kill(dead)
    plan = p.strategy.configure_round(p.strategy.init_state(p.init_params), 1, round_rng(0, 1))
    updates = sorted(ex.fit(plan), key=lambda u: u.client_id)
    assert [u.client_id for u in updates] == [0, 1] and ex.failures == []
    assert ex.actors[0] is not dead


@pytest.mark.parametrize("allowed", [0, 2])
def test_a_failing_client_is_dropped_or_stops_the_run(executor_parts, allowed):
    p, ex = executor_parts
    plan = p.strategy.configure_round(p.strategy.init_state(p.init_params), 1, round_rng(0, 1))
    plan.broadcast.global_params = _unloadable(plan.broadcast).global_params
    ex.max_client_failures = allowed
    if allowed == 0:
        with pytest.raises(
            ClientFailure, match=r"round 1: client [01] failed: KeyError.*max_client_failures=0"
        ):
            list(ex.fit(plan))
    else:
        assert list(ex.fit(plan)) == []
        assert sorted(f.split(":")[0] for f in ex.failures) == ["round 1", "round 1"]
        assert all("KeyError" in f for f in ex.failures)


def test_every_client_failing_is_one_clear_error(tmp_path, executor_parts, monkeypatch):
    """The round loop (`run_rounds`) over a round in which every client fails, though
    fl.max_client_failures allows each to be dropped: one error naming both and their causes."""
    p, ex = executor_parts
    ex.max_client_failures = 2
    run = Run(p, tmp_path / "run", console=False)
    callbacks, clock = CallbackList([]), WallClock()
    steps = RoundSteps(GlobalEval(p, tmp_path, clock), ClientEval(p))
    good = p.strategy.broadcast

    def broken(state: ServerState, rnd: int) -> Broadcast:
        return _unloadable(good(state, rnd))

    monkeypatch.setattr(p.strategy, "broadcast", broken)
    every = r"round 1: every client failed \(client [01] failed: KeyError"
    with pytest.raises(ClientFailure, match=every) as info:
        state = p.strategy.init_state(p.init_params)
        run_rounds(state, 1, p.strategy, ex, p.cfg.seed, run.context, steps, callbacks, clock)
    # both clients and their causes, in the order they failed
    assert all(f"client {c} failed: KeyError" in str(info.value) for c in (0, 1))
    assert len(ex.retries) == 2  # each client was retried once before it was dropped


def test_batched_under_ray_each_actor_trains_its_share(tmp_path, data_root, workers, ray_session):
    """Two actors for 8 clients; each trains its share of the round 2 at a time (`fit_many`),
    to the weights of test_batched's written-out loops. A batch of clients that fails is
    retried once, then dropped client by client. (Here, not in test_batched.py: the module's
    workers serve it.)"""
    from .test_batched import SIZES, prepared, run_paths

    p, shards = prepared(tmp_path, "fedavg")
    spec = dataclasses.replace(p.spec, batched=2, threads=1, accelerator="cpu")
    placement = plan_placement(len(SIZES), total_cpus=2, total_gpus=0, placement="pool", num_actors=2)
    train = [shards[c] for c in range(len(SIZES))]
    with _executor(workers, ray_session, spec, p.dataset, train, [], placement, max_client_failures=5) as ex:
        run_paths("fedavg", p, shards, {"ray": (ex, None)})
        assert ex.failures == [] and ex.retries == []
        plan = p.strategy.configure_round(p.strategy.init_state(p.init_params), 3, round_rng(0, 3))
        plan.broadcast.global_params = {**plan.broadcast.global_params, "no.such.layer": torch.zeros(1)}
        assert list(ex.fit(plan)) == []
        for lines in (ex.retries, ex.failures):  # one line per client
            assert sorted(int(f.split("client ")[1].split()[0].rstrip(":")) for f in lines) == plan.client_ids
            assert all(f.startswith("round 3: client ") and "KeyError" in f for f in lines)


def test_a_submitted_fit_whose_actor_dies_is_retried_and_one_that_fails_twice_stops(
    executor_parts, ray_session
):
    """`submit` / `take` (the asynchronous scheduler's): a fit on a killed actor comes back from
    a fresh one, the same update as the serial host computes; one that raises every time stops
    the run after its retry, naming client and cause (no round to drop it from)."""
    p, ex = executor_parts
    state = p.strategy.init_state(p.init_params)
    plan = p.strategy.configure_round(state, 1, round_rng(0, 1))
    dead = ex.actors[0]
    ray_session.kill(dead)
    handles = [ex.submit(plan.broadcast, pl) for pl in plan.payloads]
    updates = [ex.take(h) for h in handles]
    assert [u.client_id for u in updates] == [0, 1] and ex.actors[0] is not dead
    assert any("client 0" in r for r in ex.retries)
    bad = _unloadable(plan.broadcast)
    with pytest.raises(ClientFailure, match=r"round 1: client 1 failed: KeyError"):
        ex.take(ex.submit(bad, plan.payloads[1]))


def test_workers_slow_to_set_up_are_reported_once_with_what_ray_has_free(ray_session, caplog):
    """Workers not set up after the warning time: one line saying how many and what Ray has
    free, and the wait goes on to the end (a run that waits for workers Ray does not place
    said nothing, for 10 min in a test). Real remote tasks on the shared Ray stand for the
    setups: one that ends at once, one that takes seconds (on no CPU: this module's idle
    workers may hold both of the shared Ray's)."""
    import time

    from fl_lightning.runtime.ray_executor import wait_for_workers

    @ray_session.remote(num_cpus=0)
    def setup(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    fast = setup.remote(0.0)
    ray_session.get(fast)  # done before the wait starts, whatever the load
    refs = [fast, setup.remote(5.0)]
    with caplog.at_level("WARNING", logger="fl_lightning.runtime.ray_executor"):
        wait_for_workers(refs, warn_after=0.5)
    ready, _ = ray_session.wait(refs, num_returns=2, timeout=0)
    assert len(ready) == 2  # waited for both
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("1 of 2 client workers not set up after 0.5 s"), lines
    assert "of 2 CPUs" in lines[0] and "ray status" in lines[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="fl_lightning.runtime.ray_executor"):
        wait_for_workers([setup.remote(0.0)], warn_after=60)
    assert not caplog.records  # in time: nothing said
