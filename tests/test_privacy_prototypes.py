"""Class prototypes under `privacy=dp_fedavg` (core/privacy/prototypes.py) against their
arithmetic written out by hand: two golden rounds of FedProto with partial participation (each
client's prototypes clipped as one matrix, noise on their sum and on the count of holders, the
mean over the noised holders; round 2 trains toward round 1's noised prototypes), and the
accountant composing the round's two releases as one Gaussian of multiplier σ/√2; real runs:
serial == Ray and kill -9 + resume, bit for bit (the release's noise drawn from (seed, round,
its tag), the accountant's count in the checkpoint)."""

from __future__ import annotations

import dataclasses
import math
import zlib

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting import rdp

from fl_lightning.core.aggregation import Aggregator
from fl_lightning.core.privacy.accountant import Sampling
from fl_lightning.core.privacy.plan import PrivacyPlan, releases_of
from fl_lightning.core.privacy.steps import DpFedAvgStep
from fl_lightning.core.strategy import TaskInfo
from fl_lightning.methods import METHODS
from fl_lightning.testing import loop

from .conftest import small
from .run_files import assert_serial_is_ray_and_resume_is_exact, records
from .test_methods import digits3  # noqa: F401  (a fixture)

SIGMA, CLIP, DELTA = 0.5, 1.0, 1e-3


def noise(rnd: int, classes: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Round `rnd`'s two draws for a run of seed 0: N(0, 1) for the sum [C, D], then for the
    holder counts [C], from the generator seeded by (seed, round, crc32 of the release's tag)."""
    seed = np.random.SeedSequence([0, rnd, zlib.crc32(b"dp_fedavg/prototypes")]).generate_state(2, np.uint64)[
        0
    ]
    gen = torch.Generator().manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
    return (
        torch.randn(classes, dim, generator=gen, dtype=torch.float64),
        torch.randn(classes, generator=gen, dtype=torch.float64),
    )


def test_fedproto_private_prototypes_golden_two_rounds(digits3):  # noqa: F811
    """Mutations caught (each tried): example counts summed for holders, σ√C on the counts
    as σ, the accountant's σ/√2 as σ."""
    assert releases_of("fedproto", METHODS.config("fedproto")()) == 2
    plan = PrivacyPlan(
        name="dp_fedavg", clip=CLIP, noise_multiplier=SIGMA, update_noise_multiplier=SIGMA,
        count_stddev=0.0, sampling=Sampling("without_replacement", 3, 2), delta=DELTA, method="rdp",
        rounds=2, releases=2,
    )  # fmt: skip
    ds = digits3[0]
    task = TaskInfo(num_classes=10, class_names=tuple(ds.class_names), has_client_test_split=True, rounds=2)
    r = loop("fedproto", digits3, method={"lam": 1.0}, task=task, aggregator=Aggregator([DpFedAvgStep(plan)]))
    assert [p.client_ids for p in r.plans] == [[0, 1], [0, 2]]  # partial: client 1 sits out round 2
    assert all(u.params is None for ups in r.updates for u in ups)  # personal weights: not uploaded
    scales = []
    for rnd, (ups, state) in enumerate(zip(r.updates, r.states, strict=True), start=1):
        classes, dim = ups[0].prototypes.shape
        total, holders = (
            torch.zeros(classes, dim, dtype=torch.float64),
            torch.zeros(classes, dtype=torch.float64),
        )
        for u in ups:
            held = u.proto_counts > 0
            p = torch.where(held[:, None], u.prototypes.double(), 0.0)
            scale = min(1.0, CLIP / math.sqrt(float((p**2).sum())))
            scales.append(scale)
            total, holders = total + scale * p, holders + held.double()
        z_sum, z_count = noise(rnd, classes, dim)
        total, holders = total + SIGMA * CLIP * z_sum, holders + SIGMA * math.sqrt(classes) * z_count
        counts = holders.round().clamp(min=0)
        want = torch.stack([total[c] / max(float(holders[c]), 1.0) if counts[c] >= 1 else torch.zeros(dim)
                            for c in range(classes)])  # fmt: skip
        torch.testing.assert_close(state.prototypes, want.float(), rtol=1e-6, atol=1e-6)
        assert torch.equal(state.proto_counts, counts.long())
        assert state.aggregation["dp_fedavg"]["rounds"] == rnd  # counted without shared weights
    assert min(scales) < 1.0  # the clip bound some client's prototypes
    assert torch.equal(r.plans[1].broadcast.prototypes, r.states[0].prototypes)  # round 2 pulls to these
    # two Gaussian releases of multiplier σ on one cohort a round: one of σ/√2, under replace-one σ/√2/2
    acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.SampledWithoutReplacementDpEvent(3, 2, dpa.GaussianDpEvent(SIGMA / math.sqrt(2) / 2)), 2)
    assert plan.epsilon(2) == acc.get_epsilon(DELTA)
    assert plan.epsilon(2) > dataclasses.replace(plan, releases=1).epsilon(2)  # two releases cost more


@pytest.mark.slow
def test_private_prototypes_serial_equals_ray_and_killed_resumes_exact(tmp_path, data_root, ray_workers):
    """FedProto at its defaults (personal models, prototypes the only upload) under
    `privacy=dp_fedavg`, 2 of 3 clients a round: pooled Ray actors give the serial run's metrics,
    noised prototypes, accountant state and every client's model bit for bit, and so does a run
    killed after round 1's checkpoint and resumed."""
    args = small(tmp_path, "method=fedproto", "data.client_test_fraction=0.25", "privacy=dp_fedavg",
                 "privacy.delta=1e-3", "fl.num_clients=3", "fl.clients_per_round=2", "fl.rounds=2",
                 "fl.local_epochs=1", "data.train_subset=200", "data.test_subset=100",
                 "runtime.threads_per_client=1")  # fmt: skip
    serial = assert_serial_is_ray_and_resume_is_exact(args, ray_workers)
    lines = records(serial)
    assert all(line["server/dp_fedavg/prototype_sum_std"] > 0 for line in lines)  # the release was noised
    assert 0 < lines[0]["privacy/epsilon"] < lines[1]["privacy/epsilon"]
