"""Every method on a toy model, 2 clients, 1 round, checked against an independent
computation: a plain PyTorch loop with the same seeds and the method's formula written
out by hand. Data: scikit-learn's digits (real, tiny). Plus a one-round smoke run of every
registered method through the CLI path.

Tolerances (`match`): the reference runs twice, in float32 and in float64, on one thread
like the engine's fits (`threads=1`). The engine's float32 result must lie within 16× the
float32 reference's own relative rounding error (|ref32 − ref64| / |ref64|, the largest
over the state) of the float64 result, plus 4 ulps: the bound follows from the arithmetic
of this very computation (steps, learning rate, stiffness of the loss) on the machine
running it, not from one machine's numbers. Two float32 runs of the same computation
that differ only in kernel order (thread counts, memory alignment) differ by about that
error: same thread count, same kernels, they agree bit for bit here; with the reference on
8 threads instead of 1 the engine was up to 5.6× the reference's own error away (FedTSP),
so 16 leaves a factor 3. A dropped factor or a flipped sign moved the result by 2,500× to
1,000,000× the tolerance (17 mutations of the formulas, by monkeypatching: every one failed).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.core.params import to_cpu
from fl_lightning.core.strategy import OptimConfig, TaskInfo, round_rng
from fl_lightning.methods import METHODS
from fl_lightning.runtime.host import ClientHost
from fl_lightning.testing import (  # noqa: F401  (also what the other golden tests import from here)
    BS,
    EPS32,
    LR,
    MOM,
    SIZES3,
    Toy,
    cast,
    ce,
    client_data,
    ctx,
    example_mean,
    f32_tolerances,
    manual_fit,
    match,
    sd,
    three_clients,
    toy_spec,
    train,
    twin,
    two_clients,
    two_rounds,
    written_mean,
)


@pytest.fixture(scope="module")
def digits():
    """two clients with different label mixes (skewed) and sizes (70, 50)"""
    return two_clients()


@pytest.fixture(scope="module")
def digits3():
    """three clients of different sizes for two rounds with partial participation
    (`fl_lightning.testing.two_rounds`)"""
    ds, shards = three_clients()
    assert {c: len(i) for c, i in shards.items()} == SIZES3
    return ds, shards


class RoundResult(tuple):
    """(strategy, plan, updates, new state, init, objective), plus `.host`: the host that
    ran the clients and keeps their resident state."""

    host: ClientHost


def one_round(name: str, digits, task_extra: dict | None = None, momentum: float = MOM, **method_kwargs):
    ds, shards = digits
    cls = METHODS.get(name)
    task = TaskInfo(num_classes=10, class_names=tuple(ds.class_names), dataset="digits",
                    has_client_test_split=True, **(task_extra or {}))  # fmt: skip
    strategy = cls(cls.config_cls(**method_kwargs), num_clients=2, clients_per_round=2, seed=0, task=task)
    torch.manual_seed(0)
    obj = cls.build_objective(Toy(), OptimConfig(lr=LR, momentum=momentum), **strategy.objective_kwargs())
    init = to_cpu(obj.model.state_dict())
    host = ClientHost(toy_spec(name, strategy.objective_kwargs(), init, momentum), ds, shards)
    state = strategy.init_state(init)
    plan = strategy.configure_round(state, 1, round_rng(0, 1))
    updates = sorted((host.fit(plan.broadcast, p) for p in plan.payloads), key=lambda u: u.client_id)
    new, _ = strategy.server_update(strategy.aggregate(state, updates), updates, ctx(strategy))
    out = RoundResult((strategy, plan, updates, new, init, obj))
    out.host = host
    return out


def manual_clients(digits, plan, init, loss_fn, grad_hook=None, dtype=torch.float32, momentum=MOM):
    out = []
    for p in plan.payloads:
        m = Toy().to(dtype)
        m.load_state_dict(init)
        out.append(manual_fit(m, *client_data(digits, p.client_id), p.seed, loss_fn, grad_hook, momentum))
    return out


def mean_of_clients(digits, plan, init, loss_fn, grad_hook=None, momentum=MOM):
    """The reference global model: the example-weighted mean of the hand-written clients."""
    return twin(
        lambda dt: written_mean(
            [sd(m) for m, _ in manual_clients(digits, plan, init, loss_fn, grad_hook, dt, momentum)], [70, 50]
        )
    )


def test_fedavg_is_the_example_weighted_mean_of_plain_sgd(digits):
    """Mutations caught: sum instead of mean, uniform instead of example weights."""
    _, plan, updates, new, init, _ = one_round("fedavg", digits)
    match(new.global_params, mean_of_clients(digits, plan, init, ce))
    assert [u.num_examples for u in updates] == [70, 50]


def test_fedavg_two_rounds_with_partial_participation(digits3):
    """Both rounds written out, |S| = 2 of N = 3 clients of sizes 70, 50, 40: each round's model
    is Σ n_k y_k / Σ n_k over that round's clients only (round 2: clients 0 and 2). Mutations
    caught (in `weighted_mean` or in the strategy's weights): uniform weights, the sum not
    divided by Σ n_k, integer buffers truncated instead of rounded."""
    init, plans, states, _ = two_rounds("fedavg", digits3)

    def reference(dt):
        x, rounds = cast(init, dt), []
        for plan in plans:
            ys = []
            for p in plan.payloads:
                m = Toy().to(dt)
                m.load_state_dict(x)
                m, _ = manual_fit(m, *client_data(digits3, p.client_id), p.seed, ce, momentum=0.0)
                ys.append((p.client_id, sd(m)))
            x = {k: example_mean(ys, k, dt) for k in x}
            rounds.append(x)
        return rounds

    r32, r64 = twin(reference)
    for rnd in (0, 1):
        match(states[rnd].global_params, (r32[rnd], r64[rnd]))
    # 5 and 4 steps at batch 16 in round 1: (70·5 + 50·4)/120 = 4.58 -> 5 (truncated: 4)
    assert int(states[0].global_params["features.2.num_batches_tracked"]) == 5


def test_fedprox_mu0_equals_fedavg_and_mu_adds_the_proximal_term(digits):
    """Mutations caught: mu instead of mu/2, a sign flip of the proximal term."""
    avg = one_round("fedavg", digits)[3].global_params
    prox0 = one_round("fedprox", digits, mu=0.0)[3].global_params
    for k in avg:
        assert torch.equal(avg[k], prox0[k]), k
    _, plan, _, new, init, _ = one_round("fedprox", digits, mu=0.5)
    w0 = [init[k] for k, _ in Toy().named_parameters()]

    def prox_loss(m, x, y):
        return ce(m, x, y) + 0.25 * sum(
            ((p - a) ** 2).sum() for p, a in zip(m.parameters(), w0, strict=False)
        )

    match(new.global_params, mean_of_clients(digits, plan, init, prox_loss))
    assert not torch.allclose(new.global_params["head.weight"], avg["head.weight"])


def test_scaffold_control_variates(digits):
    """SCAFFOLD with its own optimiser, plain SGD (momentum 0). Mutations caught: c_i - c
    for c - c_i, K·lr dropped from c_i+, |S|/N dropped from the server step."""
    r = one_round("scaffold", digits, momentum=0.0)
    strategy, plan, updates, new, init, _ = r

    def clients(dt):
        return [(sd(m), k) for m, k in manual_clients(digits, plan, init, ce, dtype=dt, momentum=0.0)]

    (m32, m64) = twin(clients)
    match(new.global_params, (written_mean([m for m, _ in m32], [70, 50]),
                              written_mean([m for m, _ in m64], [70, 50])))  # fmt: skip
    # Round 1: c = c_i = 0, so training is plain SGD and c_i+ = (x - y_i)/(K_i lr): the mean
    # of the K_i gradients applied. Checked on the engine's own y_i (its upload, matched to
    # the reference first), in float64: the engine's float32 c_i+ is that arithmetic
    # rounded once (4 ulps). A variate whose exact value is 0 (the bias before batch norm)
    # is float32 noise / (K lr): only the identity can check it.
    names = [k for k, _ in Toy().named_parameters()]
    c_plus = []
    for i, u in enumerate(updates):
        match(u.params, ({k: m32[i][0][k] for k in u.params}, {k: m64[i][0][k] for k in u.params}))
        steps = m64[i][1]
        expect = {k: (init[k].double() - u.params[k].double()) / (steps * LR) for k in names}
        for got in (r.host.states[u.client_id]["scaffold/c_local"], u.c_delta):
            for k in names:
                match({k: got[k]}, ({k: expect[k]},) * 2)
        c_plus.append(expect)
    # server: c += |S|/N * mean(delta c) = mean of the two c_i+
    for k in names:
        mean = (c_plus[0][k] + c_plus[1][k]) / 2
        match({k: new.c_global[k]}, ({k: mean},) * 2)
    # Round 2 applies the correction c - c_i to every gradient.
    plan2 = strategy.configure_round(new, 2, round_rng(0, 2))
    p0 = plan2.payloads[0]
    corr = {k: new.c_global[k] - r.host.states[0]["scaffold/c_local"][k] for k in new.c_global}

    def hook(model):
        for k, p in model.named_parameters():
            p.grad.add_(corr[k])

    def round2(dt):
        m = Toy().to(dt)
        m.load_state_dict(new.global_params)
        return sd(manual_fit(m, *client_data(digits, 0), p0.seed, ce, hook, momentum=0.0)[0])

    ds, shards = digits
    host = ClientHost(toy_spec("scaffold", {}, init, momentum=0.0), ds, {0: shards[0]})
    host.set_states({0: r.host.states[0]})  # client 0's c_i from round 1
    got = host.fit(plan2.broadcast, p0)
    match(got.params, twin(round2))


def test_scaffold_two_rounds_with_partial_participation(digits3):
    """Both rounds written out, with |S| = 2 of N = 3 clients: round 2 corrects every gradient
    by c − c_i with c ≠ 0 and, for client 0, c_i ≠ 0 (its variate from round 1; client 2's is
    still 0), and sets c_i⁺ = c_i − c + (x − y_i)/(K_i·lr); the server moves c by
    (|S|/N)·mean(Δc_i). Mutations caught: c − c_i flipped (in the correction or in c_i⁺), |S|/N
    dropped, K·lr dropped, c_i⁺ not kept for the next round.

    The pre-batch-norm bias has a gradient of exactly 0, so its variate is float32 noise/(K·lr):
    no relative tolerance fits it, it is checked to stay at noise level (every other variate is
    checked against the reference); its weight is checked with the others."""
    init, plans, states, host = two_rounds("scaffold", digits3)
    names = [k for k, _ in Toy().named_parameters()]
    noise = "features.1.bias"

    def reference(dt):
        x, c, ci, rounds = cast(init, dt), {k: torch.zeros_like(init[k], dtype=dt) for k in names}, {}, []
        for plan in plans:
            ys, deltas = [], []
            for p in plan.payloads:
                c_i = ci.get(p.client_id, {k: torch.zeros_like(c[k]) for k in names})
                corr = {k: c[k] - c_i[k] for k in names}

                def hook(model, corr=corr):
                    for k, q in model.named_parameters():
                        q.grad.add_(corr[k])

                m = Toy().to(dt)
                m.load_state_dict(x)
                m, steps = manual_fit(m, *client_data(digits3, p.client_id), p.seed, ce, hook, momentum=0.0)
                y = sd(m)
                plus = {k: c_i[k] - c[k] + (x[k] - y[k]) / (steps * LR) for k in names}
                deltas.append({k: plus[k] - c_i[k] for k in names})
                ci[p.client_id] = plus
                ys.append((p.client_id, y))
            x = {k: example_mean(ys, k, dt) for k in x}
            c = {k: c[k] + len(deltas) / 3 * sum(d[k] for d in deltas) / len(deltas) for k in names}
            rounds.append((x, c))
        return rounds, ci

    (r32, ci32), (r64, ci64) = twin(reference)

    def real(d):
        return {k: v for k, v in d.items() if k != noise}

    for rnd in (0, 1):
        match(states[rnd].global_params, (r32[rnd][0], r64[rnd][0]))
        match(real(states[rnd].c_global), (real(r32[rnd][1]), real(r64[rnd][1])))
        assert float(states[rnd].c_global[noise].abs().max()) < 1e-4  # 1e-5 here; others 3e-2..0.7
    for cid in (0, 1, 2):  # client 0 after both rounds, 1 after round 1, 2 after round 2
        got = host.states[cid]["scaffold/c_local"]
        match(real(got), (real(ci32[cid]), real(ci64[cid])))
        assert float(got[noise].abs().max()) < 1e-4


def test_fednova_normalises_by_effective_steps(digits):
    """Mutations caught: a_i without the momentum correction (a_i = τ_i), tau_eff dropped."""
    from fl_lightning.methods.fednova import effective_steps

    _, plan, updates, new, init, _ = one_round("fednova", digits)
    p = np.array([70, 50]) / 120

    def a_written_out(tau: int, rho: float) -> float:  # Σ_j (1 - ρ^j)/(1 - ρ), j = 1..τ
        return sum((1 - rho**j) / (1 - rho) for j in range(1, tau + 1))

    def expect(dt):
        models = manual_clients(digits, plan, init, ce, dtype=dt)
        a = [a_written_out(steps, MOM) for _, steps in models]
        tau_eff = float(p @ np.array(a))
        out = {}
        for k, _ in Toy().named_parameters():
            d = sum(
                pi * (init[k].to(dt) - m.state_dict()[k]) / ai
                for pi, (m, _), ai in zip(p, models, a, strict=True)
            )
            out[k] = init[k].to(dt) - tau_eff * d
        # batch-norm statistics are averaged as in FedAvg
        out["features.2.running_mean"] = written_mean([sd(m) for m, _ in models], [70, 50])[
            "features.2.running_mean"
        ]
        return out, a

    (e32, a), (e64, _) = twin(expect)
    assert [u.a for u in updates] == pytest.approx(a, rel=1e-12)  # closed form vs sum, both float64
    assert a[0] != a[1]  # 5 vs 4 steps: this is where FedNova differs from FedAvg
    match(new.global_params, (e32, e64))
    assert effective_steps(5, 0.0) == 5.0


def test_fedbn_never_averages_batch_norm(digits):
    r = one_round("fedbn", digits)
    _, plan, updates, new, init, _ = r
    models32, models64 = twin(lambda dt: [sd(m) for m, _ in manual_clients(digits, plan, init, ce, dtype=dt)])
    bn = [k for k in init if k.startswith("features.2.")]
    assert bn and all(k not in updates[0].params for k in bn)  # never uploaded
    for k in bn:
        assert torch.equal(new.global_params[k], init[k])  # global BN untouched
    for i, u in enumerate(updates):  # each client keeps its own
        personal = r.host.states[u.client_id]["personal"]
        match(personal, ({k: models32[i][k] for k in bn}, {k: models64[i][k] for k in bn}))
    avg32, avg64 = (written_mean(ms, [70, 50]) for ms in (models32, models64))
    match(
        {k: v for k, v in new.global_params.items() if k not in bn},
        ({k: v for k, v in avg32.items() if k not in bn}, {k: v for k, v in avg64.items() if k not in bn}),
    )
    assert r.host.states[0]["personal"] and r.host.states[1]["personal"]


def test_fedlc_calibrates_logits_by_local_counts(digits):
    """Mutations caught: exponent -1/4 -> +1/4 or -1/2, the shift added instead of subtracted,
    τ dropped (τ = 0.5 here: at τ = 1 a dropped τ changes nothing)."""
    from fl_lightning.methods.fedlc import calibrated_logits

    _, plan, _, new, init, _ = one_round("fedlc", digits, tau=0.5)
    ds, shards = digits

    def expect(dt):
        models = []
        for p in plan.payloads:
            counts = torch.bincount(torch.as_tensor(ds.train_y[shards[p.client_id]]), minlength=10)
            m = Toy().to(dt)
            m.load_state_dict(init)

            def loss(m, x, y, counts=counts):
                shift = 0.5 * counts.to(x.dtype).clamp(min=1) ** -0.25
                logits = (m(x) - shift).masked_fill(counts == 0, float("-inf"))
                return F.cross_entropy(logits, y)

            models.append(sd(manual_fit(m, *client_data(digits, p.client_id), p.seed, loss)[0]))
        return written_mean(models, [70, 50])

    match(new.global_params, twin(expect))
    z = calibrated_logits(torch.zeros(1, 3), torch.tensor([16, 1, 0]), 1.0)
    assert z[0, 0] == -0.5 and z[0, 1] == -1.0 and z[0, 2] == float("-inf")


def moon_loss(glob: nn.Module, prev: nn.Module):
    """CE + the model-contrastive term (T = 0.5, mu = 1) against frozen global/previous models."""

    def loss(m, x, y):
        z = m.forward_features(x)
        with torch.no_grad():
            zg, zp = glob.forward_features(x), prev.forward_features(x)
        sims = torch.stack([F.cosine_similarity(z, zg, -1), F.cosine_similarity(z, zp, -1)], 1) / 0.5
        return F.cross_entropy(m.head(z), y) + F.cross_entropy(sims, torch.zeros(len(x), dtype=torch.long))

    return loss


def frozen(params: dict, dt) -> nn.Module:
    m = Toy().to(dt)
    m.load_state_dict(params)
    return m.eval()


def test_moon_adds_the_model_contrastive_term(digits):
    """Mutations caught: temperature dropped, positive and negative swapped."""
    r = one_round("moon", digits, mu=1.0, temperature=0.5)
    _, plan, updates, new, init, _ = r

    def clients(dt):  # first round: previous model = global model
        g = frozen(init, dt)
        return [sd(m) for m, _ in manual_clients(digits, plan, init, moon_loss(g, g), dtype=dt)]

    m32, m64 = twin(clients)
    match(new.global_params, (written_mean(m32, [70, 50]), written_mean(m64, [70, 50])))
    for i, u in enumerate(updates):  # the previous local model is kept as client state
        match(r.host.states[u.client_id]["moon/prev"], (m32[i], m64[i]))


def test_moon_round_two_pulls_to_global_and_pushes_from_previous(digits):
    """In round 1 previous = global, so the term is log 2 with zero gradient; round 2 is
    where it acts: check it against the formula with both frozen models."""
    r = one_round("moon", digits, mu=1.0, temperature=0.5)
    strategy, _, _, state1, init, _ = r
    plan2 = strategy.configure_round(state1, 2, round_rng(0, 2))
    p0 = plan2.payloads[0]

    def expect(dt):
        loss = moon_loss(frozen(state1.global_params, dt), frozen(r.host.states[0]["moon/prev"], dt))
        m = Toy().to(dt)
        m.load_state_dict(state1.global_params)
        return sd(manual_fit(m, *client_data(digits, 0), p0.seed, loss)[0])

    ds, shards = digits
    host = ClientHost(toy_spec("moon", strategy.objective_kwargs(), init), ds, {0: shards[0]})
    host.set_states({0: r.host.states[0]})  # client 0's previous model from round 1
    got = host.fit(plan2.broadcast, p0)
    match(got.params, twin(expect))
    plain = one_round("fedavg", digits)[3].global_params  # the term changes the result
    assert not torch.allclose(got.params["head.weight"], plain["head.weight"])


def test_fedproto_prototypes_and_their_aggregation(digits):
    _, plan, updates, new, init, _ = one_round("fedproto", digits, lam=1.0)
    assert updates[0].params is None  # personal models: no weights leave the client

    def client_means(dt):
        out = []
        for p in plan.payloads:
            m = Toy().to(dt)
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
            out.append((torch.stack([z[y == c].mean(0) if n[c] else z.new_zeros(8) for c in range(10)]), n))
        return out

    r32, r64 = twin(client_means)
    for i, u in enumerate(updates):
        match({"prototypes": u.prototypes}, ({"prototypes": r32[i][0]}, {"prototypes": r64[i][0]}))
        assert torch.equal(u.proto_counts, r64[i][1])
    # count-weighted aggregation of the uploaded prototypes, in float64 (one average: ulps)
    n0, n1 = updates[0].proto_counts.double(), updates[1].proto_counts.double()
    p0, p1 = updates[0].prototypes.double(), updates[1].prototypes.double()
    expect = (p0 * n0[:, None] + p1 * n1[:, None]) / (n0 + n1).clamp(min=1)[:, None]
    match({"p": new.prototypes}, ({"p": expect}, {"p": expect}))
    assert torch.equal(new.proto_counts, updates[0].proto_counts + updates[1].proto_counts)


def test_fedglcl_logits_are_cosine_to_class_text_over_tau(digits):
    """Mutations caught: tau multiplied instead of divided or dropped, the configured tau not
    reaching the objective (τ = 0.1 here, not the default 0.07), the text features left
    unnormalised, a projector other than the configured one."""
    strategy, plan, updates, new, init, obj = one_round("fedglcl", digits, tau=0.1)
    T = strategy.class_features
    assert T.shape == (10, 384) and torch.allclose(T.norm(dim=1), torch.ones(10), atol=1e-5)  # 100 ulps
    assert set(init) == set(obj.model.state_dict()) and "head.0.weight" in init  # projector, no classifier
    assert init["head.0.weight"].shape == (384, 8)
    assert obj.projector_kind == "bn_relu"  # auto: the toy backbone has batch norm

    def clients(dt):
        def loss(m, x, y):
            # T is L2-normalised; normalised again as the engine does (the same vectors)
            logits = F.normalize(m(x), dim=-1) @ F.normalize(T.to(x.dtype), dim=-1).T / 0.1
            return F.cross_entropy(logits, y)

        out = []
        for p in plan.payloads:
            m = Toy()
            m.head = copy.deepcopy(obj.model.head)
            m = m.to(dt)
            m.load_state_dict(init)
            out.append(sd(manual_fit(m, *client_data(digits, p.client_id), p.seed, loss)[0]))
        return written_mean(out, [70, 50])

    match(new.global_params, twin(clients))
    # prediction = nearest class text
    obj.begin_round(strategy.eval_broadcast(new), None)
    obj.eval()
    x, _ = client_data(digits, 0)
    with torch.no_grad():
        emb = F.normalize(obj.model(x[:5]), dim=-1)
        assert torch.equal(obj(x[:5]).argmax(1), (emb @ T.T).argmax(1))


def test_fedglcl_random_and_orthogonal_class_vectors(digits):
    rand = one_round("fedglcl", digits, class_embedding="orthogonal")[0].class_features
    # QR in float32: orthonormal to ~sqrt(d) ulps; 1e-5 = 84 ulps of 1
    torch.testing.assert_close(rand @ rand.T, torch.eye(10), atol=1e-5, rtol=0)
    text = one_round("fedglcl", digits)[0].class_features
    assert not torch.allclose(rand, text)
    # the shared controls switch (text/targets.py): the same text vectors, every class moved
    perm = one_round("fedglcl", digits, targets="permuted")[0].class_features
    assert torch.equal(perm.flatten().sort().values, text.flatten().sort().values)
    assert all(not torch.equal(perm[c], text[c]) for c in range(10))


def test_personalised_methods_need_client_test_splits(tmp_path, capsys):
    from fl_lightning.cli.main import main

    assert main(["run", "method=fedbn", "model=cnn_bn", "runtime=serial", f"output_dir={tmp_path}"]) == 2
    assert "set data.client_test_fraction" in capsys.readouterr().err
    assert (
        main(
            [
                "run",
                "method=fedbn",
                "model=cnn",  # fedbn's own default is cnn_bn; a BN-free model is refused
                "data.client_test_fraction=0.25",
                "runtime=serial",
                f"output_dir={tmp_path}",
            ]
        )
        == 2
    )
    assert "fedbn needs a model with batch norm" in capsys.readouterr().err


def test_fedproto_round_two_regularises_towards_global_prototypes(digits):
    r = one_round("fedproto", digits, lam=1.0)
    strategy, _, _, state1, init, _ = r
    plan2 = strategy.configure_round(state1, 2, round_rng(0, 2))
    p1 = plan2.payloads[1]
    P, has = state1.prototypes, state1.proto_counts > 0

    def loss(m, x, y):
        z = m.forward_features(x)
        keep = has[y]
        return F.cross_entropy(m.head(z), y) + F.mse_loss(z[keep], P[y[keep]].to(z.dtype))

    def expect(dt):
        m = Toy().to(dt)
        m.load_state_dict(r.host.states[1]["personal"])  # personal model from round 1
        return sd(manual_fit(m, *client_data(digits, 1), p1.seed, loss)[0])

    ds, shards = digits
    host = ClientHost(toy_spec("fedproto", strategy.objective_kwargs(), init), ds, {1: shards[1]})
    host.set_states({1: r.host.states[1]})
    host.fit(plan2.broadcast, p1)
    match(host.states[1]["personal"], twin(expect))
    assert plan2.broadcast.global_params is None and plan2.broadcast.nbytes() == P.numel() * 4 + 10 * 8


def test_a_last_batch_of_one_sample_is_dropped_not_fatal(digits):
    """Batch norm cannot train on one sample: 33 examples with batch 16 must still fit."""
    ds, shards = digits
    strategy, plan, _, _, init, _ = one_round("fedavg", digits)
    host = ClientHost(toy_spec("fedavg", strategy.objective_kwargs(), init), ds, {0: shards[0][:33]})
    update = host.fit(plan.broadcast, plan.payloads[0])
    assert update.num_examples == 33 and update.metrics["train_loss"] > 0
