"""More personalised-FL baselines (Per-FedAvg, pFedMe, FedAMP, FedALA, FedPHP) on the toy model, checked
against plain PyTorch loops with each method's formulas written out, in the pattern of
tests/test_pfl_personal_heads.py: three clients, two per round for two rounds (FedALA: three; partial
participation), the
reference in float32 and float64 (`both`), then each client's personalised evaluation.

Mutations tried (each failed its test, then restored): see each test's docstring."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.core.errors import ConfigError
from fl_lightning.core.messages import ClientPayload
from fl_lightning.core.params import to_cpu, weighted_mean

from . import test_pfl_personal_heads as test_pfl
from .test_methods import LR, MOM, Toy, match, twin
from .test_pfl_personal_heads import (
    accuracy,
    both,
    cast,
    ce,
    check,
    loader,
    n_train,
    personal_eval,
    run,
    sgd_epochs,
    shard,
)

clients3 = test_pfl.clients3  # the fixture: three clients of digits, each with its own test split


def batches_of(data, cid, seed, bs, dt):
    """The engine's shuffled batches of client `cid` for a fit seeded `seed`."""
    x, y = shard(data, cid, dt=dt)
    torch.manual_seed(seed)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=bs, shuffle=True,
                                         generator=torch.Generator().manual_seed(seed))  # fmt: skip
    return list(loader)


def fedavg_rounds(data, r, client_fit, dt, bs=16, server=None):
    """Rounds of: each sampled client runs `client_fit(model, batches, cid, pers)` from the
    global model, the server takes the example-weighted mean (then `server(prev, mean)`)."""
    glob, pers = cast(r.init, dt), {}
    for plan in r.plans:
        outs = []
        for p in plan.payloads:
            m = Toy().to(dt)
            m.load_state_dict(glob)
            client_fit(m, batches_of(data, p.client_id, p.seed, bs, dt), p.client_id, pers)
            outs.append((to_cpu(m.state_dict()), n_train(data, p.client_id)))
        mean = weighted_mean([s for s, _ in outs], [n for _, n in outs])
        glob = server(glob, mean) if server else mean
    return glob, pers


def last_seed(r, cid):
    return [p.seed for plan in r.plans for p in plan.payloads if p.client_id == cid][-1]


# --- Per-FedAvg ------------------------------------------------------------------------------


@pytest.mark.parametrize("first_order", [True, False])
def test_perfedavg_maml_steps_and_one_step_personalisation(clients3, first_order):
    """Mutations: inner step `+ α g` (fails), the FO variant differentiating through the
    inner step (create_graph=True: fails the FO case), the outer loss on the first half
    (fails), the evaluation's step with α/2 (fails the eval)."""
    alpha, bs = 0.05, 20  # 70, 50, 40 examples: no half-batch of 1 (batch norm)
    r = run("perfedavg", clients3, bs=bs, alpha=alpha, first_order=first_order)

    def fit(m, batches, cid, pers):
        opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOM)
        m.train()
        for i, (x, y) in enumerate(batches):
            h = (len(y) + 1) // 2
            if i == 0:
                pers[cid] = (x[:h], y[:h])  # the kept batch
            params = dict(m.named_parameters())
            g = torch.autograd.grad(F.cross_entropy(m(x[:h]), y[:h]), list(params.values()),
                                    create_graph=not first_order)  # fmt: skip
            fast = {n: p - alpha * gi for (n, p), gi in zip(params.items(), g, strict=True)}
            opt.zero_grad()
            F.cross_entropy(torch.func.functional_call(m, fast, (x[h:],)), y[h:]).backward()
            opt.step()

    glob, kept = both(lambda dt: fedavg_rounds(clients3, r, fit, dt, bs))
    match(r.state.global_params, glob)
    for u in r.updates[-1]:
        assert set(u.params) == set(r.init)
    # evaluation: one α step from the global model on the kept batch (train mode), then eval
    cid = r.plans[-1].client_ids[0]
    xk, yk = kept[cid][0]
    torch.testing.assert_close(r.host.states[cid]["perfedavg/adapt_batch"]["x"], xk)
    m = Toy()
    m.load_state_dict(glob[0])
    m.train()
    g = torch.autograd.grad(F.cross_entropy(m(xk), yk), list(m.parameters()))
    with torch.no_grad():
        for p, gi in zip(m.parameters(), g, strict=True):
            p.sub_(alpha * gi)
    w = Toy()
    w.load_state_dict(glob[0])
    m.eval(), w.eval()
    x, y = shard(clients3, cid, "test")
    got = personal_eval(r, cid).metrics
    with torch.no_grad():
        assert got["loss"] == pytest.approx(float(F.cross_entropy(m(x), y)), rel=1e-4)
        assert got["accuracy"] == pytest.approx(accuracy(m(x), y))
        assert got["global/accuracy"] == pytest.approx(accuracy(w(x), y))
    assert got["loss"] != pytest.approx(got["global/loss"], rel=1e-4)  # the step did something
    with pytest.raises(ConfigError, match="alpha"):
        run("perfedavg", clients3, rounds=0, alpha=0.0)


# --- pFedMe ----------------------------------------------------------------------------------


def test_pfedme_moreau_inner_steps_outer_step_and_beta_mixing(clients3):
    """Mutations: `- λ(θ − w)` in the inner step (fails), w stepping by λ/2 (fails), the
    server without β (fails), evaluating w instead of θ̂ (fails the eval)."""
    lam, plr, K, mu, beta = 2.0, 0.05, 3, 0.001, 1.5
    r = run("pfedme", clients3, momentum=0.0, lam=lam, personal_lr=plr, inner_steps=K, mu=mu, beta=beta)

    def fit(m, batches, cid, pers):
        names = [n for n, _ in m.named_parameters()]
        theta = [p.detach().clone() for p in m.parameters()]  # starts at the global model
        m.train()
        for x, y in batches:
            w = [p.detach() for p in m.parameters()]
            for _ in range(K):
                theta = [t.requires_grad_() for t in theta]
                out = torch.func.functional_call(m, dict(zip(names, theta, strict=True)), (x,))
                loss = F.cross_entropy(out, y)
                g = torch.autograd.grad(loss, theta)
                with torch.no_grad():
                    step = zip(theta, g, w, strict=True)
                    theta = [t - plr * (gi + lam * (t - wi) + mu * t) for t, gi, wi in step]
            with torch.no_grad():  # PFLlib: w ← w − η λ (w − θ)
                for p, t in zip(m.parameters(), theta, strict=True):
                    p.sub_(LR * lam * (p - t))
        pers[cid] = {**to_cpu(m.state_dict()), **dict(zip(names, theta, strict=True))}

    def server(prev, mean):
        return {k: (1 - beta) * prev[k] + beta * v if not k.endswith(("running_mean", "running_var",
                "num_batches_tracked")) else v for k, v in mean.items()}  # fmt: skip

    glob, pers = both(lambda dt: fedavg_rounds(clients3, r, fit, dt, server=server))
    check(r, glob, pers, "pfedme/personal")
    cid = r.plans[-1].client_ids[0]
    x, y = shard(clients3, cid, "test")
    v, w = Toy(), Toy()
    v.load_state_dict(pers[cid][0])
    w.load_state_dict(glob[0])
    v.eval(), w.eval()
    got = personal_eval(r, cid).metrics
    with torch.no_grad():
        assert got["loss"] == pytest.approx(float(F.cross_entropy(v(x), y)), rel=1e-4)
        assert got["global/loss"] == pytest.approx(float(F.cross_entropy(w(x), y)), rel=1e-4)
    assert got["accuracy"] == pytest.approx(accuracy(v(x), y))
    with pytest.raises(ConfigError, match="pfedme needs"):
        run("pfedme", clients3, rounds=0, inner_steps=0)


# --- FedAMP ----------------------------------------------------------------------------------


def test_fedamp_cloud_models_by_attention_and_proximal_personal_training(clients3):
    """Mutations: ξ_ij without the 1/σ (fails), ξ_ii = 1 (fails), the proximal term with
    λ·αK instead of λ/αK (fails), the cloud model from the initial model instead of the
    client's own (fails)."""
    ak, lam, sigma = 0.5, 0.5, 4.0
    r = run("fedamp", clients3, alpha_k=ak, lam=lam, sigma=sigma)
    # evaluation sends no models: plain payloads (Strategy.plain_eval_payloads)
    assert all(type(q) is ClientPayload for q in r.strategy.configure_evaluate(r.state, [0, 1, 2]).payloads)
    assert type(r.plans[-1].payloads[0]) is not ClientPayload  # training's carry the models
    weights = [n for n, _ in Toy().named_parameters()]  # what the attention compares: not BN statistics

    def cloud(models, cid, init):
        own = models.get(cid, init)
        xi = {}
        for j, m in models.items():
            if j != cid:
                d2 = sum(float(((own[k].double() - m[k].double()) ** 2).sum()) for k in weights)
                xi[j] = ak * torch.exp(torch.tensor(-d2 / sigma, dtype=torch.float64)).item() / sigma
        rest = 1 - sum(xi.values())
        u = {k: rest * own[k] + sum(x * models[j][k] for j, x in xi.items()) for k in weights}
        return u, xi

    def ref(dt):
        init, models, pers, clouds, coefs = cast(r.init, dt), {}, {}, {}, []
        for plan in r.plans:
            clouds = {p.client_id: cloud(models, p.client_id, init) for p in plan.payloads}
            coefs += [x for _, xi in clouds.values() for x in xi.values()]
            new = {}
            for p in plan.payloads:
                u = [clouds[p.client_id][0][k] for k in weights]
                m = Toy().to(dt)
                m.load_state_dict(pers.get(p.client_id, init))  # trains its own model

                def loss(m, x, y, u=u):
                    sq = sum(((q - a) ** 2).sum() for q, a in zip(m.parameters(), u, strict=True))
                    return F.cross_entropy(m(x), y) + lam / (2 * ak) * sq

                sgd_epochs(m, m.parameters(), loader(*shard(clients3, p.client_id, dt=dt), p.seed), 1, loss)
                new[p.client_id] = pers[p.client_id] = to_cpu(m.state_dict())
            models.update(new)
        last = {c: cu for c, (cu, _) in clouds.items()}
        return models, pers, last, coefs

    (m32, p32, u32, _), (m64, p64, u64, coefs) = twin(ref)
    assert len(coefs) >= 2 and all(0.01 < x < 0.5 for x in coefs), coefs  # the attention matters here
    assert set(r.state.client_models) == set(m64)
    for c in m64:
        match(r.state.client_models[c], (m32[c], m64[c]))
        match(r.host.states[c]["fedamp/personal"], (p32[c], p64[c]))
    for p in r.plans[-1].payloads:  # round 2's cloud models
        match(p.cloud, (u32[p.client_id], u64[p.client_id]))
    assert r.plans[0].broadcast.global_params is None  # nothing global is sent
    cid = r.plans[-1].client_ids[0]
    m = Toy()
    m.load_state_dict(p64[cid])
    m.float().eval()
    x, y = shard(clients3, cid, "test")
    got = personal_eval(r, cid).metrics
    with torch.no_grad():
        assert got["loss"] == pytest.approx(float(F.cross_entropy(m(x), y)), rel=1e-4)
    assert got["accuracy"] == pytest.approx(accuracy(m(x), y))
    with pytest.raises(ConfigError, match="fedamp needs"):
        run("fedamp", clients3, rounds=0, sigma=0.0)


# --- FedALA ----------------------------------------------------------------------------------


def test_fedala_adaptive_local_aggregation_then_local_training(clients3):
    """Three rounds, so some client runs ALA's first (until converged) and a later phase.
    Mutations: W's step `+ η g ⊙ d` (fails), the lower layers kept local (fails), W not
    clipped to [0, 1] (fails), the start phase for one epoch only (fails)."""
    eta, pct, L, thr, npl, abs_ = 2.0, 60.0, 2, 0.02, 3, 8
    kw = dict(eta=eta, rand_percent=pct, layer_idx=L, threshold=thr, num_pre_loss=npl, ala_batch_size=abs_)
    r = run("fedala", clients3, rounds=3, **kw)

    def ref(dt):
        glob, local, W, epochs = cast(r.init, dt), {}, {}, []
        for plan in r.plans:
            outs = []
            for p in plan.payloads:
                cid = p.client_id
                x, y = shard(clients3, cid, dt=dt)
                m = Toy().to(dt)
                torch.manual_seed(p.seed)
                if cid not in local:
                    m.load_state_dict(glob)  # first fit: no ALA
                    epochs.append(0)
                else:
                    m.load_state_dict(local[cid])
                    m.train()
                    names = [n for n, _ in m.named_parameters()]
                    prm = dict(m.named_parameters())
                    buffers = {n: b.clone() for n, b in m.named_buffers()}
                    with torch.no_grad():
                        for n in names[:-L]:
                            prm[n].copy_(glob[n])  # lower layers: the global model's
                    hi = names[-L:]
                    th = {n: local[cid][n] for n in hi}
                    d = {n: glob[n] - th[n] for n in hi}
                    start = cid not in W
                    w = W.get(cid, {n: torch.ones_like(th[n]) for n in hi})
                    num = int(pct / 100 * len(y))
                    first = int(torch.randint(0, len(y) - num + 1, ()))
                    xs, ys = x[first : first + num], y[first : first + num]

                    def mix(w=w, th=th, d=d, hi=hi, prm=prm):
                        with torch.no_grad():
                            for n in hi:
                                prm[n].copy_(th[n] + d[n] * w[n])

                    mix()
                    losses = []
                    while True:
                        for i in range(0, num, abs_):
                            loss = F.cross_entropy(m(xs[i : i + abs_]), ys[i : i + abs_])
                            g = dict(zip(hi, torch.autograd.grad(loss, [prm[n] for n in hi]), strict=True))
                            for n in hi:
                                w[n] = torch.clamp(w[n] - eta * g[n] * d[n], 0, 1)
                            mix()
                        losses.append(float(loss.detach()))
                        if not start or (len(losses) > npl and float(torch.tensor(losses[-npl:]).std(
                                correction=0)) < thr):  # fmt: skip
                            break
                    W[cid] = w
                    epochs.append(len(losses))
                    with torch.no_grad():
                        for n, b in m.named_buffers():
                            b.copy_(buffers[n])  # the local statistics
                sgd_epochs(m, m.parameters(), loader(x, y, p.seed), 1, ce)
                local[cid] = to_cpu(m.state_dict())
                outs.append((local[cid], n_train(clients3, cid)))
            glob = weighted_mean([s for s, _ in outs], [n for _, n in outs])
        return glob, local, epochs

    (g32, l32, _), (g64, l64, epochs) = twin(ref)
    got_epochs = [u.metrics["ala_epochs"] for ups in r.updates for u in ups]
    assert got_epochs == epochs and max(epochs) > npl and 1 in epochs, epochs  # first ALA and a later one
    match(r.state.global_params, (g32, g64))
    for c in l64:
        match(r.host.states[c]["fedala/local"], (l32[c], l64[c]))
    cid = r.plans[-1].client_ids[0]
    m, w = Toy(), Toy()
    m.load_state_dict(l64[cid])
    w.load_state_dict(g64)
    m.float().eval(), w.float().eval()
    x, y = shard(clients3, cid, "test")
    got = personal_eval(r, cid).metrics
    with torch.no_grad():
        assert got["loss"] == pytest.approx(float(F.cross_entropy(m(x), y)), rel=1e-4)
        assert got["global/loss"] == pytest.approx(float(F.cross_entropy(w(x), y)), rel=1e-4)
    with pytest.raises(ConfigError, match="fedala needs"):
        run("fedala", clients3, rounds=0, rand_percent=0.0)


# --- FedPHP ----------------------------------------------------------------------------------


def test_fedphp_inherits_the_private_model_and_pulls_features_to_the_global(clients3):
    """Three rounds, two clients each, so some client mixes at R = 1 and R = 2. Mutations:
    the mix weights swapped (fails), μ_R from R = 1 (fails), the MMD's cross term `+ 2k`
    (fails), buffers mixed like parameters (fails), λ on the cross-entropy (fails)."""
    mu, lam, T = 0.8, 0.3, 3
    r = run("fedphp", clients3, rounds=T, mu=mu, lam=lam)

    def mmd(a, b):  # PFLlib's RBF MMD, written out pair by pair
        def k(u, v):
            d = ((u[:, None, :] - v[None, :, :]) ** 2).sum(-1)
            return sum(torch.exp(-d / (2 * bw)) for bw in (10.0, 15.0, 20.0, 50.0))

        return (k(a, a) + k(b, b) - 2 * k(a, b)).mean()

    def ref(dt):
        glob, local = cast(r.init, dt), {}
        for R, plan in enumerate(r.plans):  # PFLlib's round index, from 0
            outs = []
            for p in plan.payloads:
                cid = p.client_id
                x, y = shard(clients3, cid, dt=dt)
                m, teacher = Toy().to(dt), Toy().to(dt)
                teacher.load_state_dict(glob)
                teacher.train().requires_grad_(False)
                if cid in local:
                    w = mu * R / T
                    names = {n for n, _ in m.named_parameters()}
                    own = local[cid]
                    mix = {k: (1 - w) * glob[k] + w * own[k] if k in names else own[k] for k in glob}
                    m.load_state_dict(mix)
                else:
                    m.load_state_dict(glob)

                def loss(model, xb, yb, teacher=teacher):
                    z = model.features(xb)
                    with torch.no_grad():
                        zt = teacher.features(xb)
                    return (1 - lam) * F.cross_entropy(model.head(z), yb) + lam * mmd(z, zt)

                sgd_epochs(m, m.parameters(), loader(x, y, p.seed), 1, loss)
                local[cid] = to_cpu(m.state_dict())
                outs.append((local[cid], n_train(clients3, cid)))
            glob = weighted_mean([s for s, _ in outs], [n for _, n in outs])
        return glob, local

    glob, local = both(ref)
    mixed = [p.client_id for plan in r.plans[1:] for p in plan.payloads]
    assert len(mixed) > len(set(mixed)) or set(mixed) & {p.client_id for p in r.plans[0].payloads}
    check(r, glob, local, "fedphp/local")
    cid = r.plans[-1].client_ids[0]
    x, y = shard(clients3, cid, "test")
    m, g = Toy(), Toy()
    m.load_state_dict(local[cid][0])
    g.load_state_dict(glob[0])
    m.eval(), g.eval()
    got = personal_eval(r, cid).metrics
    assert got["accuracy"] == pytest.approx(accuracy(m(x), y))
    assert got["global/accuracy"] == pytest.approx(accuracy(g(x), y))
    with pytest.raises(ConfigError, match="fedphp"):
        run("fedphp", clients3, rounds=1, mu=1.5)


# --- FedFomo ---------------------------------------------------------------------------------


def test_fedfomo_weighs_received_models_by_validation_gain_per_distance(clients3):
    """Three rounds of two clients, M = 2: round 1 receives nothing, later rounds the top of
    each affinity row. Mutations: the gain's sign flipped (fails), the distance not divided
    (fails), negative weights kept (fails), the affinity not accumulated (fails), θ_old the
    trained model instead of the pre-training one (fails)."""
    M, vf = 2, 0.25
    r = run("fedfomo", clients3, rounds=3, m=M, val_fraction=vf)
    # evaluation sends no models: plain payloads (Strategy.plain_eval_payloads)
    assert all(type(q) is ClientPayload for q in r.strategy.configure_evaluate(r.state, [0, 1, 2]).payloads)
    assert type(r.plans[-1].payloads[0]) is not ClientPayload  # training's carry the models

    def ref(dt):
        init = cast(r.init, dt)
        models, pers, old, uploaded = {}, {}, {}, []
        P = torch.eye(3, dtype=torch.float64)
        for plan in r.plans:
            outs = []
            for p in plan.payloads:
                cid = p.client_id
                ids = sorted(range(3), key=lambda j, cid=cid: (-float(P[cid, j]), j))[: min(M, len(uploaded))]
                x, y = shard(clients3, cid, dt=dt)
                m = Toy().to(dt)
                m.load_state_dict(pers.get(cid, init))
                theta_old = old.get(cid, pers.get(cid, init))
                nv = int(vf * len(y))
                xv, yv = x[-nv:], y[-nv:]

                def vloss(sd, xv=xv, yv=yv):
                    t = Toy().to(dt)
                    t.load_state_dict(sd)
                    t.eval()
                    with torch.no_grad():
                        return float(F.cross_entropy(t(xv), yv))

                ws = []
                if ids:
                    names = [n for n, _ in m.named_parameters()]
                    base = vloss(theta_old)
                    for j in ids:
                        th = models.get(j, init)
                        sq = sum(((th[n].double() - theta_old[n].double()) ** 2).sum() for n in names)
                        dist = float(sq) ** 0.5
                        ws.append((base - vloss(th)) / (dist + 1e-5))
                    pos = [max(w, 0.0) for w in ws]
                    if sum(pos) > 0:
                        new = dict(m.state_dict())  # buffers: the client's own
                        for n in names:
                            terms = zip(pos, ids, strict=True)
                            new[n] = sum(w / sum(pos) * models.get(j, init)[n] for w, j in terms)
                        m.load_state_dict(new)
                old[cid] = to_cpu(m.state_dict())
                sgd_epochs(m, m.parameters(), loader(x, y, p.seed), 1, ce)
                pers[cid] = to_cpu(m.state_dict())
                outs.append((cid, ids, ws))
            for cid, ids, ws in outs:
                models[cid] = pers[cid]
                for j, w in zip(ids, ws, strict=True):
                    P[cid, j] += w
            uploaded = [c for c, _, _ in outs]
        return pers, P

    (p32, P32), (p64, P64) = twin(ref)
    assert any(len(u.ids) == M for ups in r.updates[1:] for u in ups) and not any(u.ids for u in r.updates[0])
    assert not torch.equal(P64, torch.eye(3, dtype=torch.float64))
    for c in p64:
        match(r.host.states[c]["fedfomo/personal"], (p32[c], p64[c]))
    # the weights are loss differences (float32 losses ~2, so ~1e-6 apart) over distances ~1
    torch.testing.assert_close(r.state.affinity, P32, rtol=0, atol=1e-4)
    cid = r.plans[-1].client_ids[0]
    x, y = shard(clients3, cid, "test")
    m = Toy()
    m.load_state_dict(p64[cid])
    m.eval()
    assert personal_eval(r, cid).metrics["accuracy"] == pytest.approx(accuracy(m.float()(x), y))
