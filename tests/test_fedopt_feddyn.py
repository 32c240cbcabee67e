"""FedAdam, FedYogi, FedAdagrad (Reddi et al., Adaptive Federated Optimization, arXiv:2003.00295)
and FedDyn (Acar et al., Federated Learning Based on Dynamic Regularization, arXiv:2111.04263)
against their formulas written out: the clients as a plain PyTorch loop (`manual_fit`), the
server step and every mean by hand, in float32 and in float64 (tolerances: `test_methods.match`).

Two rounds, partial participation: 3 clients (70, 50 and 40 examples), 2 a round; with seed 0
round 1 trains clients 0 and 1, round 2 clients 0 and 2, so client 0 brings its state from round
1, client 2 starts fresh and client 1 sits out (FedDyn's h still divides by all 3).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.core.errors import ConfigError
from fl_lightning.core.objective import is_weight
from fl_lightning.testing import check

from .test_methods import (  # noqa: F401  (digits3: a fixture)
    Toy,
    cast,
    ce,
    client_data,
    digits3,
    example_mean,
    manual_fit,
    match,
    sd,
    train,
    twin,
    two_rounds,
)

N = 3
#: the test's hyperparameters: β1 ≠ β2 and τ inside the range of |Δ|, so a swapped or dropped
#: factor shows
FEDOPT = {"server_lr": 0.05, "beta1": 0.8, "beta2": 0.9, "tau": 0.01}
SECOND_MOMENT = {  # Algorithm 2 of Reddi et al., lines 12-14, from v_{t-1} and Δ_t²
    "fedadam": lambda v, d2: 0.9 * v + (1 - 0.9) * d2,
    "fedyogi": lambda v, d2: v - (1 - 0.9) * d2 * torch.sign(v - d2),
    "fedadagrad": lambda v, d2: v + d2,
}


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_fedopt_server_step_over_two_rounds(name, digits3):  # noqa: F811
    """Mutations caught (each fails this test, tried by hand): (1 − β1) dropped,
    β2 for (1 − β2), v₋₁ = 0 instead of τ², τ inside the square root, Yogi's sign flipped,
    Adagrad's v replaced instead of summed, the step's sign flipped, uniform client weights."""
    kwargs = {k: v for k, v in FEDOPT.items() if k != "beta2" or name != "fedadagrad"}  # Adagrad: no β2
    init, plans, states, _ = two_rounds(name, digits3, **kwargs)
    eta, b1, tau = FEDOPT["server_lr"], FEDOPT["beta1"], FEDOPT["tau"]
    second = SECOND_MOMENT[name]

    def reference(dt):
        w, m, v, rounds = cast(init, dt), {}, {}, []
        for plan in plans:
            models = [(p.client_id, train(digits3, p.client_id, p.seed, w, dt)) for p in plan.payloads]
            new = {}
            for k, wk in w.items():
                mean = example_mean(models, k, dt)
                if not is_weight(k, wk):  # BN statistics and counters: the mean
                    new[k] = mean
                    continue
                d = mean - wk
                m[k] = b1 * m.get(k, torch.zeros_like(d)) + (1 - b1) * d
                v[k] = second(v.get(k, torch.full_like(d, tau**2)), d * d)
                new[k] = wk + eta * m[k] / (torch.sqrt(v[k]) + tau)
            w = new
            rounds.append(dict(w))
        return rounds, dict(m), dict(v)

    (r32, m32, v32), (r64, m64, v64) = twin(reference)
    match(states[0].global_params, (r32[0], r64[0]))
    match(states[1].global_params, (r32[1], r64[1]))
    match(states[1].m, (m32, m64))
    match(states[1].v, (v32, v64))
    assert set(states[1].m) == {k for k, t in init.items() if is_weight(k, t)}


def test_fedopt_configs_refuse_values_outside_their_range():
    cases = [("fedadam", {"beta2": 1.0}), ("fedyogi", {"tau": 0.0}), ("fedadagrad", {"server_lr": -1.0}),
             ("fedadam", {"beta1": -0.1}), ("feddyn", {"alpha": 0.0})]  # fmt: skip
    for name, bad in cases:
        with pytest.raises(ConfigError, match=f"method.{next(iter(bad))} must be"):
            check(name, *(f"method.{k}={v}" for k, v in bad.items()))


def test_feddyn_over_two_rounds_with_partial_participation(digits3):  # noqa: F811
    """Mutations caught: α/m for α/|P| in h, h's sign, h/α dropped from θ, the linear term's
    sign, α for α/2, g_k's update sign, the example-weighted instead of the plain mean."""
    alpha = 0.1
    init, plans, states, host = two_rounds("feddyn", digits3, alpha=alpha)
    names = [k for k, _ in Toy().named_parameters()]

    def reference(dt):
        theta, h, g, rounds = cast(init, dt), {}, {}, []
        for plan in plans:
            models = []
            for p in plan.payloads:
                gk = g.get(p.client_id, {k: torch.zeros_like(theta[k]) for k in names})

                def loss(model, x, y, gk=gk, start=theta):
                    params = dict(model.named_parameters())
                    quad = sum(((params[k] - start[k]) ** 2).sum() for k in names)
                    linear = sum((gk[k] * params[k]).sum() for k in names)
                    return F.cross_entropy(model(x), y) - linear + alpha / 2 * quad

                w = train(digits3, p.client_id, p.seed, theta, dt, loss)
                g[p.client_id] = {k: gk[k] - alpha * (w[k] - theta[k]) for k in names}
                models.append((p.client_id, w))
            new = {}
            for k, t in theta.items():
                if not is_weight(k, t):
                    new[k] = example_mean(models, k, dt)
                    continue
                h[k] = h.get(k, torch.zeros_like(t)) - alpha / N * sum(w[k] - t for _, w in models)
                new[k] = sum(w[k] for _, w in models) / len(models) - h[k] / alpha
            theta = new
            rounds.append(dict(theta))
        return rounds, dict(h), {c: dict(gc) for c, gc in g.items()}

    (r32, h32, g32), (r64, h64, g64) = twin(reference)
    match(states[0].global_params, (r32[0], r64[0]))
    match(states[1].global_params, (r32[1], r64[1]))
    match(states[1].h, (h32, h64))
    for c in (0, 1, 2):  # client 0 after two rounds, 1 after round 1, 2 after round 2
        match(host.states[c]["feddyn/grad"], (g32[c], g64[c]))
