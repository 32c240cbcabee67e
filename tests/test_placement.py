import collections

import pytest

from fl_lightning.core.errors import ConfigError
from fl_lightning.runtime.placement import plan_placement


def test_cpu_auto_uses_a_pool_when_clients_outnumber_cpus():
    p = plan_placement(10, total_cpus=2, total_gpus=0)
    assert (p.num_actors, p.cpus_per_actor, p.threads, p.accelerator) == (2, 1.0, 1, "cpu")
    assert collections.Counter(p.assignment) == {0: 5, 1: 5}


def test_cpu_per_client_gets_fractional_shares_that_fit():
    p = plan_placement(3, total_cpus=2, total_gpus=0, placement="per_client")
    assert p.num_actors == 3 and p.cpus_per_actor * 3 <= 2 and p.threads == 1
    assert p.assignment == (0, 1, 2)


def test_one_gpu_per_client():
    p = plan_placement(4, total_cpus=16, total_gpus=4)
    assert (p.num_actors, p.gpus_per_actor, p.accelerator) == (4, 1.0, "gpu")
    assert p.cpus_per_actor == 4.0 and p.threads == 4


def test_fractional_gpus_spread_evenly():
    p = plan_placement(16, total_cpus=16, total_gpus=4, gpus_per_client=0.25)
    assert p.num_actors == 16 and p.gpus_per_actor == 0.25


def test_impossible_requests_fail_clearly():
    with pytest.raises(ConfigError, match="no GPUs"):
        plan_placement(2, total_cpus=2, total_gpus=0, accelerator="gpu")
    with pytest.raises(ConfigError, match="need 8 GPUs"):
        plan_placement(8, total_cpus=16, total_gpus=4, placement="per_client", accelerator="gpu")
    with pytest.raises(ConfigError, match="CPUs"):
        plan_placement(4, total_cpus=2, total_gpus=0, placement="per_client", cpus_per_client=1)


def _cfg(*extra):
    from fl_lightning.config import compose

    return compose(["data=digits", "fl.num_clients=4", "logger=none", *extra])


def test_a_local_runs_placement_is_decided_once_by_prepare():
    """`prepare` decides where a run on this machine's resources goes; the session's executor
    uses that very object (not a second computation that could disagree)."""
    from fl_lightning.runtime.build import local_resources, prepare
    from fl_lightning.runtime.placement import placement_for
    from fl_lightning.runtime.session import Session

    cfg = _cfg("runtime=serial", "runtime.num_cpus=2")
    p = prepare(cfg)
    assert p.placement == placement_for(cfg, *local_resources(cfg)) and p.placement.resources == (2.0, 0.0)
    with Session() as s:
        w = s.workers(p, lambda ids: [])
        assert w.placement is p.placement
        w.executor.close()


def test_a_ray_with_other_resources_places_the_run_on_its_own(ray_session):
    """A Ray up before the run with other resources than this machine's (here: the tests' Ray,
    2 CPUs, and a run that says 4): the run is placed on that Ray's, decided on joining it;
    with the same resources, `prepare`'s placement is the one used."""
    from fl_lightning.runtime.build import prepare
    from fl_lightning.runtime.session import Session

    cpus = ray_session.cluster_resources()["CPU"]
    for n, same in ((int(cpus), True), (int(cpus) + 2, False)):
        p = prepare(_cfg("runtime=ray", f"runtime.num_cpus={n}", "runtime.num_gpus=0"))
        assert p.placement is not None and p.placement.resources == (float(n), 0.0)
        placed = Session().placement(p.cfg, p.placement)
        assert (placed is p.placement) == same
        assert placed.resources == (float(cpus), 0.0)


def test_a_run_this_machine_cannot_hold_is_refused_before_its_data(tmp_path):
    """The placement is decided before any data loads: an impossible one is the error, not the
    missing dataset behind it."""
    from fl_lightning.runtime.build import prepare

    cfg = _cfg("data=fmnist", f"data.root={tmp_path}", "runtime=serial", "runtime.num_cpus=2",
               "runtime.placement=per_client", "runtime.cpus_per_client=1")  # fmt: skip
    with pytest.raises(ConfigError, match="4 client actors × 1 CPUs need 4 CPUs but the cluster has 2"):
        prepare(cfg)


def test_threads_per_client_from_the_environment_when_the_config_leaves_it_unset(monkeypatch):
    """`$FL_LIGHTNING_THREADS_PER_CLIENT` (the suite's workers set 1) replaces the CPU share;
    the config's own value wins; a bad value is one line."""
    from fl_lightning.config import compose
    from fl_lightning.runtime.placement import placement_for

    monkeypatch.delenv("FL_LIGHTNING_THREADS_PER_CLIENT", raising=False)
    cfg = compose(["runtime=ray", "fl.num_clients=1"])
    assert placement_for(cfg, 4, 0).threads == 4  # the CPU share
    monkeypatch.setenv("FL_LIGHTNING_THREADS_PER_CLIENT", "2")
    assert placement_for(cfg, 4, 0).threads == 2
    assert (
        placement_for(
            compose(["runtime=ray", "fl.num_clients=1", "runtime.threads_per_client=3"]), 4, 0
        ).threads
        == 3
    )
    monkeypatch.setenv("FL_LIGHTNING_THREADS_PER_CLIENT", "0")
    with pytest.raises(ConfigError, match="FL_LIGHTNING_THREADS_PER_CLIENT='0'"):
        placement_for(cfg, 4, 0)
