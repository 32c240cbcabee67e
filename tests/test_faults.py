"""A client whose actor dies is retried on a fresh actor; one that keeps failing is
dropped when fl.max_client_failures allows, else the run stops naming client and cause; a
round in which every client fails is one clear error.

One executor (2 client actors on the session's Ray) serves every test here: each actor costs
~7 CPU-seconds to start, and what a test does to it (a killed actor is replaced, an error
raised inside a client leaves its actor up) leaves it whole for the next."""

import pytest

from fl_lightning.config import compose
from fl_lightning.core.errors import ClientFailure
from fl_lightning.core.messages import Broadcast, ServerState
from fl_lightning.core.strategy import round_rng
from fl_lightning.runtime.callbacks import CallbackList, ClientEval, GlobalEval, WallClock
from fl_lightning.runtime.placement import plan_placement
from fl_lightning.runtime.runner import RoundSteps, Run, prepare, run_rounds

from .conftest import small


@pytest.fixture(scope="module")
def shared(tmp_path_factory, data_root, ray_session):
    from fl_lightning.runtime.ray_executor import RayExecutor

    p = prepare(
        compose(small(tmp_path_factory.mktemp("faults"), "fl.num_clients=2", "data.train_subset=400"))
    )
    placement = plan_placement(2, total_cpus=2, total_gpus=0, placement="per_client")
    ex = RayExecutor(p.spec, p.dataset, p.split.train, p.split.test, placement)
    try:
        ex.ready()
        yield p, ex
    finally:
        ex.close()


@pytest.fixture()
def executor_parts(shared):
    """The shared executor as a new one starts: no failures or retries, none allowed."""
    p, ex = shared
    ex.failures, ex.retries, ex.max_client_failures = [], [], 0
    yield p, ex
    ex.failures, ex.retries, ex.max_client_failures = [], [], 0


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
