"""Every method on a toy model, 2 clients, 1 round, checked against an independent
computation: a plain PyTorch loop with the same seeds and the method's formula written
out by hand. Data: scikit-learn's digits (real, tiny). Plus a one-round smoke run of every
registered method through the CLI path.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning.config import compose
from fl_lightning.core.params import to_cpu, weighted_mean
from fl_lightning.core.strategy import OptimConfig, TaskInfo, round_rng
from fl_lightning.data.datasets import load_dataset
from fl_lightning.methods import METHODS
from fl_lightning.models import MODELS
from fl_lightning.runtime.host import ClientHost, ClientSpec
from fl_lightning.runtime.runner import start_run

from .conftest import small

LR, MOM, BS = 0.1, 0.9, 16


class Toy(nn.Module):
    """64 → 8 (BN, ReLU) → 10: small enough to check by hand, has BN for FedBN."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.feature_dim = 8
        self.head = nn.Linear(8, num_classes)

    def forward_features(self, x):
        return self.features(x)

    def forward_head(self, f):
        return self.head(f)

    def forward(self, x):
        return self.head(self.features(x))


if "toy" not in MODELS:
    MODELS.register("toy")(Toy)


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits", "")
    # two clients with different label mixes (skewed) and sizes
    idx0 = np.flatnonzero(ds.train_y < 6)[:70]
    idx1 = np.flatnonzero(ds.train_y >= 3)[:50]
    return ds, {0: idx0, 1: idx1}


def toy_spec(name: str, objective_kwargs: dict, init) -> ClientSpec:
    return ClientSpec(method=name, objective_kwargs=objective_kwargs, model="toy", model_kwargs={},
                      optim=OptimConfig(lr=LR, momentum=MOM), num_classes=10, in_channels=1, image_size=8,
                      batch_size=BS, threads=1, init_params=init, accelerator="cpu")  # fmt: skip


def one_round(name: str, digits, task_extra: dict | None = None, **method_kwargs):
    ds, shards = digits
    cls = METHODS.get(name)
    task = TaskInfo(num_classes=10, class_names=tuple(ds.class_names), dataset="digits",
                    has_client_test_split=True, **(task_extra or {}))  # fmt: skip
    strategy = cls(cls.config_cls(**method_kwargs), num_clients=2, clients_per_round=2, seed=0, task=task)
    torch.manual_seed(0)
    obj = cls.build_objective(Toy(), OptimConfig(lr=LR, momentum=MOM), **strategy.objective_kwargs())
    init = to_cpu(obj.model.state_dict())
    host = ClientHost(toy_spec(name, strategy.objective_kwargs(), init), ds, shards)
    state = strategy.init_state(init)
    plan = strategy.configure_round(state, 1, round_rng(0, 1))
    updates = sorted((host.fit(plan.broadcast, p) for p in plan.payloads), key=lambda u: u.client_id)
    new = strategy.server_update(strategy.aggregate(state, updates), updates)
    return strategy, plan, updates, new, init, obj


def manual_fit(model: nn.Module, x, y, seed: int, loss_fn, grad_hook=None) -> tuple[nn.Module, int]:
    """The same local training as the engine, written as a plain loop."""
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM)
    loader = DataLoader(TensorDataset(x, y), batch_size=BS, shuffle=True, generator=torch.Generator().manual_seed(seed))
    model.train()
    steps = 0
    for xb, yb in loader:
        opt.zero_grad()
        loss_fn(model, xb, yb).backward()
        if grad_hook:
            grad_hook(model)
        opt.step()
        steps += 1
    return model, steps


def client_data(digits, cid):
    ds, shards = digits
    return ds.tensors(ds.train_x[shards[cid]], ds.train_y[shards[cid]])


def manual_clients(digits, plan, init, loss_fn, grad_hook=None):
    out = []
    for p in plan.payloads:
        m = Toy()
        m.load_state_dict(init)
        out.append(manual_fit(m, *client_data(digits, p.client_id), p.seed, loss_fn, grad_hook))
    return out


def ce(m, x, y):
    return F.cross_entropy(m(x), y)


def close(a, b, atol=1e-5):
    for k in a:
        torch.testing.assert_close(a[k].float(), b[k].float(), atol=atol, rtol=1e-4, msg=k)


def test_fedavg_is_the_example_weighted_mean_of_plain_sgd(digits):
    _, plan, updates, new, init, _ = one_round("fedavg", digits)
    models = manual_clients(digits, plan, init, ce)
    expect = weighted_mean([to_cpu(m.state_dict()) for m, _ in models], [70, 50])
    close(new.global_params, expect)
    assert [u.num_examples for u in updates] == [70, 50]


def test_fedprox_mu0_equals_fedavg_and_mu_adds_the_proximal_term(digits):
    avg = one_round("fedavg", digits)[3].global_params
    prox0 = one_round("fedprox", digits, mu=0.0)[3].global_params
    for k in avg:
        assert torch.equal(avg[k], prox0[k]), k
    _, plan, _, new, init, _ = one_round("fedprox", digits, mu=0.5)
    w0 = [init[k] for k, _ in Toy().named_parameters()]

    def prox_loss(m, x, y):
        return ce(m, x, y) + 0.25 * sum(((p - a) ** 2).sum() for p, a in zip(m.parameters(), w0))

    expect = weighted_mean([to_cpu(m.state_dict()) for m, _ in manual_clients(digits, plan, init, prox_loss)], [70, 50])
    close(new.global_params, expect)
    assert not torch.allclose(new.global_params["head.weight"], avg["head.weight"])


def test_scaffold_control_variates(digits):
    strategy, plan, updates, new, init, _ = one_round("scaffold", digits)
    # Round 1: c = c_i = 0, so training is plain SGD and c_i+ = (x - y_i)/(K_i lr).
    models = manual_clients(digits, plan, init, ce)
    close(new.global_params, weighted_mean([to_cpu(m.state_dict()) for m, _ in models], [70, 50]))
    c_plus = []
    for (m, steps), u in zip(models, updates):
        expect = {k: (init[k] - p.detach()) / (steps * LR) for k, p in m.named_parameters()}
        close(u.client_state.c_local, expect)
        close(u.c_delta, expect)
        c_plus.append(expect)
    # server: c += |S|/N * mean(delta c) = mean of the two c_i+
    close(new.c_global, {k: (c_plus[0][k] + c_plus[1][k]) / 2 for k in c_plus[0]})
    # Round 2 applies the correction c - c_i to every gradient.
    plan2 = strategy.configure_round(new, 2, round_rng(0, 2))
    p0 = plan2.payloads[0]
    corr = {k: new.c_global[k] - p0.client_state.c_local[k] for k in new.c_global}
    m = Toy()
    m.load_state_dict(new.global_params)

    def hook(model):
        for k, p in model.named_parameters():
            p.grad.add_(corr[k])

    expect, _ = manual_fit(m, *client_data(digits, 0), p0.seed, ce, hook)
    ds, shards = digits
    got = ClientHost(toy_spec("scaffold", {}, init), ds, {0: shards[0]}).fit(plan2.broadcast, p0)
    close(got.params, to_cpu(expect.state_dict()))


def test_fednova_normalises_by_effective_steps(digits):
    from fl_lightning.methods.fednova import effective_steps

    _, plan, updates, new, init, _ = one_round("fednova", digits)
    models = manual_clients(digits, plan, init, ce)
    p = np.array([70, 50]) / 120
    a = [effective_steps(steps, MOM) for _, steps in models]
    assert [u.a for u in updates] == pytest.approx(a)
    assert a[0] != a[1]  # 5 vs 4 steps: this is where FedNova differs from FedAvg
    tau_eff = float(p @ np.array(a))
    for k, p_ in Toy().named_parameters():
        d = sum(pi * (init[k] - m.state_dict()[k]) / ai for pi, (m, _), ai in zip(p, models, a))
        torch.testing.assert_close(new.global_params[k], init[k] - tau_eff * d, atol=1e-5, rtol=1e-4)
    # batch-norm statistics are averaged as in FedAvg
    avg = weighted_mean([to_cpu(m.state_dict()) for m, _ in models], [70, 50])
    close({"features.2.running_mean": new.global_params["features.2.running_mean"]}, avg)
    assert effective_steps(5, 0.0) == 5.0


def test_fedbn_never_averages_batch_norm(digits):
    _, plan, updates, new, init, _ = one_round("fedbn", digits)
    models = manual_clients(digits, plan, init, ce)
    avg = weighted_mean([to_cpu(m.state_dict()) for m, _ in models], [70, 50])
    bn = [k for k in init if k.startswith("features.2.")]
    assert bn and all(k not in updates[0].params for k in bn)  # never uploaded
    for k in bn:
        assert torch.equal(new.global_params[k], init[k])  # global BN untouched
        for (m, _), u in zip(models, updates):  # each client keeps its own
            torch.testing.assert_close(u.client_state.personal_params[k].float(), m.state_dict()[k].float(), atol=1e-5, rtol=1e-4)
    close({k: v for k, v in new.global_params.items() if k not in bn}, {k: v for k, v in avg.items() if k not in bn})
    assert new.client_states[0].personal_params and new.client_states[1].personal_params


def test_fedlc_calibrates_logits_by_local_counts(digits):
    from fl_lightning.methods.fedlc import calibrated_logits

    _, plan, _, new, init, _ = one_round("fedlc", digits, tau=1.0)
    ds, shards = digits
    models = []
    for p in plan.payloads:
        counts = torch.bincount(torch.as_tensor(ds.train_y[shards[p.client_id]]), minlength=10)
        m = Toy()
        m.load_state_dict(init)

        def loss(m, x, y, counts=counts):
            shift = counts.float().clamp(min=1) ** -0.25
            logits = (m(x) - shift).masked_fill(counts == 0, float("-inf"))
            return F.cross_entropy(logits, y)

        models.append(manual_fit(m, *client_data(digits, p.client_id), p.seed, loss))
    close(new.global_params, weighted_mean([to_cpu(m.state_dict()) for m, _ in models], [70, 50]))
    z = calibrated_logits(torch.zeros(1, 3), torch.tensor([16, 1, 0]), 1.0)
    assert z[0, 0] == -0.5 and z[0, 1] == -1.0 and z[0, 2] == float("-inf")


def test_moon_adds_the_model_contrastive_term(digits):
    _, plan, updates, new, init, _ = one_round("moon", digits, mu=1.0, temperature=0.5)
    glob = Toy()
    glob.load_state_dict(init)
    glob.eval()

    def loss(m, x, y):
        z = m.forward_features(x)
        with torch.no_grad():
            zg = glob.forward_features(x)  # first round: previous model = global model
        sims = torch.stack([F.cosine_similarity(z, zg, -1), F.cosine_similarity(z, zg, -1)], 1) / 0.5
        return F.cross_entropy(m.head(z), y) + F.cross_entropy(sims, torch.zeros(len(x), dtype=torch.long))

    models = manual_clients(digits, plan, init, loss)
    close(new.global_params, weighted_mean([to_cpu(m.state_dict()) for m, _ in models], [70, 50]))
    for (m, _), u in zip(models, updates):  # the previous local model is kept as client state
        close(u.client_state.prev_params, to_cpu(m.state_dict()))


def test_moon_round_two_pulls_to_global_and_pushes_from_previous(digits):
    """In round 1 previous = global, so the term is log 2 with zero gradient; round 2 is
    where it acts: check it against the formula with both frozen models."""
    strategy, _, _, state1, init, _ = one_round("moon", digits, mu=1.0, temperature=0.5)
    plan2 = strategy.configure_round(state1, 2, round_rng(0, 2))
    p0 = plan2.payloads[0]
    glob, prev = Toy(), Toy()
    glob.load_state_dict(state1.global_params)
    prev.load_state_dict(p0.client_state.prev_params)
    glob.eval(), prev.eval()

    def loss(m, x, y):
        z = m.forward_features(x)
        with torch.no_grad():
            zg, zp = glob.forward_features(x), prev.forward_features(x)
        sims = torch.stack([F.cosine_similarity(z, zg, -1), F.cosine_similarity(z, zp, -1)], 1) / 0.5
        return F.cross_entropy(m.head(z), y) + F.cross_entropy(sims, torch.zeros(len(x), dtype=torch.long))

    m = Toy()
    m.load_state_dict(state1.global_params)
    expect, _ = manual_fit(m, *client_data(digits, 0), p0.seed, loss)
    ds, shards = digits
    got = ClientHost(toy_spec("moon", strategy.objective_kwargs(), init), ds, {0: shards[0]}).fit(plan2.broadcast, p0)
    close(got.params, to_cpu(expect.state_dict()))
    plain = one_round("fedavg", digits)[3].global_params  # the term changes the result
    assert not torch.allclose(got.params["head.weight"], plain["head.weight"])


def test_fedproto_prototypes_and_their_aggregation(digits):
    _, plan, updates, new, init, _ = one_round("fedproto", digits, lam=1.0)
    assert updates[0].params is None  # personal models: no weights leave the client
    ds, shards = digits
    protos, counts = [], []
    for p, u in zip(plan.payloads, updates):
        m = Toy()
        m.load_state_dict(init)
        feats = []

        def loss(m, x, y, feats=feats):  # round 1: no global prototypes yet
            z = m.forward_features(x)
            feats.append((z.detach(), y))
            return F.cross_entropy(m.head(z), y)

        manual_fit(m, *client_data(digits, p.client_id), p.seed, loss)
        z = torch.cat([f for f, _ in feats])
        y = torch.cat([t for _, t in feats])
        n = torch.bincount(y, minlength=10)
        mean = torch.stack([z[y == c].mean(0) if n[c] else torch.zeros(8) for c in range(10)])
        torch.testing.assert_close(u.prototypes, mean, atol=1e-5, rtol=1e-4)
        assert torch.equal(u.proto_counts, n)
        protos.append(mean)
        counts.append(n)
    total = counts[0] + counts[1]
    expect = (protos[0] * counts[0][:, None] + protos[1] * counts[1][:, None]) / total.clamp(min=1)[:, None]
    torch.testing.assert_close(new.prototypes, expect, atol=1e-5, rtol=1e-4)
    assert torch.equal(new.proto_counts, total)


def test_fedglcl_logits_are_cosine_to_class_text_over_tau(digits):
    strategy, plan, updates, new, init, obj = one_round("fedglcl", digits)
    T = strategy.class_features
    assert T.shape == (10, 384) and torch.allclose(T.norm(dim=1), torch.ones(10), atol=1e-5)
    assert set(init) == set(obj.model.state_dict()) and "head.0.weight" in init  # projector, no classifier
    assert init["head.0.weight"].shape == (384, 8)

    def make():
        m = Toy()
        m.head = copy.deepcopy(obj.model.head)
        m.load_state_dict(init)
        return m

    def loss(m, x, y):
        logits = F.normalize(m(x), dim=-1) @ T.T / 0.07
        return F.cross_entropy(logits, y)

    models = []
    for p in plan.payloads:
        models.append(manual_fit(make(), *client_data(digits, p.client_id), p.seed, loss))
    close(new.global_params, weighted_mean([to_cpu(m.state_dict()) for m, _ in models], [70, 50]))
    # prediction = nearest class text
    obj.begin_round(strategy.eval_broadcast(new), None)
    obj.eval()
    x, _ = client_data(digits, 0)
    with torch.no_grad():
        emb = F.normalize(obj.model(x[:5]), dim=-1)
        assert torch.equal(obj(x[:5]).argmax(1), (emb @ T.T).argmax(1))


def test_fedglcl_random_and_orthogonal_class_vectors(digits):
    rand = one_round("fedglcl", digits, class_embedding="orthogonal")[0].class_features
    torch.testing.assert_close(rand @ rand.T, torch.eye(10), atol=1e-5, rtol=0)
    text = one_round("fedglcl", digits)[0].class_features
    assert not torch.allclose(rand, text)


SMOKE = {
    "fedbn": ["model=cnn_bn", "data.client_test_fraction=0.25"],
    "fedproto": ["data.client_test_fraction=0.25"],
    # heterogeneous-model methods: personal models of a model family (tests/test_fedtsp.py)
    **{m: ["model=htfe_cnn3", "data.client_test_fraction=0.25", "optim.lr=0.01"]
       for m in ("fedtsp", "feddistill", "lg_fedavg", "local")},
    "fedtgp": ["model=htfe_cnn3", "data.client_test_fraction=0.25", "optim.lr=0.01", "method.server_epochs=5"],
}


@pytest.mark.parametrize("method", METHODS.names())
def test_every_method_runs_one_round(method, tmp_path, data_root):
    cfg = compose(small(tmp_path, f"method={method}", "runtime=serial", "fl.rounds=1", "fl.num_clients=2",
                        "data.train_subset=400", "data.test_subset=200", *SMOKE.get(method, [])))  # fmt: skip
    summary, run_dir = start_run(cfg, console=False)
    assert summary["rounds_completed"] == 1 and summary["method"] == method
    assert 0.0 <= summary["final_accuracy"] <= 1.0


def test_personalised_methods_need_client_test_splits(tmp_path, capsys):
    from fl_lightning.cli import main

    assert main(["run", "method=fedbn", "model=cnn_bn", "runtime=serial", f"output_dir={tmp_path}"]) == 2
    assert "set data.client_test_fraction" in capsys.readouterr().err
    assert main(["run", "method=fedbn", "data.client_test_fraction=0.25", "runtime=serial", f"output_dir={tmp_path}"]) == 2
    assert "fedbn needs a model with batch norm" in capsys.readouterr().err


def test_fedproto_round_two_regularises_towards_global_prototypes(digits):
    strategy, _, _, state1, init, _ = one_round("fedproto", digits, lam=1.0)
    plan2 = strategy.configure_round(state1, 2, round_rng(0, 2))
    p1 = plan2.payloads[1]
    P, has = state1.prototypes, state1.proto_counts > 0

    def loss(m, x, y):
        z = m.forward_features(x)
        keep = has[y]
        return F.cross_entropy(m.head(z), y) + F.mse_loss(z[keep], P[y[keep]])

    m = Toy()
    m.load_state_dict(p1.client_state.personal_params)  # personal model from round 1
    expect, _ = manual_fit(m, *client_data(digits, 1), p1.seed, loss)
    ds, shards = digits
    got = ClientHost(toy_spec("fedproto", strategy.objective_kwargs(), init), ds, {1: shards[1]}).fit(plan2.broadcast, p1)
    close(got.client_state.personal_params, to_cpu(expect.state_dict()))
    assert plan2.broadcast.global_params is None and plan2.broadcast.nbytes() == P.numel() * 4 + 10 * 8


def test_a_last_batch_of_one_sample_is_dropped_not_fatal(digits):
    """Batch norm cannot train on one sample: 33 examples with batch 16 must still fit."""
    ds, shards = digits
    strategy, plan, _, _, init, _ = one_round("fedavg", digits)
    host = ClientHost(toy_spec("fedavg", strategy.objective_kwargs(), init), ds, {0: shards[0][:33]})
    update = host.fit(plan.broadcast, plan.payloads[0])
    assert update.num_examples == 33 and update.metrics["train_loss"] > 0
