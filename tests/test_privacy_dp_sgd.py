"""`privacy=dp_sgd` (core/privacy/dp_sgd.py): Opacus' per-example clipping and noise inside a
real client fit (the host, the Lightning Trainer, resident shards), its accountant per client,
and what it refuses."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from opacus.accountants import RDPAccountant

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.messages import Broadcast, ClientPayload
from fl_lightning.core.privacy.dp_sgd import steps_of_fit
from fl_lightning.runtime.build import prepare
from fl_lightning.runtime.host import ClientHost
from fl_lightning.runtime.runner import start_run

from .conftest import small
from .run_files import records

SGD = [
    "privacy=dp_sgd",
    "fl.num_clients=4",
    "fl.clients_per_round=4",
    "runtime=serial",
    "data.train_subset=400",
]


def one_step(tmp_path, sigma, clip, dp=True):
    """Client 0's weights after one local step of plain SGD at lr 1 from the initial model."""
    args = small(tmp_path, *SGD, f"privacy.noise_multiplier={sigma}", f"privacy.clip={clip}",
                 "fl.local_steps=1", "optim.lr=1.0", "optim.momentum=0.0")  # fmt: skip
    p = prepare(compose(args))
    spec = p.spec if dp else dataclasses.replace(p.spec, dp_sgd=None)
    host = ClientHost(spec, p.dataset, {0: p.split.train[0]})
    w0 = {k: v.clone() for k, v in p.init_params.items()}
    update = host.fit(Broadcast(1, w0), ClientPayload(0, 1, seed=7))
    return w0, update.params


def delta_norm(a, b):
    return math.sqrt(sum(float(((b[k] - a[k]).double() ** 2).sum()) for k in a if a[k].is_floating_point()))


def test_each_examples_gradient_is_clipped(tmp_path, data_root):
    """σ = 0, C = 1e-3, one step at lr 1: the mean of clipped per-example gradients has norm at most
    C, so the weights move by at most C (to float32 rounding); plain SGD moves them much further."""
    w0, w1 = one_step(tmp_path, 0.0, 1e-3)
    assert delta_norm(w0, w1) <= 1e-3 * (1 + 1e-4)
    w0, plain = one_step(tmp_path, 0.0, 1e-3, dp=False)
    assert delta_norm(w0, plain) > 100 * 1e-3


def test_without_noise_or_a_binding_clip_it_is_plain_sgd(tmp_path, data_root):
    """σ = 0 and C = 1e6: Opacus' mean of per-example gradients is the batch gradient (to float32
    rounding: a sum of B per-example terms against autograd's own)."""
    w0, dp = one_step(tmp_path, 0.0, 1e6)
    _, plain = one_step(tmp_path, 0.0, 1e6, dp=False)
    for k in w0:
        scale = 1 + float(plain[k].abs().max())
        assert float((dp[k] - plain[k]).abs().max()) <= 1e-4 * scale, k


def test_noise_is_seeded_by_the_fit(tmp_path, data_root):
    _, a = one_step(tmp_path, 1.0, 1.0)
    _, b = one_step(tmp_path, 1.0, 1.0)
    _, c = one_step(tmp_path, 0.0, 1.0)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_epsilon_is_opacus_rdp_per_client_the_largest_reported(tmp_path, data_root):
    """Two rounds, every client each round: each client's steps and rate B/n composed in Opacus'
    own RDP accountant (written here against Opacus directly), the largest ε reported."""
    args = small(tmp_path, *SGD, "privacy.noise_multiplier=1.1", "fl.rounds=2", "fl.batch_size=32")
    summary, run_dir = start_run(compose(args), console=False)
    p = prepare(compose(args))
    eps = []
    for shard in p.split.train:
        acc = RDPAccountant()
        n = len(shard)
        acc.history = [(1.1, 32 / n, 2 * steps_of_fit(n, 32, 1, None))]
        eps.append(acc.get_epsilon(1e-5))
    lines = records(run_dir)
    assert lines[-1]["privacy/epsilon"] == pytest.approx(max(eps), rel=1e-12)
    assert summary["privacy"]["level"] == "sample" and "sample-level" in summary["privacy"]["covers"]
    assert summary["privacy"]["epsilon"] == lines[-1]["privacy/epsilon"]


@pytest.mark.parametrize(
    "extra, says",
    [
        (["model=cnn_bn"], "has batch norm (BatchNorm2d)"),
        (["method=fedprox"], "method fedprox's client objective adds its own terms"),
        (["runtime.batched=2"], "privacy=dp_sgd trains each client through Opacus' optimiser"),
        (
            ["privacy.noise_multiplier=null", "privacy.target_epsilon=3"],
            "privacy=dp_sgd takes privacy.noise_multiplier",
        ),
    ],
)
def test_what_dp_sgd_cannot_do_is_one_line(extra, says, tmp_path, capsys, data_root):
    code = main(["run", *small(tmp_path, *SGD, *extra)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("fl-lightning: error: "), err
    assert says in err
    assert not (tmp_path / "default").exists()


@pytest.mark.slow
def test_dp_sgd_serial_equals_ray(tmp_path, data_root, ray_workers):
    """The noise is drawn from the fit's seed (seed, round, client), not from a worker's state:
    two rounds of 2 of 4 clients give the same lines, ε included, on either runtime."""
    args = small(tmp_path, *SGD, "fl.clients_per_round=2", "privacy.noise_multiplier=0.8", "fl.rounds=2",
                 "runtime.threads_per_client=1")  # fmt: skip
    _, sdir = start_run(compose([*args, "runtime=serial", "run_id=serial"]), console=False)
    _, rdir = start_run(
        compose([*args, "runtime=ray", "runtime.placement=pool", "runtime.num_actors=2", "run_id=ray"]),
        console=False,
        session=ray_workers,
    )
    assert records(sdir) == records(rdir)
    assert records(sdir)[-1]["privacy/epsilon"] > records(sdir)[0]["privacy/epsilon"] > 0
