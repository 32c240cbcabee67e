"""The `privacy=` config group and `fl.sampling=poisson`: composition, one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.sampling import Sampling
from fl_lightning.core.strategy import FedAvgStrategy, round_rng
from fl_lightning.methods.fedavg import FedAvgConfig

N100 = ["fl.num_clients=100", "fl.clients_per_round=10"]

DP = ["privacy=dp_fedavg", *N100]
BAD = [
    ([*DP, "privacy.target_epsilon=4"], "needs exactly one of privacy.noise_multiplier"),
    ([*DP, "privacy.noise_multiplier=-1"], "privacy.noise_multiplier must be >= 0"),
    ([*DP, "privacy.clip=0"], "privacy.clip must be > 0"),
    ([*DP, "privacy.delta=0.5"], "privacy.delta=0.5 must be below 1/fl.num_clients"),
    ([*DP, "privacy.accountant=pld"], "privacy.accountant=pld needs fl.sampling=poisson"),
    ([*DP, "fl.sampling=size"], "fl.sampling=size draws clients another way"),
    (["privacy=dp_fedavg", "fl.num_clients=100", "fl.fraction_range=[0.1,0.2]"], "fl.fraction_range draws"),
    (["privacy=dp_sgd", "privacy.adaptive=true"], "privacy.adaptive (adaptive clipping) applies to"),
    ([*DP, "privacy.target_quantile=2"], "privacy.target_quantile must be in [0, 1]"),
    (["privacy=dpfedavg"], "unknown privacy 'dpfedavg'; valid: dp_fedavg, dp_sgd, none"),
    (["privacy.bogus=1"], "unknown config key 'privacy.bogus'"),
    (["fl.sampling=poisson", "fl.fraction_range=[0.1,0.2]"], "fl.sampling=poisson draws each client"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_privacy_config_is_one_line_and_exit_2(overrides, message, tmp_path, capsys):
    code = main(["run", *overrides, f"output_dir={tmp_path}", "logger=none"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("fl-lightning: error: "), err
    assert message in err
    assert list(tmp_path.iterdir()) == []


def test_privacy_defaults_to_none_and_composes():
    assert compose([]).privacy.name == "none"
    cfg = compose([*DP, "privacy.noise_multiplier=null", "privacy.target_epsilon=4"])
    pv = cfg.privacy
    assert (pv.name, pv.target_epsilon, pv.noise_multiplier) == ("dp_fedavg", 4.0, None)
    for method in ("fedprox", "fedadam"):  # any method, any runtime
        for runtime in ("serial", "ray"):
            got = compose([f"method={method}", f"runtime={runtime}", "privacy=dp_fedavg", *N100])
            assert got.privacy.name == "dp_fedavg" and got.runtime.executor == runtime


def test_poisson_cohorts_draw_each_client_with_rate_m_over_n():
    """fl.sampling=poisson: over many rounds each client joins at rate m/N, cohort sizes vary
    (Binomial(N, q): mean and variance within 5 standard errors), and a round repeats by seed."""
    s = FedAvgStrategy(FedAvgConfig(), 50, 5, seed=3, sampling=Sampling(poisson_rate=0.1))
    sizes = np.array([len(s.sample_clients(r, round_rng(3, r))) for r in range(1, 2001)])
    n, q, rounds = 50, 0.1, len(sizes)
    assert abs(sizes.mean() - n * q) < 5 * np.sqrt(n * q * (1 - q) / rounds)
    assert len(set(sizes.tolist())) > 3
    assert s.sample_clients(7, round_rng(3, 7)) == s.sample_clients(7, round_rng(3, 7))
