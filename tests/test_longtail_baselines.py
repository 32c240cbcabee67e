"""The long-tail baselines of CLIP2FL's table (issue 11, item 5): FedAvgM, Fed-Focal,
FedAvg + τ-norm, CCVR. Each against a plain PyTorch computation written out here, in
float32 and float64 (`twin`), compared with `match` (tolerances from the arithmetic, see
tests/test_methods.py). Mutations tried by hand are listed in each docstring.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.config import compose, validate_registered
from fl_lightning.core.errors import ConfigError
from fl_lightning.core.metrics import EvalSpec
from fl_lightning.core.objective import evaluate
from fl_lightning.core.params import weighted_mean
from fl_lightning.core.strategy import OptimConfig, TaskInfo, server_rng
from fl_lightning.runtime import checkpoint
from fl_lightning.testing import loop

from . import test_methods
from .test_methods import (
    LR,
    MOM,
    Toy,
    ce,
    client_data,
    manual_clients,
    match,
    mean_of_clients,
    one_round,
    sd,
    twin,
)

digits = test_methods.digits  # the fixture: 2 clients of scikit-learn's digits


@pytest.fixture(scope="module")
def digits3(digits):
    """Three clients (70, 50, 40 examples): two per round, so rounds differ in who trains."""
    ds, shards = digits
    return ds, {**shards, 2: np.flatnonzero(ds.train_y % 2 == 0)[100:140]}


def run_rounds(name: str, data, rounds: int, per_round: int = 2, server_images=None, **method_kwargs):
    """`rounds` rounds of method `name` on the toy model through the run's own loop
    (`fl_lightning.testing.loop`), SGD with momentum; (strategy, init, objective, history) with
    history = [(plan, updates, state after the round, server metrics)]. `server_images`: the
    server's unlabeled images (`ServerContext.unlabeled`)."""
    ds = data[0]
    task = TaskInfo(num_classes=10, class_names=tuple(ds.class_names), dataset="digits")
    r = loop(name, data, method=method_kwargs, rounds=rounds, clients_per_round=per_round, task=task,
             optim=OptimConfig(lr=LR, momentum=MOM), unlabeled=server_images)  # fmt: skip
    history = list(zip(r.plans, r.updates, r.states, r.metrics, strict=True))
    return r.strategy, r.init, r.objective, history


# --- FedAvgM ----------------------------------------------------------------------------
def test_fedavgm_server_momentum_over_two_rounds_of_partial_participation(digits3, tmp_path):
    """v ← β·v + (w − mean), w ← w − η_s·v, the velocity carried from round 1 into round 2
    with a different pair of clients. Mutations caught: β·v dropped (no momentum), η_s
    dropped, the sign of Δ flipped, momentum applied to the BN statistics too."""
    beta, lr_s = 0.9, 0.7
    _, init, _, history = run_rounds("fedavgm", digits3, 2, server_momentum=beta, server_lr=lr_s)
    plans = [h[0] for h in history]
    assert plans[0].client_ids != plans[1].client_ids  # partial participation: 2 of 3
    _, shards = digits3

    def expect(dt):
        w = {k: v.to(dt) if v.is_floating_point() else v for k, v in init.items()}
        vel: dict[str, torch.Tensor] = {}
        for plan in plans:
            models = [sd(m) for m, _ in manual_clients(digits3, plan, w, ce, dtype=dt)]
            mean = weighted_mean(models, [len(shards[c]) for c in plan.client_ids])
            new = dict(mean)  # BN statistics: the plain average
            for k, _ in Toy().named_parameters():
                vel[k] = beta * vel[k] + (w[k] - mean[k]) if k in vel else w[k] - mean[k]
                new[k] = w[k] - lr_s * vel[k]
            w = new
        return w, vel

    (w32, v32), (w64, v64) = twin(expect)
    state = history[-1][2]
    match(state.global_params, (w32, w64))
    match(state.velocity, (v32, v64))
    assert set(state.velocity) == {k for k, _ in Toy().named_parameters()}
    # the velocity is server state: a checkpoint round-trip keeps it bit for bit
    back, _, _ = checkpoint.load(checkpoint.save(tmp_path, state, {}).with_suffix(".json"))
    assert type(back).__name__ == "FedAvgMState"
    assert all(torch.equal(back.velocity[k], state.velocity[k]) for k in state.velocity)


def test_fedavgm_without_momentum_is_fedavg(digits):
    avg = one_round("fedavg", digits)[3].global_params
    m0 = one_round("fedavgm", digits, server_momentum=0.0, server_lr=1.0)[3].global_params
    match(m0, ({k: v for k, v in avg.items()},) * 2)  # w − (w − mean): the mean, to ulps


# --- Fed-Focal --------------------------------------------------------------------------
def test_fedfocal_trains_on_the_focal_loss(digits):
    """Mutations caught: (1 − p)^γ → p^γ, γ dropped (plain CE), the sum instead of the mean."""
    _, plan, _, new, init, _ = one_round("fedfocal", digits, gamma=2.0)

    def focal(m, x, y):
        p = torch.softmax(m(x), dim=1)[torch.arange(len(y)), y]
        return (-((1 - p) ** 2) * torch.log(p)).mean()

    match(new.global_params, mean_of_clients(digits, plan, init, focal))
    avg = one_round("fedavg", digits)[3].global_params
    g0 = one_round("fedfocal", digits, gamma=0.0)[3].global_params
    assert all(torch.equal(avg[k], g0[k]) for k in avg)  # γ = 0: FedAvg bit for bit
    assert not torch.allclose(new.global_params["head.weight"], avg["head.weight"])


# --- FedAvg + τ-norm --------------------------------------------------------------------
def test_taunorm_trains_fedavg_and_predicts_with_normalised_class_weights(digits):
    """Mutations caught: ||w||^τ multiplied instead of divided, τ dropped (unit norms),
    the norm over the wrong axis (per feature instead of per class)."""
    strategy, _, _, new, _, obj = one_round("taunorm", digits, tau=0.7)
    avg = one_round("fedavg", digits)[3].global_params
    assert all(torch.equal(avg[k], new.global_params[k]) for k in avg)  # training is FedAvg
    obj.begin_round(strategy.eval_broadcast(new), None)
    obj.eval()
    x, y = client_data(digits, 1)

    def scores(dt):
        m = Toy().to(dt)
        m.load_state_dict(new.global_params)
        m.eval()
        w, b = m.head.weight, m.head.bias
        with torch.no_grad():
            return {
                "tau": m.features(x.to(dt)) @ (w / torch.sqrt((w**2).sum(1, keepdim=True)) ** 0.7).T + b,
                "plain": m(x.to(dt)),
            }

    ref = twin(scores)
    with torch.no_grad():
        heads = obj.eval_heads()
        match({"tau": heads[""](x), "plain": heads["fedavg_head"](x)}, ref)
    got = evaluate(obj, x, y, EvalSpec(num_classes=10))
    assert got["accuracy"] == pytest.approx(float((ref[1]["tau"].argmax(1) == y).double().mean()), abs=1e-12)
    assert "fedavg_head/accuracy" in got
    assert not torch.equal(ref[1]["tau"].argmax(1), ref[1]["plain"].argmax(1))  # τ-norm changes predictions
    from fl_lightning.methods.taunorm import last_linear

    assert last_linear(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3))) == "2."


# --- CCVR -------------------------------------------------------------------------------
CCVR_KW = dict(
    virtual_per_class=20, retrain_epochs=3, retrain_lr=0.05, retrain_momentum=0.9, retrain_batch_size=16
)


def test_ccvr_statistics_pooling_sampling_and_calibration(digits):
    """Clients' per-class feature statistics (received model, eval mode), their pooling
    (CCVR Eq. 3-4 equals the mean/covariance of all features together), the virtual
    features and the head re-trained on them, and that prediction uses that head.
    Mutations caught: biased covariance (n for n−1), features of the trained instead of
    the received model, the μμᵀ correction dropped from the pooling, √λ → λ in sampling,
    the FedAvg head not loaded before re-training, the wrong head at prediction."""
    strategy, plan, updates, new, init, obj = one_round("ccvr", digits, **CCVR_KW)
    avg = one_round("fedavg", digits)[3].global_params
    assert all(torch.equal(avg[k], new.global_params[k]) for k in avg)  # training is FedAvg

    def features(dt):  # the received (initial) model's features, per client
        m = Toy().to(dt)
        m.load_state_dict(init)
        m.eval()
        with torch.no_grad():
            return [(m.features(client_data(digits, c)[0].to(dt)), client_data(digits, c)[1]) for c in (0, 1)]

    def stats(dt):
        out = {}
        for i, (z, y) in enumerate(features(dt)):
            for c in range(10):
                zc = z[y == c].double()
                out[f"{i}/mean/{c}"] = zc.mean(0) if len(zc) else torch.zeros(8, dtype=torch.float64)
                out[f"{i}/cov/{c}"] = (
                    torch.cov(zc.T) if len(zc) > 1 else torch.zeros(8, 8, dtype=torch.float64)
                )
        return out

    ref = twin(stats)
    got = {}
    for i, u in enumerate(updates):
        assert torch.equal(u.counts, torch.bincount(client_data(digits, i)[1], minlength=10))
        got.update(
            {f"{i}/mean/{c}": u.means[c] for c in range(10)} | {f"{i}/cov/{c}": u.covs[c] for c in range(10)}
        )
    match(got, ref)
    n_params = sum(v.numel() * v.element_size() for v in updates[0].params.values())
    assert (
        updates[0].upload_nbytes() == n_params + (10 * 8 + 10 * 64) * 8 + 10 * 8
    )  # float64 stats, int64 counts

    # pooling: the engine's formula on the float64 per-client statistics = the statistics of all
    # features at once (float64: ulps)
    from fl_lightning.methods.ccvr import pool_class_stats, sample_virtual

    (z0, y0), (z1, y1) = features(torch.float64)
    z, y = torch.cat([z0, z1]), torch.cat([y0, y1])
    ref64 = stats(torch.float64)
    mu, cov, total = pool_class_stats(
        [torch.stack([ref64[f"{i}/mean/{c}"] for c in range(10)]) for i in (0, 1)],
        [torch.stack([ref64[f"{i}/cov/{c}"] for c in range(10)]) for i in (0, 1)],
        [torch.bincount(t, minlength=10) for t in (y0, y1)],
    )
    for c in range(10):
        whole = {"mu": z[y == c].mean(0), "cov": torch.cov(z[y == c].T)}
        match({"mu": mu[c], "cov": cov[c]}, (whole, whole))

    # calibration, written out: the same random stream (server_rng → generator), the engine's
    # pooled statistics, then plain SGD on the virtual features from the FedAvg head
    mu, cov, total = pool_class_stats([u.means for u in updates], [u.covs for u in updates],
                                      [u.counts for u in updates])  # fmt: skip
    kw = CCVR_KW

    def calibrate(dt):
        rng = server_rng(0, 1)
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        feats, labels = [], []
        for c in range(10):
            if total[c] == 0:
                continue
            lam, vec = torch.linalg.eigh(cov[c])
            eps = torch.randn(kw["virtual_per_class"], 8, generator=gen, dtype=torch.float64)
            feats.append(mu[c] + eps @ torch.diag(lam.clamp(min=0).sqrt()) @ vec.T)
            labels += [c] * kw["virtual_per_class"]
        zv, yv = torch.cat(feats).to(dt), torch.tensor(labels)
        head = nn.Linear(8, 10).to(dt)
        head.load_state_dict({k[5:]: v for k, v in new.global_params.items() if k.startswith("head.")})
        opt = torch.optim.SGD(head.parameters(), lr=kw["retrain_lr"], momentum=kw["retrain_momentum"])
        for _ in range(kw["retrain_epochs"]):
            order = torch.randperm(len(yv), generator=gen)
            for i in range(0, len(yv), kw["retrain_batch_size"]):
                idx = order[i : i + kw["retrain_batch_size"]]
                opt.zero_grad()
                F.cross_entropy(head(zv[idx]), yv[idx]).backward()
                opt.step()
        return {f"head.{k}": v for k, v in head.state_dict().items()}

    match(new.head, twin(calibrate))
    assert not torch.allclose(new.head["head.weight"], new.global_params["head.weight"])

    # prediction: the calibrated head on the FedAvg extractor; fedavg_head logged beside it
    obj.begin_round(strategy.eval_broadcast(new), None)
    obj.eval()
    x, _ = client_data(digits, 0)
    m = Toy()
    m.load_state_dict(new.global_params | new.head)
    m.eval()
    with torch.no_grad():
        heads = obj.eval_heads()
        assert set(heads) == {"", "fedavg_head"}
        match({"s": heads[""](x)}, ({"s": m(x)},) * 2)
    assert strategy.broadcast(new, 2).nbytes() == sum(v.numel() * v.element_size() for v in avg.values())
    assert sample_virtual is not None


def test_ccvr_virtual_features_follow_the_pooled_gaussian():
    """N(μ, Σ) with a singular Σ (rank 2 in 3 dimensions): the sample mean and covariance
    lie within 5 standard errors of μ and Σ. Mutations caught: √λ → λ, Vᵀ for V."""
    from fl_lightning.methods.ccvr import sample_virtual

    a = torch.tensor([[2.0, 0.0], [1.0, 1.0], [0.0, -3.0]], dtype=torch.float64)
    cov = (a @ a.T)[None]
    mu = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    n = 20000
    z, y = sample_virtual(mu, cov, torch.tensor([5]), n, torch.Generator().manual_seed(0))
    assert z.shape == (n, 3) and torch.equal(y, torch.zeros(n, dtype=torch.long))
    d = torch.diagonal(cov[0])
    assert ((z.mean(0) - mu[0]).abs() <= 5 * (d / n).sqrt()).all()
    se = ((d[:, None] * d[None, :] + cov[0] ** 2) / n).sqrt()  # standard error of each covariance entry
    assert ((torch.cov(z.T) - cov[0]).abs() <= 5 * se).all()


# --- configuration ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "method,kwargs,message",
    [
        ("fedavgm", {"server_momentum": 1.0}, "method.server_momentum must be in [0, 1)"),
        ("fedavgm", {"server_lr": 0.0}, "method.server_lr must be > 0"),
        ("fedfocal", {"gamma": -1.0}, "method.gamma must be >= 0"),
        ("taunorm", {"tau": -0.5}, "method.tau must be >= 0"),
        ("ccvr", {"virtual_per_class": 0}, "method.virtual_per_class must be >= 1"),
        ("ccvr", {"retrain_lr": 0.0}, "ccvr needs method.retrain_lr > 0"),
        ("ccvr", {"init_head": "zero"}, "method.init_head='zero' is not one of: fedavg, fresh"),
    ],
)
def test_bad_values_are_one_line_config_errors(method, kwargs, message):
    """Refused by the checks that run before any data loads (`validate_registered`)."""
    cfg = compose([f"method={method}", *(f"method.{k}={v}" for k, v in kwargs.items())])
    with pytest.raises(ConfigError) as err:
        validate_registered(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("method", ["fedfocal", "ccvr", "creff"])
def test_single_label_methods_refuse_multilabel_data(method):
    cfg = compose([f"method={method}", "data=fmnist_multilabel"])
    with pytest.raises(ConfigError, match="single-label"):
        validate_registered(cfg)
