"""The aggregation chain (`core/aggregation.py`) against its arithmetic written out by hand: each
update's delta clipped to C (all its floating tensors together), uniform weights, N(0, (σC/m)²)
on the mean; composed by configuration with methods that take a server step on the mean
(FedAvg, FedAvgM, FedAdam, SCAFFOLD), over two rounds with partial participation (3 clients of
70, 50 and 40 examples, 2 a round: round 1 trains clients 0 and 1, round 2 clients 0 and 2).

The references never call the engine's aggregation: the clients are a plain PyTorch loop
(`testing.train`), clipping and means are written out in float32 and float64 (`testing.twin`,
tolerances `testing.match`).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fl_lightning.config import compose
from fl_lightning.core.aggregation import Aggregator, ClipL2, GaussianNoise, Summed, Uniform, aggregate_chain
from fl_lightning.core.errors import ConfigError
from fl_lightning.core.messages import ClientUpdate, ServerState
from fl_lightning.core.objective import is_weight
from fl_lightning.core.optim import OptimConfig
from fl_lightning.core.strategy import (
    ServerContext,
    TaskInfo,
    aggregate_with,
    aggregated,
    round_rng,
    server_rng,
)
from fl_lightning.methods import METHODS
from fl_lightning.methods.fedavgm import momentum_step
from fl_lightning.runtime.host import ClientHost
from fl_lightning.runtime.runner import start_run
from fl_lightning.testing import Toy, cast, ctx, match, toy_spec, train, twin, two_rounds

from .conftest import small
from .run_files import records
from .test_methods import digits3  # noqa: F401  (a fixture)


def clipped_uniform_mean(w, models, clip):
    """w + (1/m) Σ_k min(1, C / ‖θ_k − w‖) (θ_k − w) over the floating tensors (one norm over
    all of them together); integer buffers: the plain mean of the uploads, rounded."""
    out = {}
    scales = []
    for _, m in models:
        norm = math.sqrt(
            sum(float(((m[k] - w[k]).to(torch.float64) ** 2).sum()) for k in w if w[k].is_floating_point())
        )
        scales.append(min(1.0, clip / norm))
    for k, wk in w.items():
        if wk.is_floating_point():
            out[k] = wk + sum(s * (m[k] - wk) for s, (_, m) in zip(scales, models, strict=True)) / len(models)
        else:
            out[k] = (sum(m[k].to(torch.float64) for _, m in models) / len(models)).round().to(wk.dtype)
    return out


def delta_norms(digits, plan, w):
    return [
        math.sqrt(sum(float(((m[k] - w[k]) ** 2).sum()) for k in w if w[k].is_floating_point()))
        for m in (train(digits, p.client_id, p.seed, w, torch.float64) for p in plan.payloads)
    ]


FEDADAM = {"server_lr": 0.05, "beta1": 0.8, "beta2": 0.9, "tau": 0.01}
FEDAVGM = {"server_momentum": 0.7, "server_lr": 0.8}


def server_step(name, w, mean, mem):
    """Each method's server step on the chain's mean, written out (as their own golden tests)."""
    if name == "fedavg":
        return mean
    if name == "fedavgm":
        new_w, mem["v"] = momentum_step(
            w, mean, mem.get("v", {}), FEDAVGM["server_momentum"], FEDAVGM["server_lr"]
        )
        return new_w
    c, new = FEDADAM, dict(mean)
    for k, wk in w.items():
        if not is_weight(k, wk):
            continue
        d = mean[k] - wk
        m, v = mem.setdefault("m", {}), mem.setdefault("v", {})
        m[k] = c["beta1"] * m.get(k, torch.zeros_like(d)) + (1 - c["beta1"]) * d
        v[k] = c["beta2"] * v.get(k, torch.full_like(d, c["tau"] ** 2)) + (1 - c["beta2"]) * d * d
        new[k] = wk + c["server_lr"] * m[k] / (v[k].sqrt() + c["tau"])
    return new


@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedadam"])
def test_clipping_composes_with_the_methods_server_step_over_two_rounds(name, digits3):  # noqa: F811
    """Mutations caught: a clip per tensor instead of one norm, the scale inverted, example weights
    kept under `uniform`, the mean taken over params instead of deltas plus the start, the chain
    skipped by the method's `aggregate`."""
    kwargs = {"fedavg": {}, "fedavgm": FEDAVGM, "fedadam": FEDADAM}[name]
    # C between round 1's two delta norms, so one update is clipped and the other is not
    probe_init, probe_plans, _, _ = two_rounds(name, digits3, **kwargs)
    n0, n1 = delta_norms(digits3, probe_plans[0], cast(probe_init, torch.float64))
    clip = math.sqrt(n0 * n1)
    assert min(n0, n1) < clip < max(n0, n1)
    init, plans, states, _ = two_rounds(
        name, digits3, aggregator=Aggregator([ClipL2(clip), Uniform()]), **kwargs
    )
    assert [p.client_ids for p in plans] == [[0, 1], [0, 2]]

    def reference(dt):
        w, mem, rounds = cast(init, dt), {}, []
        for plan in plans:
            models = [(p.client_id, train(digits3, p.client_id, p.seed, w, dt)) for p in plan.payloads]
            w = server_step(name, w, clipped_uniform_mean(w, models, clip), mem)
            rounds.append(dict(w))
        return rounds

    r32, r64 = twin(reference)
    match(states[0].global_params, (r32[0], r64[0]))
    match(states[1].global_params, (r32[1], r64[1]))


def test_scaffold_takes_its_step_on_the_chains_mean_and_keeps_its_control_variates(digits3):  # noqa: F811
    """SCAFFOLD's real clients (its corrected objective) over two rounds: the model is the clipped
    uniform mean of what they uploaded, written out; the control variates are what SCAFFOLD makes
    of the same updates without the chain (the chain acts on the model's upload only)."""
    cls = METHODS.get("scaffold")
    chained = cls(
        cls.config_cls(), 3, 2, 0, TaskInfo(num_classes=10), aggregator=Aggregator([ClipL2(0.3), Uniform()])
    )
    plain = cls(cls.config_cls(), 3, 2, 0, TaskInfo(num_classes=10))
    torch.manual_seed(0)
    obj = cls.build_objective(Toy(), OptimConfig(lr=0.1), **chained.objective_kwargs())
    init = {k: v.detach().clone() for k, v in obj.model.state_dict().items()}
    ds, shards = digits3
    host = ClientHost(toy_spec("scaffold", chained.objective_kwargs(), init, momentum=0.0), ds, shards)
    state = chained.init_state(init)
    clipped_any = False
    for rnd in (1, 2):
        plan = chained.configure_round(state, rnd, round_rng(0, rnd))
        ups = sorted((host.fit(plan.broadcast, p) for p in plan.payloads), key=lambda u: u.client_id)
        w = state.global_params
        expect = clipped_uniform_mean(
            cast(w, torch.float64), [(u.client_id, cast(u.params, torch.float64)) for u in ups], 0.3
        )
        new, _ = aggregated(aggregate_with(chained, state, ups, ctx(chained, rnd)))
        ref, _ = aggregated(aggregate_with(plain, state, ups, ctx(plain, rnd)))
        for k, v in new.global_params.items():
            tol = (
                0
                if not v.is_floating_point()
                else 8 * torch.finfo(torch.float32).eps * (1 + float(expect[k].abs().max()))
            )
            assert float((v.to(torch.float64) - expect[k]).abs().max()) <= tol, k
        assert new.c_global.keys() == ref.c_global.keys()
        for k in ref.c_global:
            assert torch.equal(new.c_global[k], ref.c_global[k]), k
        clipped_any |= any(
            math.sqrt(
                sum(float(((u.params[k] - w[k]).double() ** 2).sum()) for k in w if w[k].is_floating_point())
            )
            > 0.3
            for u in ups
        )
        state = new
    assert clipped_any  # the bound acted in at least one round


def round_ctx(rnd, seed=0):
    return ServerContext(
        rnd, torch.device("cpu"), server_rng(seed, rnd), TaskInfo(num_classes=10), Toy, seed=seed
    )


def _update(cid, params, n=10):
    return ClientUpdate(client_id=cid, num_examples=n, params=params)


def test_an_update_of_norm_2c_arrives_at_norm_c_and_one_below_c_unchanged():
    base = {"w": torch.zeros(3, 4), "b": torch.zeros(4)}
    big = {"w": torch.full((3, 4), 1.0), "b": torch.full((4,), 1.0)}  # norm 4
    small_ = {"w": torch.full((3, 4), 0.1), "b": torch.full((4,), 0.1)}  # norm 0.4
    state = ServerState(round=0, global_params=base)
    for upd, expect in ((big, 2.0), (small_, 0.4)):
        new = aggregate_chain(Aggregator([ClipL2(2.0)]), state, [_update(0, upd)], None)
        norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in new.global_params.values()))
        assert abs(norm - expect) <= 1e-6 * expect
    # and its metrics say so: one of one clipped, its norm before
    metrics = aggregate_chain(Aggregator([ClipL2(2.0)]), state, [_update(0, big)], None).aggregation[
        "metrics"
    ]
    assert metrics == {"clip_l2/norm": pytest.approx(4.0), "clip_l2/clipped": 1.0}


def test_gaussian_noise_has_std_sigma_c_over_m_and_is_seeded_by_seed_and_round():
    """n = 200,000 coordinates of zero deltas from m = 4 clients: the sample std is within
    5 standard errors (σ̂/σ − 1 ~ 1/√(2n) = 0.16 %) of σC/m, the mean within 5 σ/√n of 0."""
    n, m, sigma, clip = 200_000, 4, 1.3, 0.5
    base = {"a": torch.zeros(n // 2), "b": torch.zeros(n // 2)}
    state = ServerState(round=0, global_params=base)
    chain = Aggregator([ClipL2(clip), Uniform(), GaussianNoise(sigma, clip)])
    ups = [_update(c, {k: v.clone() for k, v in base.items()}, n=c + 1) for c in range(m)]
    c1 = round_ctx(1)
    new = aggregate_chain(chain, state, ups, c1)
    x = torch.cat([new.global_params["a"], new.global_params["b"]]).double()
    std = sigma * clip / m
    assert abs(float(x.mean())) <= 5 * std / math.sqrt(n)
    assert abs(float(x.std()) / std - 1) <= 5 / math.sqrt(2 * n)
    assert new.aggregation["metrics"]["gaussian/std"] == pytest.approx(std)
    again = aggregate_chain(chain, state, ups, c1)
    assert torch.equal(again.global_params["a"], new.global_params["a"])  # same (seed, round): same draw
    other = aggregate_chain(chain, state, ups, round_ctx(2))
    assert not torch.equal(other.global_params["a"], new.global_params["a"])


def test_without_clipping_or_noise_the_chain_is_the_uniform_mean_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(5, 7, generator=g), "n": torch.tensor(3)}
    ups = [
        _update(c, {"w": torch.randn(5, 7, generator=g), "n": torch.tensor(3 + c)}, n=10 * (c + 1))
        for c in range(3)
    ]
    state = ServerState(round=0, global_params=base)
    noop = Aggregator([ClipL2(math.inf), Uniform(), GaussianNoise(0.0, math.inf)])
    uniform = aggregate_chain(Aggregator([Uniform()]), state, ups, None).global_params
    got = aggregate_chain(noop, state, ups, None).global_params
    assert torch.equal(got["w"], uniform["w"]) and torch.equal(got["n"], uniform["n"])
    written = sum(u.params["w"].double() for u in ups) / 3
    assert torch.allclose(uniform["w"].double(), written, rtol=0, atol=4 * torch.finfo(torch.float32).eps * 4)
    assert int(uniform["n"]) == 4  # (3 + 4 + 5) / 3, an integer buffer: rounded


def test_updates_out_of_client_order_are_refused():
    state = ServerState(round=0, global_params={"w": torch.zeros(2)})
    agg = Aggregator()
    acc = agg.add(agg.start(state), _update(2, {"w": torch.ones(2)}))
    with pytest.raises(ValueError, match="increasing client-id order"):
        agg.add(acc, _update(1, {"w": torch.ones(2)}))


def test_the_driver_sums_each_update_as_it_arrives_and_keeps_none(digits3):  # noqa: F811
    """The run's loop summing each update into the chain as it arrives (`runtime/summing.py`):
    the updates the round's callbacks see hold no values (their params are meta tensors: the
    keys, shapes and bytes uploaded, no storage), and the states equal, bit for bit, those of
    the loop that keeps every update and sums the list (`Strategy.average`). In an order that
    is not the clients' (Ray's completion order) too. FedNova reads each raw update
    (`aggregates_through_chain` False): it gets them whole."""
    from fl_lightning.runtime.executor import SerialExecutor
    from fl_lightning.runtime.summing import SummingExecutor
    from fl_lightning.testing import loop

    from .run_files import assert_equal

    def chain():
        return Aggregator([ClipL2(0.5), Uniform()])

    kept = loop("fedadam", digits3, method=FEDADAM, aggregator=chain())
    summed = loop("fedadam", digits3, method=FEDADAM, aggregator=chain(), sum_on_arrival=True)
    assert [p.client_ids for p in summed.plans] == [[0, 1], [0, 2]]
    for a, b in zip(kept.states, summed.states, strict=True):
        assert_equal(a.global_params, b.global_params)
        assert_equal((a.m, a.v, a.aggregation), (b.m, b.v, b.aggregation))
    assert all(v.is_meta for ups in summed.updates for u in ups for v in (u.params or {}).values())
    assert not any(v.is_meta for ups in kept.updates for u in ups for v in (u.params or {}).values())
    assert [r.bytes_up for r in summed.records] == [r.bytes_up for r in kept.records] != [0, 0]

    class Reversed(SerialExecutor):  # the cohort's updates last client first
        def fit(self, plan):
            return reversed(list(super().fit(plan)))

    # round 1 again (FedAdam's clients keep no state): arriving 1 then 0, summed as 0 then 1
    strategy = summed.strategy
    state, ctx1 = strategy.init_state(summed.init), ctx(strategy, 1)
    s = Summed(strategy.aggregator, strategy.aggregator.start(state, ctx1))
    plan = strategy.configure_round(state, 1, round_rng(0, 1))
    arrived = list(SummingExecutor(Reversed(summed.host), s, ctx1).fit(plan))
    assert [u.client_id for u in arrived] == [0, 1]
    again, _ = aggregated(aggregate_with(strategy, state, arrived, dataclasses.replace(ctx1, summed=s)))
    assert_equal((again.global_params, again.m, again.v), (kept.states[0].global_params, kept.states[0].m,
                                                          kept.states[0].v))  # fmt: skip

    nova = loop("fednova", digits3, sum_on_arrival=True)
    assert not any(v.is_meta for ups in nova.updates for u in ups for v in (u.params or {}).values())


@pytest.mark.parametrize(
    "steps, says",
    [
        ("[gaussian]", "needs clip_l2 and uniform before it"),
        ("[clip_l2,gaussian]", "needs uniform before it"),
        ("[clip_l2,clip_l2]", "names a step twice"),
        ("[trimmed]", "unknown step 'trimmed'"),
    ],
)
def test_a_chain_that_cannot_be_right_is_one_line(steps, says):
    with pytest.raises(ConfigError, match=says):
        compose(["method=fedavg", f"aggregator.steps={steps}"]).check()


def test_by_configuration_alone_a_noisy_chain_runs_and_serial_equals_ray(tmp_path, data_root, ray_workers):
    """FedAdam with [clip_l2,uniform,gaussian] from the command line: the chain's metrics are in
    every line, and Ray gives the serial run's numbers bit for bit (the noise is drawn from
    (seed, round), not from which worker answers first). A method that would ignore the chain
    (FedDyn computes its weights from the raw updates) is refused before anything is written."""
    chain = [
        "aggregator.steps=[clip_l2,uniform,gaussian]",
        "aggregator.clip=0.5",
        "aggregator.noise_multiplier=0.2",
    ]
    args = small(tmp_path, "method=fedadam", "fl.rounds=2", "fl.num_clients=3", "fl.clients_per_round=2",
                 "data.train_subset=300", "runtime.threads_per_client=1", *chain)  # fmt: skip
    _, sdir = start_run(compose([*args, "runtime=serial", "run_id=serial"]), console=False)
    # two pooled actors, warm from the test before (`ray_workers`)
    _, rdir = start_run(
        compose([*args, "runtime=ray", "runtime.placement=pool", "runtime.num_actors=2", "run_id=ray"]),
        console=False,
        session=ray_workers,
    )
    serial, ray = records(sdir), records(rdir)
    assert serial == ray
    for line in serial:
        assert line["server/gaussian/std"] == pytest.approx(0.2 * 0.5 / 2)
        assert 0 <= line["server/clip_l2/clipped"] <= 1 and line["server/clip_l2/norm"] > 0
    with pytest.raises(ConfigError, match="feddyn does not aggregate through the aggregation chain"):
        start_run(compose([*small(tmp_path, "method=feddyn", "aggregator.steps=[clip_l2]"), "run_id=dyn"]))
    assert not (tmp_path / "default" / "dyn").exists()
