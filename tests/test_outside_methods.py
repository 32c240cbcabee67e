"""The method API from outside the package: FedSAM/FedASAM and FedExP (the two methods of the
architecture review), each one file of an outside package that names its methods once, written
against the documented concepts only (a registered config with its `check`, a strategy, an
objective's `step` hook, `aggregate` returning metrics), golden-tested with `fl_lightning.testing`
against their formulas written out, over two rounds with partial participation.

SAM's two passes are `ClientObjective.step(closure)`: no Lightning manual optimisation, so
`optim.grad_clip` works with it (the clipped gradient is the one at w + e), checked here too.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from torch.func import functional_call

from fl_lightning.core.errors import ConfigError
from fl_lightning.core.messages import ClientUpdate
from fl_lightning.core.objective import is_weight
from fl_lightning.core.optim import OptimConfig
from fl_lightning.core.strategy import round_rng
from fl_lightning.methods import METHODS, import_methods
from fl_lightning.runtime.host import ClientHost
from fl_lightning.testing import (
    LR,
    SIZES3,
    Toy,
    cast,
    ce,
    check,
    client_data,
    example_mean,
    manual_fit,
    match,
    sd,
    three_clients,
    toy_spec,
    train,
    twin,
    two_rounds,
)

FEDSAM = '''"""FedSAM and FedASAM: Caldarola, Caputo and Ciccone, "Improving Generalization in Federated
Learning by Seeking Flat Minima", ECCV 2022, https://arxiv.org/abs/2203.11834.

Clients take sharpness-aware steps (SAM, Foret et al. 2021; ASAM, Kwon et al. 2021): the
gradient at w + e, e = rho T^2 g / ||T g||, T = 1 (SAM) or |w| + eta (ASAM), g the gradient
at w. The server is FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fl_lightning.api import (
    METHODS, Broadcast, ClientObjective, FedAvgStrategy, MethodConfig, RootConfig, nonnegative, positive,
)


@METHODS.register("fedsam")
@dataclass
class FedSAMConfig(MethodConfig):
    rho: float = 0.05  # the neighbourhood's radius
    adaptive: bool = False  # ASAM's scale-invariant neighbourhood
    eta: float = 0.0  # ASAM's T = |w| + eta

    def check(self, run: RootConfig) -> None:
        positive(self, "rho")
        nonnegative(self, "eta")


@METHODS.register("fedasam")
@dataclass
class FedASAMConfig(FedSAMConfig):
    rho: float = 0.5
    adaptive: bool = True
    eta: float = 0.2


class SAMObjective(ClientObjective[Broadcast]):
    def __init__(self, model: torch.nn.Module, rho: float, adaptive: bool, eta: float, **kwargs) -> None:
        super().__init__(model, **kwargs)
        self.rho, self.adaptive, self.eta = rho, adaptive, eta

    def step(self, closure):
        loss = closure()  # the gradient at w
        params = [p for p in self.parameters() if p.grad is not None]
        with torch.no_grad():
            scale = [p.abs() + self.eta if self.adaptive else torch.ones_like(p) for p in params]
            norm = torch.stack([(t * p.grad).norm() for t, p in zip(scale, params, strict=True)]).norm()
            kept = [p.detach().clone() for p in params]
            for t, p in zip(scale, params, strict=True):
                p.add_(self.rho * t * t * p.grad / (norm + 1e-12))
        closure()  # the gradient at w + e
        with torch.no_grad():
            for p, w in zip(params, kept, strict=True):
                p.copy_(w)  # back to w: the optimiser steps from there
        return loss


class FedSAM(FedAvgStrategy[FedSAMConfig]):
    objective_cls = SAMObjective


class FedASAM(FedSAM):
    config_cls = FedASAMConfig
'''

FEDEXP = '''"""FedExP: Jhunjhunwala, Wang and Joshi, "FedExP: Speeding Up Federated Averaging via
Extrapolation", ICLR 2023, https://arxiv.org/abs/2301.09604.

The server extrapolates: w <- w - eta_g D, D = sum_i p_i D_i, D_i = w - w_i, p_i = 1/M,
eta_g = max(1, sum_i p_i ||D_i||^2 / (2 (||D||^2 + eps))), over the weights (batch-norm
statistics take the mean). eta_g is reported as server/eta_g.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fl_lightning.api import METHODS, FedAvgStrategy, MethodConfig, RootConfig, is_weight, positive


@METHODS.register("fedexp")
@dataclass
class FedExPConfig(MethodConfig):
    eps: float = 1e-3  # keeps eta_g finite when the updates cancel

    def check(self, run: RootConfig) -> None:
        positive(self, "eps")


class FedExP(FedAvgStrategy[FedExPConfig]):
    def aggregate(self, state, updates):
        mean = self.average(state, updates)  # the statistics' (and counters') mean
        w, sent = state.global_params, [u.params for u in updates if u.params]
        keys = [k for k, v in w.items() if is_weight(k, v)]
        deltas = [{k: w[k] - p[k] for k in keys} for p in sent]
        avg = {k: sum(d[k] for d in deltas) / len(deltas) for k in keys}
        spread = sum(sum(float(d[k].double().pow(2).sum()) for k in keys) for d in deltas) / len(deltas)
        size = sum(float(avg[k].double().pow(2).sum()) for k in keys)
        eta = max(1.0, spread / (2 * (size + self.config.eps)))
        params = {**mean.global_params, **{k: w[k] - eta * avg[k] for k in keys}}
        return dataclasses.replace(mean, global_params=params), {"eta_g": eta}
'''

RHO, ASAM_RHO, ASAM_ETA, CLIP = 0.05, 0.5, 0.2, 0.5


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """The outside package `samexp` on sys.path, its methods registered for this module only."""
    site = tmp_path_factory.mktemp("site")
    (site / "samexp").mkdir()
    (site / "samexp" / "__init__.py").write_text("")
    (site / "samexp" / "fedsam.py").write_text(FEDSAM)
    (site / "samexp" / "fedexp.py").write_text(FEDEXP)
    sys.path.insert(0, str(site))
    try:
        names = import_methods(["samexp.fedsam", "samexp.fedexp"])
        yield site, names
    finally:
        sys.path.remove(str(site))
        for name in ("fedsam", "fedasam", "fedexp"):
            METHODS._configs.pop(name, None)


def sam_loss(rho: float, adaptive: bool = False, eta: float = 0.0):
    """SAM's step written out as a loss whose gradient is the gradient at w + e (e held fixed):
    the module's parameters stay w, the second forward sees w + e."""

    def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        params = dict(model.named_parameters())
        grads = torch.autograd.grad(ce(model, x, y), list(params.values()))
        with torch.no_grad():
            t = [p.abs() + eta if adaptive else torch.ones_like(p) for p in params.values()]
            norm = torch.sqrt(sum(((ti * g) ** 2).sum() for ti, g in zip(t, grads, strict=True)))
            e = {
                k: rho * ti * ti * g / (norm + 1e-12)
                for (k, ti), g in zip(zip(params, t, strict=False), grads, strict=True)
            }
        moved = {k: p + e[k] for k, p in params.items()}
        return torch.nn.functional.cross_entropy(functional_call(model, moved, (x,)), y)

    return loss


def mean_states(data, plan, start, dt, loss):
    """The round written out: each sampled client's SAM training, then the example-weighted mean."""
    models = [(p.client_id, train(data, p.client_id, p.seed, start, dt, loss)) for p in plan.payloads]
    return {k: example_mean(models, k, dt) for k in start}


@pytest.mark.parametrize("name", ["fedsam", "fedasam"])
def test_sam_methods_over_two_rounds_use_only_the_step_hook(outside, name):
    data = three_clients()
    adaptive = name == "fedasam"
    rho, eta = (ASAM_RHO, ASAM_ETA) if adaptive else (RHO, 0.0)
    init, plans, states, _ = two_rounds(name, data, rho=rho, adaptive=adaptive, eta=eta)

    def reference(dt, loss):
        w, rounds = cast(init, dt), []
        for plan in plans:
            w = mean_states(data, plan, w, dt, loss)
            rounds.append(w)
        return rounds

    r32, r64 = twin(lambda dt: reference(dt, sam_loss(rho, adaptive, eta)))
    match(states[0].global_params, (r32[0], r64[0]))
    match(states[1].global_params, (r32[1], r64[1]))
    plain = twin(lambda dt: reference(dt, ce))[1]  # FedAvg: what SAM must differ from, measurably
    gap = (plain[1]["head.weight"] - r64[1]["head.weight"]).abs().max()
    assert gap > 1e3 * (r32[1]["head.weight"].double() - r64[1]["head.weight"]).abs().max()


def test_sam_with_grad_clip_clips_the_gradient_at_the_perturbed_weights(outside):
    """`optim.grad_clip` with a `step` hook is Lightning's clipping of the gradient the
    optimiser steps on (here the one at w + e): checked against the loop written out."""
    data = three_clients()
    strategy = METHODS.get("fedsam")(METHODS.config("fedsam")(rho=RHO), 3, 1, seed=0)
    torch.manual_seed(0)
    init = sd(Toy())
    spec = toy_spec("fedsam", strategy.objective_kwargs(), init, momentum=0.0)
    spec = dataclasses.replace(spec, optim=OptimConfig(lr=LR, momentum=0.0, grad_clip=CLIP))
    host = ClientHost(spec, *data)
    plan = strategy.configure_round(strategy.init_state(init), 1, round_rng(0, 1))
    got = host.fit(plan.broadcast, plan.payloads[0]).params

    def reference(dt):
        m = Toy().to(dt)
        m.load_state_dict(cast(init, dt))
        clip = lambda model: torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)  # noqa: E731
        x, y = client_data(data, plan.payloads[0].client_id)
        return sd(manual_fit(m, x, y, plan.payloads[0].seed, sam_loss(RHO), clip, momentum=0.0)[0])

    match(got, twin(reference))
    check("fedsam", "methods=samexp.fedsam", "optim.grad_clip=0.5")  # accepted before any data
    with pytest.raises(ConfigError, match=r"^method.rho must be > 0 \(got 0.0\)$"):
        check("fedsam", "methods=samexp.fedsam", "method.rho=0")


def test_fedexp_extrapolates_and_reports_its_step_from_aggregate(outside):
    data = three_clients()
    init, plans, states, _ = two_rounds("fedexp", data, eps=1e-3)

    def step(w, models, dt, sizes=SIZES3):
        keys = [k for k, v in w.items() if is_weight(k, v)]
        deltas = [{k: w[k] - m[k] for k in keys} for _, m in models]
        avg = {k: sum(d[k] for d in deltas) / len(deltas) for k in keys}
        spread = sum(sum(float((d[k].double() ** 2).sum()) for k in keys) for d in deltas) / len(deltas)
        eta = max(1.0, spread / (2 * (sum(float((avg[k].double() ** 2).sum()) for k in keys) + 1e-3)))
        new = {k: example_mean(models, k, dt, sizes) for k in w}  # the statistics' (and counters') mean
        return {**new, **{k: w[k] - eta * avg[k] for k in keys}}, eta

    def reference(dt):
        w, rounds, etas = cast(init, dt), [], []
        for plan in plans:
            models = [(p.client_id, train(data, p.client_id, p.seed, w, dt)) for p in plan.payloads]
            w, eta = step(w, models, dt)
            rounds.append(w)
            etas.append(eta)
        return rounds, etas

    (r32, _), (r64, etas) = twin(reference)
    match(states[0].global_params, (r32[0], r64[0]))
    match(states[1].global_params, (r32[1], r64[1]))
    # two uploads that mostly cancel: a long extrapolation (eta_g > 1), params and metric by hand
    g = torch.Generator().manual_seed(0)
    w = {k: v.double() if v.is_floating_point() else v for k, v in init.items()}
    a = {
        k: 0.01 * torch.randn(v.shape, generator=g, dtype=torch.float64)
        for k, v in w.items()
        if is_weight(k, v)
    }
    sent = [(c, {k: v + sign * a[k] + (0.001 * c * a[k]) if k in a else v for k, v in w.items()})
            for c, sign in ((0, 1.0), (1, -1.0))]  # fmt: skip
    strategy = METHODS.get("fedexp")(METHODS.config("fedexp")(), 3, 2, seed=0)
    ups = [ClientUpdate(client_id=c, num_examples=1 + c, params=p) for c, p in sent]
    new, metrics = strategy.aggregate(dataclasses.replace(states[0], global_params=w), ups)
    by_hand, eta = step(w, sent, torch.float64, sizes={0: 1, 1: 2})
    assert eta > 10 and metrics == {"eta_g": pytest.approx(eta, rel=1e-9)} and etas[0] >= 1
    for k, v in by_hand.items():
        torch.testing.assert_close(new.global_params[k], v, rtol=1e-9, atol=1e-12, msg=k)


def test_each_outside_method_is_one_file_that_names_it_once(outside):
    site, names = outside
    assert sorted(names) == ["fedasam", "fedexp", "fedsam"]
    for file, methods in (("fedsam.py", ("fedsam", "fedasam")), ("fedexp.py", ("fedexp",))):
        text = Path(site, "samexp", file).read_text()
        assert "automatic_optimization" not in text and "manual_backward" not in text
        for name in methods:
            assert text.count(f'"{name}"') == 1, (file, name)
