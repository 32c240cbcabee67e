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
