"""A client whose actor dies is retried on a fresh actor; one that keeps failing is
dropped when fl.max_client_failures allows, else the run stops naming client and cause."""

import pytest

from fl_lightning.config import compose
from fl_lightning.core.errors import ClientFailure
from fl_lightning.core.strategy import round_rng
from fl_lightning.runtime.placement import plan_placement
from fl_lightning.runtime.runner import prepare

from .conftest import small


@pytest.fixture()
def executor_parts(tmp_path, data_root, ray_session):
    p = prepare(compose(small(tmp_path, "fl.num_clients=2", "data.train_subset=400")))
    placement = plan_placement(2, total_cpus=2, total_gpus=0, placement="per_client")
    return p, placement


def test_dead_actor_is_replaced_and_the_client_retried(executor_parts, ray_session):
    from fl_lightning.runtime.ray_executor import RayExecutor

    p, placement = executor_parts
    ex = RayExecutor(p.spec, p.dataset, p.split.train, p.split.test, placement)
    try:
        ex.ready()
        dead = ex.actors[0]
        ray_session.kill(dead)
        plan = p.strategy.configure_round(p.strategy.init_state(p.init_params), 1, round_rng(0, 1))
        updates = sorted(ex.fit(plan), key=lambda u: u.client_id)
        assert [u.client_id for u in updates] == [0, 1] and ex.failures == []
        assert ex.actors[0] is not dead
    finally:
        ex.close()


@pytest.mark.parametrize("allowed", [0, 2])
def test_a_failing_client_is_dropped_or_stops_the_run(executor_parts, allowed):
    from fl_lightning.runtime.ray_executor import RayExecutor

    p, placement = executor_parts
    plan = p.strategy.configure_round(p.strategy.init_state(p.init_params), 1, round_rng(0, 1))
    # A broadcast the clients cannot load: a real error raised inside each actor, every try.
    plan.broadcast.global_params = {
        **plan.broadcast.global_params,
        "no.such.layer": plan.broadcast.global_params["head.bias"],
    }
    ex = RayExecutor(p.spec, p.dataset, p.split.train, p.split.test, placement, max_client_failures=allowed)
    try:
        if allowed == 0:
            with pytest.raises(
                ClientFailure, match=r"round 1: client [01] failed: KeyError.*max_client_failures=0"
            ):
                list(ex.fit(plan))
        else:
            assert list(ex.fit(plan)) == []
            assert sorted(f.split(":")[0] for f in ex.failures) == ["round 1", "round 1"]
            assert all("KeyError" in f for f in ex.failures)
    finally:
        ex.close()
