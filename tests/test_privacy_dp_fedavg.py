"""`privacy=dp_fedavg` (core/privacy/steps.py) against its arithmetic written out by hand, and in
real runs: the noise's moments, the clip, σ = 0 as the uniform mean bit for bit, adaptive
clipping's geometric update, Poisson cohorts' fixed denominator and empty rounds, two golden
rounds with partial participation through FedAvg's, FedAvgM's and FedAdam's server steps;
serial == Ray, kill -9 and resume, the budget stop, the refusals, and the methods it runs."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.aggregation import Aggregator, Uniform, aggregate_chain
from fl_lightning.core.errors import ConfigError
from fl_lightning.core.messages import ServerState
from fl_lightning.core.privacy.accountant import Sampling
from fl_lightning.core.privacy.plan import PrivacyPlan
from fl_lightning.core.privacy.steps import DpFedAvgStep
from fl_lightning.runtime.runner import start_run
from fl_lightning.testing import cast, match, train, twin, two_rounds

from .conftest import small
from .run_files import assert_same_run, kill_after_checkpoint, records
from .test_aggregation import (
    FEDADAM,
    FEDAVGM,
    _update,
    clipped_uniform_mean,
    delta_norms,
    round_ctx,
    server_step,
)
from .test_methods import digits3  # noqa: F401  (a fixture)


def plan(sigma=0.0, clip=1.0, cohort=4, population=100, kind="without_replacement", **kw):
    """A plan written out (no calibration): σ_Δ = σ unless given, σ_b as given."""
    return PrivacyPlan(
        name="dp_fedavg", clip=clip, noise_multiplier=sigma,
        update_noise_multiplier=kw.pop("update_sigma", sigma), count_stddev=kw.pop("count_stddev", 0.0),
        sampling=Sampling(kind, population, cohort), delta=1e-5, method="rdp", rounds=10, **kw,
    )  # fmt: skip


def zeros_state(n):
    return ServerState(round=0, global_params={"a": torch.zeros(n // 2), "b": torch.zeros(n // 2)})


def flat(params):
    return torch.cat([params["a"], params["b"]]).double()


@pytest.mark.parametrize("adaptive", [False, True])
def test_noised_mean_has_mean_0_and_std_sigma_c_over_m(adaptive):
    """n = 200,000 coordinates of zero deltas from m = 4 clients: the sample mean within 5 σ/√n of
    0, the sample std within 5 standard errors (1/√(2n)) of σ_Δ·C/m, where adaptive clipping's
    σ_Δ for σ = 1, σ_b = 5 is 1.00503782 (FLSim's test)."""
    n, m, clip = 200_000, 4, 0.5
    p = plan(1.0, clip, m, update_sigma=1.00503782 if adaptive else 1.0, count_stddev=5.0, adaptive=adaptive)
    state = zeros_state(n)
    ups = [_update(c, {k: v.clone() for k, v in state.global_params.items()}, n=c + 1) for c in range(m)]
    new = aggregate_chain(Aggregator([DpFedAvgStep(p)]), state, ups, round_ctx(1))
    x, std = flat(new.global_params), p.update_noise_multiplier * clip / m
    assert abs(float(x.mean())) <= 5 * std / math.sqrt(n)
    assert abs(float(x.std()) / std - 1) <= 5 / math.sqrt(2 * n)
    assert new.aggregation["dp_fedavg"]["rounds"] == 1
    # the clients' own norms and clip bits are not in the logs; only what was noised
    assert set(new.aggregation["metrics"]) <= {
        "dp_fedavg/clip",
        "dp_fedavg/std",
        "dp_fedavg/unclipped_noised",
    }


def test_an_update_of_norm_2c_arrives_at_norm_c_and_weights_are_uniform():
    base = {"w": torch.zeros(3, 4), "b": torch.zeros(4)}
    state = ServerState(round=0, global_params=base)
    big = {"w": torch.full((3, 4), 1.0), "b": torch.full((4,), 1.0)}  # norm 4 = 2C
    step = Aggregator([DpFedAvgStep(plan(0.0, clip=2.0, cohort=1))])
    new = aggregate_chain(step, state, [_update(0, big, n=1000)], None)
    norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in new.global_params.values()))
    assert abs(norm - 2.0) <= 1e-6 * 2.0
    # two clients of 1 and 1,000 examples count the same: (C·u + 0.1·u) / 2 for the same direction u
    small_ = {"w": torch.full((3, 4), 0.025), "b": torch.full((4,), 0.025)}  # norm 0.1
    two = aggregate_chain(
        Aggregator([DpFedAvgStep(plan(0.0, clip=2.0, cohort=2))]),
        state, [_update(0, big, n=1000), _update(1, small_, n=1)], None,
    )  # fmt: skip
    assert float(two.global_params["b"][0]) == pytest.approx((0.5 + 0.025) / 2, rel=1e-6)


def test_sigma_0_and_no_clip_is_the_uniform_mean_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(5, 7, generator=g)}
    ups = [_update(c, {"w": torch.randn(5, 7, generator=g)}, n=10 * (c + 1)) for c in range(3)]
    state = ServerState(round=0, global_params=base)
    got = aggregate_chain(Aggregator([DpFedAvgStep(plan(0.0, clip=math.inf, cohort=3))]), state, ups, None)
    uniform = aggregate_chain(Aggregator([Uniform()]), state, ups, None)
    assert torch.equal(got.global_params["w"], uniform.global_params["w"])


def test_adaptive_clipping_moves_c_geometrically_toward_the_quantile():
    """C_{t+1} = C_t·exp(−η(b̃/m − γ)), b̃ the count of updates within C_t plus N(0, σ_b²)
    (σ_b = 1e-9 here, so b̃ is the count to 1e-9): 1 of 4 updates within C = 1 at γ 0.5, η 0.2."""
    norms = [0.5, 2.0, 3.0, 4.0]
    state = ServerState(round=0, global_params={"w": torch.zeros(1)})
    ups = [_update(c, {"w": torch.tensor([v])}) for c, v in enumerate(norms)]
    p = plan(0.0, 1.0, 4, count_stddev=1e-9, adaptive=True, target_quantile=0.5, clip_lr=0.2)
    chain = Aggregator([DpFedAvgStep(p)])
    new = aggregate_chain(chain, state, ups, round_ctx(1))
    c1 = 1.0 * math.exp(-0.2 * (1 / 4 - 0.5))
    assert new.aggregation["dp_fedavg"]["clip"] == pytest.approx(c1, rel=1e-8)
    assert float(new.global_params["w"]) == pytest.approx((0.5 + 1 + 1 + 1) / 4, rel=1e-6)
    # the next round clips to C_1 and says so (the same deltas, from the new model)
    w1 = new.global_params["w"]
    ups2 = [_update(c, {"w": w1 + v}) for c, v in enumerate(norms)]
    again = aggregate_chain(chain, new, ups2, round_ctx(2))
    assert again.aggregation["metrics"]["dp_fedavg/clip"] == pytest.approx(c1)
    assert float(again.global_params["w"] - new.global_params["w"]) == pytest.approx(
        (0.5 + 3 * c1) / 4, rel=1e-6
    )


def test_poisson_cohorts_divide_by_the_expected_cohort_and_noise_empty_rounds():
    p = plan(0.0, 10.0, cohort=4, kind="poisson")
    state = ServerState(round=0, global_params={"w": torch.zeros(2)})
    ups = [_update(c, {"w": torch.ones(2)}) for c in range(2)]  # 2 arrived of 4 expected
    new = aggregate_chain(Aggregator([DpFedAvgStep(p)]), state, ups, None)
    assert torch.equal(new.global_params["w"], torch.full((2,), 0.5))  # (1 + 1) / 4
    noisy = plan(1.0, 1.0, cohort=4, kind="poisson")
    empty = aggregate_chain(Aggregator([DpFedAvgStep(noisy)]), state, [], round_ctx(1))
    assert not torch.equal(empty.global_params["w"], state.global_params["w"])  # its noise, released
    assert empty.aggregation["dp_fedavg"]["rounds"] == 1


@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedadam"])
def test_dp_fedavg_composes_with_the_methods_server_step_over_two_rounds(name, digits3):  # noqa: F811
    """Two rounds, 2 of 3 clients each, σ = 0: the clipped uniform mean and each method's own server
    step, written out (test_aggregation's reference). Mutations caught: example weights kept, the
    clip per tensor or inverted, the method's step skipped."""
    kwargs = {"fedavg": {}, "fedavgm": FEDAVGM, "fedadam": FEDADAM}[name]
    probe_init, probe_plans, _, _ = two_rounds(name, digits3, **kwargs)
    n0, n1 = delta_norms(digits3, probe_plans[0], cast(probe_init, torch.float64))
    clip = math.sqrt(n0 * n1)
    chain = Aggregator([DpFedAvgStep(plan(0.0, clip, cohort=2, population=3))])
    init, plans, states, _ = two_rounds(name, digits3, aggregator=chain, **kwargs)

    def reference(dt):
        w, mem, rounds = cast(init, dt), {}, []
        for pl in plans:
            models = [(p.client_id, train(digits3, p.client_id, p.seed, w, dt)) for p in pl.payloads]
            w = server_step(name, w, clipped_uniform_mean(w, models, clip), mem)
            rounds.append(dict(w))
        return rounds

    r32, r64 = twin(reference)
    match(states[0].global_params, (r32[0], r64[0]))
    match(states[1].global_params, (r32[1], r64[1]))


DP = ["privacy=dp_fedavg", "fl.num_clients=4", "fl.clients_per_round=2", "privacy.delta=1e-3"]

#: what privacy=dp_fedavg refuses, and a part of the line that says so
REFUSED = [
    (
        ["method=fedtgp", "data.client_test_fraction=0.25"],
        "method=fedtgp also uploads class prototypes",
    ),
    (
        ["method=fedtsp", "data.client_test_fraction=0.25"],
        "add method.weighting=uniform",
    ),
    (
        ["method=fedproto", "data.client_test_fraction=0.25", "privacy.adaptive=true"],
        "set privacy.adaptive=false",
    ),
    (["method=scaffold"], "method=scaffold also uploads control-variate deltas"),
    (["method=feddyn"], "feddyn does not aggregate through the aggregation chain"),
    (["model=cnn_bn"], "uploads integer buffers"),
    (["fl.bn_stats=recompute"], "fl.bn_stats=recompute also uploads"),
    (["aggregator.steps=[uniform]"], "privacy=dp_fedavg is its own aggregation chain"),
    (
        [
            "aggregator.steps=[clip_l2,uniform,distributed_gaussian,secagg_plus]",
            "aggregator.noise_multiplier=1",
        ],
        "the accountant for it is missing",
    ),
    (["privacy.adaptive=true", "privacy.clipped_count_stddev=0.1"], "adaptive clipping needs 2·σ_b > σ"),
    (
        ["privacy.noise_multiplier=null", "privacy.target_epsilon=4", "privacy.max_epsilon=2"],
        "would stop",
    ),
    (["system.mode=fedbuff", "system.buffer=2"], "use system.mode=sync"),
]
#: refused once the method's strategy (how it aggregates) or the model (its buffers) is built,
#: after torch is imported; the others from the config alone
BUILT = {"feddyn does not aggregate through the aggregation chain", "uploads integer buffers"}


@pytest.mark.parametrize("extra, says", REFUSED)
def test_what_dp_fedavg_cannot_privatise_is_refused_in_one_line(extra, says, tmp_path, capsys, data_root):
    code = main(["run", *small(tmp_path, *DP, *extra)])
    # a line Ray's log monitor forwards from another test's Ray in this worker is not ours
    err = "".join(line for line in capsys.readouterr().err.splitlines(True) if "(pid=" not in line)
    assert code == 2 and err.count("\n") == 1 and err.startswith("fl-lightning: error: "), err
    assert says in err
    assert not (tmp_path / "default").exists()


def test_a_plan_with_prototype_releases_refuses_adaptive_clipping_itself():
    """The command line refuses adaptive clipping for FedProto before Ray (`check_method`); a plan
    made without that check (the testing kit's loops, a user's own driver) refuses it too."""
    cfg = compose([*DP, "privacy.noise_multiplier=1", "privacy.adaptive=true"])
    assert PrivacyPlan.of(cfg.privacy, cfg.fl, 2, releases=1).adaptive
    with pytest.raises(ConfigError, match="set privacy.adaptive=false"):
        PrivacyPlan.of(cfg.privacy, cfg.fl, 2, releases=2)


#: each command line of argv[1] through `main` in a fresh interpreter that cannot import torch,
#: Lightning or Ray: what it printed and returned
_WITHOUT_TORCH = """
import contextlib, importlib.abc, io, json, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "lightning", "ray"):
            raise ImportError(f"{name} imported before the refusal")

sys.meta_path.insert(0, NoTorch())
from fl_lightning.cli.main import main

said = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        said.append([main(argv), err.getvalue()])
print(json.dumps(said))
"""


def test_a_refusal_from_the_config_comes_before_torch_or_ray(tmp_path, data_root):
    """Each refused configuration the model is not needed for is refused by the command line
    before torch, Lightning or Ray is imported: it started a Ray and two client workers (~4 s
    and ~3 CPU-s) before saying so."""
    cases = [(extra, says) for extra, says in REFUSED if says not in BUILT]
    argv = [["run", *small(tmp_path, *DP, *extra)] for extra, _ in cases]
    env = {**os.environ, "FL_LIGHTNING_DATA": data_root}
    res = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, json.dumps(argv)], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    for (code, err), (_, says) in zip(json.loads(res.stdout), cases, strict=True):
        assert code == 2 and err.count("\n") == 1 and says in err, (says, err)
    assert not (tmp_path / "default").exists()


ADAPTIVE = [
    "privacy.adaptive=true",
    "privacy.clip=0.5",
    "privacy.noise_multiplier=0.3",
    "privacy.clipped_count_stddev=1",
]


@pytest.mark.slow
def test_serial_equals_ray_and_epsilon_is_reported(tmp_path, data_root, ray_workers):
    args = small(
        tmp_path, *DP, *ADAPTIVE, "fl.rounds=2", "data.train_subset=400", "runtime.threads_per_client=1"
    )
    s_sum, sdir = start_run(compose([*args, "runtime=serial", "run_id=serial"]), console=False)
    _, rdir = start_run(
        compose([*args, "runtime=ray", "runtime.placement=pool", "runtime.num_actors=2", "run_id=ray"]),
        console=False,
        session=ray_workers,
    )
    serial, ray = records(sdir), records(rdir)
    assert serial == ray
    eps = [line["privacy/epsilon"] for line in serial]
    assert 0 < eps[0] < eps[1] and all(line["privacy/delta"] == 1e-3 for line in serial)
    assert serial[1]["privacy/clip"] != 0.5  # adaptive: round 2 clipped to C_1
    p = s_sum["privacy"]
    assert p["epsilon"] == eps[-1] and p["adjacency"] == "replace-one" and "user-level" in p["covers"]


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_epsilon_and_weights(tmp_path, data_root):
    args = small(tmp_path, *DP, *ADAPTIVE, "fl.rounds=3", "runtime=serial", "data.train_subset=1500")
    _, full_dir = start_run(compose([*args, "experiment=full", "run_id=a"]), console=False)
    killed = tmp_path / "killed" / "b"
    kill_after_checkpoint([*args, "experiment=killed", "run_id=b"], killed)
    assert main(["resume", str(killed), "--quiet"]) == 0
    assert_same_run(killed, full_dir, stateful=False)  # ε, C_t and noise in every line; the weights
    a = json.loads((killed / "summary.json").read_text())["privacy"]
    b = json.loads((full_dir / "summary.json").read_text())["privacy"]
    assert a == b


@pytest.mark.slow
def test_max_epsilon_stops_before_it_is_passed_and_resume_spends_no_more(tmp_path, data_root, capsys):
    args = small(tmp_path, *DP, "privacy.noise_multiplier=1.0", "fl.rounds=4", "runtime=serial",
                 "data.train_subset=400", "run_id=cap")  # fmt: skip
    cfg = compose(args)
    p = PrivacyPlan.of(cfg.privacy, cfg.fl, 2)
    cap = (p.epsilon(2) + p.epsilon(3)) / 2  # round 3 would pass it
    summary, run_dir = start_run(compose([*args, f"privacy.max_epsilon={cap}"]), console=False)
    assert summary["status"] == "budget_spent" and summary["rounds_completed"] == 2
    assert summary["privacy"]["epsilon"] == p.epsilon(2) <= cap
    assert main(["resume", str(run_dir), "--quiet"]) == 0
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["status"] == "budget_spent" and again["rounds_completed"] == 2
    assert len(records(run_dir)) == 2


METHOD_ARGS = {
    "fedavg": [],
    "fedprox": [],
    "fedavgm": [],
    "fedadam": [],
    "fedglcl": [],
    "promptfl": ["model.arch=clip-tiny-random"],
    # the prototypes clipped and noised, composed in the same accountant (test_privacy_prototypes,
    # whose serial == Ray run is FedProto's run at its defaults, and DP-FPL's in test_privacy_dpfpl)
    "fedtsp": ["data.client_test_fraction=0.25", "method.weighting=uniform", "method.server_epochs=2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHOD_ARGS))
def test_dp_fedavg_runs_each_method_at_its_defaults(method, tmp_path, data_root):
    args = small(tmp_path, f"method={method}", *METHOD_ARGS[method], *DP, "fl.rounds=1", "runtime=serial",
                 "data.train_subset=200", "data.test_subset=100", "fl.local_epochs=1")  # fmt: skip
    summary, run_dir = start_run(compose(args), console=False)
    assert summary["status"] == "completed"
    line = records(run_dir)[0]
    # the model's noise, or (FedProto, FedTSP without shared weights) the prototypes' own
    std = line.get("server/dp_fedavg/std", line.get("server/dp_fedavg/prototype_sum_std", 0.0))
    assert line["privacy/epsilon"] > 0 and std > 0


@pytest.mark.slow
def test_wandb_charts_epsilon_by_round_and_compare_groups_by_target_epsilon(tmp_path, capsys, monkeypatch):
    """A sweep over privacy.target_epsilon with W&B offline: every round's privacy/epsilon is in
    W&B's history (its own section, over `round`) beside eval/accuracy, the summary's privacy block
    too; `compare --by privacy.target_epsilon` groups the runs by their target."""
    from .test_compare import TINY
    from .wandb_files import read_finished_run

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    out = tmp_path / "runs"
    args = ["sweep", "privacy=dp_fedavg", "privacy.noise_multiplier=null", "privacy.target_epsilon=2,8",
            "privacy.delta=0.01", "privacy.clip=0.01", *TINY,
            "logger=wandb", "logger.mode=offline"]  # fmt: skip
    assert main([*args, f"output_dir={out}", "experiment=eps", "--no-plots"]) == 0, capsys.readouterr()
    runs = sorted(p for p in (out / "eps").iterdir() if (p / "summary.json").is_file())
    assert len(runs) == 2
    for run_dir in runs:
        (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
        logged = read_finished_run(path)
        rows = [h for h in logged["history"] if h["round"] >= 1]
        lines = records(run_dir)
        assert [h["privacy/epsilon"] for h in rows] == [r["privacy/epsilon"] for r in lines]
        assert all("eval/accuracy" in h for h in rows)
        target = logged["config"]["privacy.target_epsilon"]
        assert lines[-1]["privacy/epsilon"] <= target  # the calibrated σ never overshoots
        assert logged["summary"]["privacy/epsilon"] == lines[-1]["privacy/epsilon"]
    capsys.readouterr()
    assert main(["compare", str(out / "eps"), "--by", "privacy.target_epsilon", "--no-plots"]) == 0
    table = capsys.readouterr().out
    assert "2.0" in table and "8.0" in table


def test_a_resume_that_would_change_sigma_is_refused():
    """σ calibrated for fl.rounds changes when a resume extends the run: the step's memory keeps
    the σ its rounds used, and the next round is refused before it trains."""
    first = plan(1.0, 1.0, 4)
    state = ServerState(round=0, global_params={"w": torch.zeros(2)})
    ups = [_update(c, {"w": torch.ones(2)}) for c in range(4)]
    new = aggregate_chain(Aggregator([DpFedAvgStep(first)]), state, ups, round_ctx(1))
    memory = new.aggregation["dp_fedavg"]
    assert memory["noise_multiplier"] == 1.0
    first.check_budget(2, memory)  # the same σ: fine
    with pytest.raises(ConfigError, match="used noise multiplier 1 and this one would use 0.9"):
        dataclasses.replace(first, noise_multiplier=0.9).check_budget(2, memory)
