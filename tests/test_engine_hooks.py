"""Engine v2 hooks on real parts: metrics that belong to the task (multi-label), local
training in phases (checked against a written-out loop), named client/server metrics,
divergence as one line, build errors that name their part (total client failure as one
line: test_faults.py, on its shared executor)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.errors import ConfigError
from fl_lightning.core.messages import Broadcast
from fl_lightning.core.objective import ClientObjective, Phase
from fl_lightning.core.optim import OptimConfig
from fl_lightning.core.params import to_cpu
from fl_lightning.core.strategy import FedAvgStrategy, MethodConfig, TaskInfo, round_rng
from fl_lightning.methods import METHODS
from fl_lightning.runtime.host import ClientHost, build_objective
from fl_lightning.runtime.runner import prepare, start_run

from .conftest import small
from .test_methods import BS, Toy, client_data, digits, toy_spec  # noqa: F401  (digits: a fixture)

MULTILABEL_KEYS = ("c_ap", "o_ap", "c_p", "c_r", "c_f1", "o_p", "o_r", "o_f1", "loss")


def _records(run_dir):
    # strict JSON: a bare NaN/Infinity token would raise here
    return [
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


def test_multilabel_fedavg_trains_with_bce_and_logs_the_paper_metrics(tmp_path, data_root):
    cfg = compose(small(tmp_path, "data=fmnist_multilabel", "runtime=serial", "fl.num_clients=2",
                        "data.train_subset=600", "data.test_subset=200"))  # fmt: skip
    summary, run_dir = start_run(cfg, console=False)
    recs = _records(run_dir)
    assert [r["round"] for r in recs] == [1, 2]
    for r in recs:
        for k in MULTILABEL_KEYS:
            assert math.isfinite(r[k]) and (k == "loss" or 0.0 <= r[k] <= 1.0), k
        assert "accuracy" not in r and r["client/loss/bce"] == pytest.approx(r["train_loss"], rel=1e-9)
    assert summary["primary_metric"] == "c_ap"
    assert summary["final_c_ap"] == recs[-1]["c_ap"] and summary["best_c_ap"] == max(r["c_ap"] for r in recs)
    assert "final_accuracy" not in summary


# --- phases: a FedRep-like objective, head then body, each its own optimiser ---------------

HEAD = OptimConfig(name="sgd", lr=0.1, momentum=0.0)
BODY = OptimConfig(name="adamw", lr=0.01, weight_decay=0.05)
CLIP = 0.5


class TwoPhaseObjective(ClientObjective[Broadcast]):
    def phases(self) -> list[Phase]:
        return [
            Phase("head", trainable=lambda n: n.startswith("head."), optim=HEAD, epochs=1),
            Phase(
                "body", trainable=lambda n: not n.startswith("head."), optim=BODY, epochs=2, grad_clip=CLIP
            ),
        ]

    def before_fit(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.client_state["seen"] = torch.bincount(y, minlength=10)  # a pass over the local data


if "test_two_phase" not in METHODS:

    @METHODS.register("test_two_phase")
    @dataclass
    class TwoPhaseConfig(MethodConfig):
        pass

    class TwoPhase(FedAvgStrategy[TwoPhaseConfig]):
        objective_cls = TwoPhaseObjective


def test_phases_are_fits_with_their_own_parameters_optimiser_length_and_clipping(digits):  # noqa: F811
    threads = torch.get_num_threads()
    try:
        _check_phases(digits)
    finally:
        torch.set_num_threads(threads)


def _check_phases(digits) -> None:  # noqa: F811
    ds, shards = digits
    torch.manual_seed(0)
    init = to_cpu(Toy().state_dict())
    host = ClientHost(toy_spec("test_two_phase", {}, init), ds, {0: shards[0]})
    strategy = METHODS.get("test_two_phase")(
        METHODS.get("test_two_phase").config_cls(), 1, 1, 0, TaskInfo(num_classes=10)
    )
    plan = strategy.configure_round(strategy.init_state(init), 1, round_rng(0, 1))
    update = host.fit(plan.broadcast, plan.payloads[0])

    # the same training written out: one loader (its generator runs on across phases), on
    # one thread as the host runs it (Adam's first steps are ±lr·sign(g): a gradient of 1e-9
    # computed by another kernel could flip them, so the two paths must use the same kernels)
    torch.set_num_threads(1)
    x, y = client_data(digits, 0)
    seed = plan.payloads[0].seed
    torch.manual_seed(seed)
    m = Toy()
    m.load_state_dict(init)
    loader = DataLoader(
        TensorDataset(x, y), batch_size=BS, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    head = [p for n, p in m.named_parameters() if n.startswith("head.")]
    body = [p for n, p in m.named_parameters() if not n.startswith("head.")]
    m.train()
    opt = torch.optim.SGD(head, lr=HEAD.lr, momentum=0.0)
    for xb, yb in loader:
        opt.zero_grad()
        F.cross_entropy(m(xb), yb).backward()
        opt.step()
    opt2 = torch.optim.AdamW(body, lr=BODY.lr, weight_decay=BODY.weight_decay)
    for _ in range(2):
        for xb, yb in loader:
            opt2.zero_grad()
            for p in head:
                p.grad = None
            F.cross_entropy(m(xb), yb).backward()
            torch.nn.utils.clip_grad_norm_(body, CLIP)
            opt2.step()
    for k, v in to_cpu(m.state_dict()).items():
        torch.testing.assert_close(update.params[k].double(), v.double(), atol=1e-6, rtol=1e-5, msg=k)
    # every parameter trains again in the next round (phases restore requires_grad)
    assert all(p.requires_grad for p in host.objective(0).model.parameters())
    assert torch.equal(host.states[0]["seen"], torch.bincount(y, minlength=10))


def test_client_loss_terms_and_metrics_are_logged_by_name(tmp_path, data_root):
    cfg = compose(small(tmp_path, "method=fedprox", "method.mu=0.5", "runtime=serial", "fl.rounds=1"))
    _, run_dir = start_run(cfg, console=False)
    (r,) = _records(run_dir)
    assert {"client/loss/ce", "client/loss/prox", "client/train_loss", "client/fit_time_s"} <= set(r)
    assert r["client/loss/prox"] > 0
    # the total is the sum of the named terms (both sample-weighted the same way); the total
    # is summed per step in float32 (relative error about 2^-24 per step), the terms apart
    assert r["train_loss"] == pytest.approx(r["client/loss/ce"] + r["client/loss/prox"], rel=1e-6)


def test_a_diverged_run_stops_with_one_line_and_is_marked(tmp_path, data_root, capsys):
    code = main(
        ["run", *small(tmp_path, "runtime=serial", "fl.rounds=3", "optim.lr=1e6", "run_id=nan"), "--quiet"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "diverged" in err[0] and "round 1" in err[0]
    run_dir = tmp_path / "default" / "nan"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (
        summary["status"] == "diverged"
        and summary["rounds_completed"] == 0
        and summary["final_accuracy"] is None
    )
    recs = _records(run_dir)
    assert recs[-1]["diverged"] is True and "train_loss" in recs[-1]["nonfinite"]
    assert not list(run_dir.glob("checkpoints/round-*.json"))  # nothing non-finite was checkpointed


def test_a_failing_run_writes_its_summary_with_its_own_error(tmp_path, data_root, capsys, monkeypatch):
    """summary.json of a failing run names the error that stopped it: a round that failed
    part-way leaves a line without `wall_time_s` (the run's is the last line's that has one),
    and a summary that cannot be made at all is written bare, never replacing the run's error."""
    from fl_lightning.runtime import runner
    from fl_lightning.runtime.summary import run_summary

    args = small(tmp_path, "runtime=serial", "fl.rounds=1", "optim.lr=1e6", "run_id=bare")
    cfg = compose(args)
    lines = [{"round": 1, "accuracy": 0.5, "wall_time_s": 2.5}, {"round": 2, "accuracy": 0.25}]
    out = run_summary(cfg, lines, "accuracy", "r", "failed", None, 0, 0, None, None, None, "boom")
    assert out["wall_time_s"] == 2.5 and out["error"] == "boom" and out["rounds_completed"] == 2

    def broken(*_a: object, **_k: object) -> dict[str, object]:
        raise KeyError("wall_time_s")

    monkeypatch.setattr(runner, "run_summary", broken)
    assert main(["run", *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "diverged" in err[-1] and "KeyError" not in err[-1]
    summary = json.loads((tmp_path / "default" / "bare" / "summary.json").read_text())
    assert summary["status"] == "diverged" and "non-finite" in summary["error"]
    assert summary["error"] in err[-1]  # the error the run printed
    assert summary["run_id"] == "bare" and summary["method"] == "fedavg"


def test_build_errors_name_the_part(tmp_path, data_root):
    p = prepare(compose(small(tmp_path, "runtime=serial")))
    spec = dataclasses.replace(p.spec, model_kwargs={**p.spec.model_kwargs, "bogus": 1})
    with pytest.raises(ConfigError, match=r"model 'cnn' takes no argument 'bogus'"):
        build_objective(spec)
    spec = dataclasses.replace(p.spec, objective_kwargs={"mu": 1.0})
    with pytest.raises(ConfigError, match=r"method 'fedavg' takes no argument 'mu'"):
        build_objective(spec)


# --- unstable participation (fl.fraction_range, the FedDTR paper's J ~ U[lo, 1]) ------------
@pytest.mark.slow
def test_fraction_range_draws_the_number_of_clients_each_round(tmp_path, data_root, capsys):
    import numpy as np

    args = small(tmp_path, "runtime=serial", "fl.num_clients=10", "fl.rounds=6", "fl.local_steps=1",
                 "fl.fraction_range=[0.3,1.0]", "eval.every=6", "seed=4")  # fmt: skip
    _, run_dir = start_run(compose(args), console=False)
    counts = [r["clients"] for r in _records(run_dir)]
    # PFLlib's rule, written out: k ~ UniformInt[int(0.3 * 10), int(1.0 * 10)], drawn first from
    # the round's stream (seed, round, 0x5EED), then k distinct clients from the same stream
    want = [int(np.random.default_rng([4, rnd, 0x5EED]).integers(3, 11)) for rnd in range(1, 7)]
    assert counts == want and len(set(counts)) > 1
    for bad in ("fl.fraction_range=[0.5,0.2]", "fl.fraction_range=[0,1]", "fl.fraction_range=[0.5]"):
        assert main(["run", *small(tmp_path / "x", bad), "--quiet"]) == 2
        assert "fl.fraction_range" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
