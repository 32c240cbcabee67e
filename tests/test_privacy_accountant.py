"""The privacy accountants through our own wrappers (`core/privacy/accountant.py`), against the
reference values the libraries pin in their own tests (anchors.md §9)."""

from __future__ import annotations

import json
import math

import dp_accounting as dpa
import pytest
from dp_accounting import rdp

from fl_lightning.core.errors import ConfigError
from fl_lightning.core.privacy.accountant import (
    OPACUS_RDP_ORDERS,
    SampleLevelAccountant,
    Sampling,
    UserLevelAccountant,
    adaptive_noise_multipliers,
    calibrate_noise_multiplier,
)


def test_opacus_rdp_reference_epsilon():
    """Opacus `tests/accountants_test.py`: q 0.04, σ 1.5, 2,250 steps, δ 1e-5 -> 7.32911117143."""
    acc = SampleLevelAccountant("rdp")
    for _ in range(3):  # composed in parts, as a client's fits add steps
        acc.step(1.5, 0.04, 750)
    assert acc.steps == [(1.5, 0.04, 2250)]
    assert acc.epsilon(1e-5) == pytest.approx(7.32911117143, abs=1e-9)


def test_opacus_state_round_trip_mid_run():
    """Opacus' `test_accountant_load_state_dict`: reloaded mid-run, the same ε at the end."""
    first = SampleLevelAccountant("rdp")
    first.step(1.5, 0.04, 1000)
    saved = json.loads(json.dumps(first.state_dict()))  # as the checkpoint holds it
    again = SampleLevelAccountant()
    again.load_state_dict(saved)
    again.step(1.5, 0.04, 1250)
    assert again.epsilon(1e-5) == pytest.approx(7.32911117143, abs=1e-9)


def test_user_level_rdp_with_opacus_orders():
    """The same mechanism through dp-accounting (Poisson q = 4/100 clients, 2,250 rounds): its
    RDP-to-(ε, δ) conversion differs from Opacus' in the fourth digit (7.3293, anchors.md §9)."""
    acc = UserLevelAccountant(Sampling("poisson", 100, 4), 1.5, 1e-5, orders=OPACUS_RDP_ORDERS)
    eps = acc.step(2250)
    assert eps == pytest.approx(7.3293, abs=5e-5)
    assert abs(eps - 7.32911117143) < 3e-4


def test_single_gaussian_reference_epsilon():
    """dp-accounting `test_compute_epsilon_delta_gaussian`: σ 4.530877117, δ 1e-6, one step -> 1.0
    (full participation: q = 1, for either sampling model the accountant reduces to a Gaussian)."""
    acc = UserLevelAccountant(Sampling("poisson", 10, 10), 4.530877117, 1e-6)
    assert acc.epsilon(1) == pytest.approx(1.0, abs=1e-6)


def test_pld_reference_delta():
    """dp-accounting PLD `test_poisson_subsampled_gaussian`: q 0.2, σ 0.5, 3 steps: δ(ε=1) = 0.15594."""
    acc = UserLevelAccountant(Sampling("poisson", 5, 1), 0.5, 1e-5, method="pld")
    assert acc.delta_at(1.0, rounds=3) == pytest.approx(0.15594, abs=2e-5)


def test_adaptive_clipping_noise():
    """FLSim `test_privacy_noise_with_adaptive_clipping` / anchors.md §9: σ 1, σ_b 5 -> 1.00503782."""
    assert adaptive_noise_multipliers(1.0, 5.0) == pytest.approx(1.00503782, abs=1e-8)
    assert adaptive_noise_multipliers(0.0, 5.0) == 0.0
    with pytest.raises(ConfigError, match="2·σ_b > σ"):
        adaptive_noise_multipliers(1.0, 0.5)


def test_fixed_cohorts_are_replace_one_with_twice_the_sensitivity():
    """Fixed-size cohorts: dp-accounting's sampled-without-replacement Gaussian under replace-one,
    given σ/2 (one client replaced moves the clipped sum by up to 2C)."""
    acc = UserLevelAccountant(Sampling("without_replacement", 100, 10), 1.2, 1e-5)
    direct = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    direct.compose(dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(0.6)), 50)
    assert acc.epsilon(50) == pytest.approx(direct.get_epsilon(1e-5), rel=1e-12)
    assert Sampling("without_replacement", 100, 10).adjacency == "replace-one"
    assert Sampling("poisson", 100, 10).adjacency == "add/remove-one"
    with pytest.raises(ConfigError, match="fl.sampling=poisson"):
        UserLevelAccountant(Sampling("without_replacement", 100, 10), 1.0, 1e-5, method="pld")


#: every target and length under Poisson sampling; three of the six without replacement, whose
#: RDP bound dp-accounting computes ~3x slower (2.3 CPU-s a search): each target once, both lengths
CALIBRATIONS = [
    *((kind, target, rounds) for kind in ["poisson"] for target in (1.0, 4.0, 8.0) for rounds in (10, 100)),
    ("without_replacement", 1.0, 100), ("without_replacement", 4.0, 10), ("without_replacement", 8.0, 100),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "target", "rounds"), CALIBRATIONS)
def test_calibrated_sigma_never_overshoots(kind, target, rounds):
    """The σ found for a target ε meets it, and is tight: a σ smaller by more than the search's
    tolerance would overshoot (Opacus' `get_noise_multiplier` contract)."""
    sampling = Sampling(kind, 100, 10)
    tol = 1e-4
    sigma = calibrate_noise_multiplier(target, 1e-5, sampling, rounds, tol=tol)
    acc = UserLevelAccountant(sampling, sigma, 1e-5)
    assert acc.epsilon(rounds) <= target
    assert UserLevelAccountant(sampling, sigma - 2 * tol, 1e-5).epsilon(rounds) > target


def test_state_dict_round_trip_and_refusal():
    sampling = Sampling("without_replacement", 100, 10)
    straight = UserLevelAccountant(sampling, 1.0, 1e-5)
    straight.step(30)
    part = UserLevelAccountant(sampling, 1.0, 1e-5)
    part.step(12)
    resumed = UserLevelAccountant(sampling, 1.0, 1e-5)
    resumed.load_state_dict(json.loads(json.dumps(part.state_dict())))
    assert resumed.step(18) == straight.epsilon()
    other = UserLevelAccountant(sampling, 1.1, 1e-5)
    with pytest.raises(ConfigError, match="noise_multiplier"):
        other.load_state_dict(part.state_dict())


def test_no_noise_is_no_privacy():
    acc = UserLevelAccountant(Sampling("poisson", 100, 10), 0.0, 1e-5)
    assert acc.epsilon(0) == 0.0
    assert math.isinf(acc.step())
