"""FedTSP and the heterogeneous-model baselines, on the real parts: MiniLM weights, the
Lightning Trainer, Fashion-MNIST, local Ray. The client loss is checked against a plain
PyTorch loop; the server step against the frozen encoder's weights; what leaves a client
against its bytes; runs, Ray and resume end to end.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.errors import ConfigError
from fl_lightning.core.messages import tensor_nbytes
from fl_lightning.core.strategy import OptimConfig, ServerContext, TaskInfo, round_rng, server_rng
from fl_lightning.data.registry import load_dataset
from fl_lightning.methods.fedtsp import FedTSP, FedTSPConfig, FedTSPState
from fl_lightning.models import MODELS, architecture, build_client_model, register_family
from fl_lightning.models.backbones import Backbone
from fl_lightning.runtime import checkpoint
from fl_lightning.runtime.host import ClientHost, ClientSpec, initial_params
from fl_lightning.runtime.runner import start_run
from fl_lightning.server_steps.prompt_tuning import LN_100, prototype_infonce
from fl_lightning.testing import check
from fl_lightning.testing import manual_fit as kit_manual_fit

from .conftest import once
from .test_methods import EPS32, match, twin

LR, MOM, BS, LAM = 0.01, 0.9, 16, 7.0
#: How far two float32 forwards of the frozen text encoder may put one unit-norm feature
#: element apart (kernel order, with or without autograd): 1e-6, about 30 ulps of the
#: largest element (~0.2) for 6 transformer layers; measured 0 between the driver's and a
#: test's forward, at 1, 2 and 8 threads.
ENC_TOL = 1e-6


def toy_a(num_classes: int, in_channels: int = 1, image_size: int = 28, feature_dim: int = 16) -> Backbone:
    trunk = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size**2, 16), nn.ReLU())
    neck = nn.Sequential(nn.Linear(16, feature_dim), nn.BatchNorm1d(feature_dim))
    return Backbone(trunk, neck, nn.Linear(feature_dim, num_classes), feature_dim)


def toy_b(num_classes: int, in_channels: int = 1, image_size: int = 28, feature_dim: int = 16) -> Backbone:
    side = (image_size - 5) // 3 + 1
    trunk = nn.Sequential(nn.Conv2d(in_channels, 4, 5, stride=3), nn.ReLU())
    neck = nn.Sequential(nn.Linear(4 * side * side, feature_dim), nn.BatchNorm1d(feature_dim))
    return Backbone(trunk, neck, nn.Linear(feature_dim, num_classes), feature_dim)


if "toy_tsp" not in MODELS:
    MODELS.register("toy_tsp_a")(toy_a)
    MODELS.register("toy_tsp_b")(toy_b)
    register_family("toy_tsp", ["toy_tsp_a", "toy_tsp_b"])


@pytest.fixture(scope="module")
def fmnist(data_root):
    ds = load_dataset("fmnist", data_root).subset(2000, 100)
    shards = {0: np.flatnonzero(ds.train_y < 6)[:60], 1: np.flatnonzero(ds.train_y >= 3)[:50]}
    return ds, shards


@pytest.fixture(scope="module")
def tsp(fmnist):
    """FedTSP on the driver with real MiniLM (built once for the module)."""
    ds, _ = fmnist
    task = TaskInfo(
        num_classes=10, class_names=tuple(ds.class_names), dataset="fmnist", has_client_test_split=True
    )
    config = FedTSPConfig(lam=LAM, server_epochs=3, prompt_momentum=0.9)
    return FedTSP(config, num_clients=2, clients_per_round=2, seed=0, task=task)


@pytest.fixture(scope="module")
def golden(fmnist, tsp):
    """One round of two clients with different architectures (toy_tsp: a, b)."""
    ds, shards = fmnist
    spec = ClientSpec(
        method="fedtsp",
        objective_kwargs=tsp.objective_kwargs(),
        model="toy_tsp",
        model_kwargs=tsp.model_kwargs("toy_tsp", {}),
        optim=OptimConfig(lr=LR, momentum=MOM),
        num_classes=10,
        in_channels=1,
        image_size=28,
        batch_size=BS,
        threads=1,
        accelerator="cpu",
        init_seed=0,
    )
    host = ClientHost(spec, ds, shards)
    state = tsp.init_state(None)
    plan = tsp.configure_round(state, 1, round_rng(0, 1))
    updates = sorted((host.fit(plan.broadcast, p) for p in plan.payloads), key=lambda u: u.client_id)
    aggregated = tsp.aggregate(state, updates)
    return spec, state, plan, updates, aggregated, host


def server_ctx(tsp, rnd: int = 1) -> ServerContext:
    return ServerContext(
        rnd, torch.device("cpu"), server_rng(0, rnd), tsp.task, lambda: toy_a(10, feature_dim=384)
    )


def manual_fit(model: nn.Module, x, y, seed: int, loss_fn) -> tuple[nn.Module, float]:
    """The engine's local training as a plain loop (the kit's, at this file's rates), and its
    example-weighted mean loss."""
    total = [0.0]

    def counted(m: nn.Module, xb, yb):
        loss = loss_fn(m, xb, yb)
        total[0] += float(loss.detach()) * len(yb)
        return loss

    model, _ = kit_manual_fit(model, x, y, seed, counted, momentum=MOM, lr=LR)
    return model, total[0] / len(y)


def test_client_loss_is_ce_plus_lambda_infonce_to_text_prototypes(fmnist, tsp, golden):
    """Tolerances: `tests/test_methods.py::match`. The reference runs in float32 and float64
    on one thread like the engine; the engine must be within 16x the float32 reference's own
    rounding error of the float64 result. That error is large here (prototypes: ~1e-4
    relative after 4 steps: logits are cosines x 100, weighted 7x); a fixed atol of 1e-4
    failed on a CPU where the reference (then on all cores) and the engine (one thread) used
    different kernel orders.
    Mutations caught: λ dropped (1 for 7), the scale exp(s) dropped (cosine alone), the
    text term's sign flipped, prototypes in train mode instead of eval mode."""
    ds, shards = fmnist
    spec, state, plan, updates, aggregated, host = golden
    T = F.normalize(state.text_prototypes, dim=-1)
    assert T.shape == (10, 384) and float(plan.broadcast.logit_scale) == pytest.approx(LN_100)
    scale = math.exp(float(plan.broadcast.logit_scale))  # 1/τ = exp(s), s the broadcast logit scale

    def loss(m, x, y):  # Eq. 2 + Eq. 8, written out
        z = m.forward_features(x)
        t = T.to(z.dtype)
        return F.cross_entropy(m.head(z), y) + LAM * F.cross_entropy(scale * F.normalize(z, dim=-1) @ t.T, y)

    assert [architecture("toy_tsp", u.client_id) for u in updates] == ["toy_tsp_a", "toy_tsp_b"]
    for p, u, build in zip(plan.payloads, updates, (toy_a, toy_b), strict=False):
        x, y = ds.tensors(ds.train_x[shards[p.client_id]], ds.train_y[shards[p.client_id]])
        n = torch.bincount(y, minlength=10)

        def reference(dt, p=p, x=x, y=y, build=build, n=n):
            m = build(10, feature_dim=384).to(dt)
            m.load_state_dict(initial_params(spec, p.client_id))
            m, mean_loss = manual_fit(m, x, y, p.seed, loss)
            m.eval()  # image prototypes: class means of f(x) in eval mode over the training set
            with torch.no_grad():
                z = m.forward_features(x.to(dt))
            mean = torch.stack([z[y == c].mean(0) if n[c] else z.new_zeros(384) for c in range(10)])
            return sd(m), mean, torch.tensor(mean_loss, dtype=torch.float64)

        (m32, p32, l32), (m64, p64, l64) = twin(reference)
        match(host.states[u.client_id]["personal"], (m32, m64))  # the personal model after local training
        match({"prototypes": u.prototypes}, ({"prototypes": p32}, {"prototypes": p64}))
        loss_ref = ({"train_loss": l32}, {"train_loss": l64})
        match({"train_loss": torch.tensor(u.metrics["train_loss"])}, loss_ref)
        assert torch.equal(u.proto_counts, n)
    # the two clients started from different seeded models of different architectures
    assert set(host.states[0]["personal"]) != set(host.states[1]["personal"])
    # count-weighted aggregation (Eq. 6 up to a scale) of the uploads, in float64: the engine
    # sums in float64 and rounds once to float32 (within the 4-ulp floor of `match`)
    n0, n1 = updates[0].proto_counts.double(), updates[1].proto_counts.double()
    p0, p1 = updates[0].prototypes.double(), updates[1].prototypes.double()
    expect = (p0 * n0[:, None] + p1 * n1[:, None]) / (n0 + n1).clamp(min=1)[:, None]
    match({"image_prototypes": aggregated.image_prototypes}, ({"image_prototypes": expect},) * 2)
    assert torch.equal(aggregated.proto_counts, updates[0].proto_counts + updates[1].proto_counts)


def sd(m: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def test_only_prototypes_counts_and_metrics_leave_a_client(golden):
    _, _, plan, updates, _, _ = golden
    for u in updates:
        assert u.params is None  # no weights
        uploaded = {f.name: getattr(u, f.name) for f in dataclasses.fields(u)}
        tensors = {k: v for k, v in uploaded.items() if isinstance(v, torch.Tensor)}
        assert set(tensors) == {"prototypes", "proto_counts"}
        assert tensors["prototypes"].shape == (10, 384) and tensors["proto_counts"].shape == (10,)
        assert all(tensor_nbytes(v) == 0 for k, v in uploaded.items() if k not in tensors)  # nothing nested
        assert all(isinstance(v, float) for v in u.metrics.values())
        assert u.upload_nbytes() == 10 * 384 * 4 + 10 * 8
    # down: text prototypes and the logit scale only
    assert plan.broadcast.global_params is None and plan.broadcast.nbytes() == 10 * 384 * 4 + 4


def test_server_step_tunes_only_the_prompts_through_the_frozen_encoder(tsp, golden):
    aggregated = golden[4]
    enc = tsp.tuner.encoder
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    embeds = tsp.tuner.prompts.token_embeds.clone()
    present = aggregated.proto_counts > 0
    loss0 = prototype_infonce(
        aggregated.text_prototypes, aggregated.image_prototypes, aggregated.logit_scale, present
    )
    new, metrics = tsp.server_update(aggregated, [], server_ctx(tsp))
    assert isinstance(new, FedTSPState)

    # the loss between text and image prototypes went down (reported as server metrics).
    # Tolerance: the logits are exp(s)·cos; text features ENC_TOL apart per element move a
    # cosine by <= sqrt(d)·ENC_TOL and the cross-entropy by <= 2·exp(s)·sqrt(d)·ENC_TOL.
    def loss_tol(s: torch.Tensor) -> float:
        return 2 * math.exp(float(s)) * math.sqrt(384) * ENC_TOL

    assert metrics["prompt_loss_before"] == pytest.approx(float(loss0), abs=loss_tol(aggregated.logit_scale))
    after = prototype_infonce(new.text_prototypes, aggregated.image_prototypes, new.logit_scale, present)
    assert float(after) == pytest.approx(metrics["prompt_loss_after"], abs=loss_tol(new.logit_scale))
    assert float(after) < float(loss0)
    moved = 1 - F.cosine_similarity(new.text_prototypes.double(), aggregated.text_prototypes.double(), dim=-1)
    assert (  # the same float64 arithmetic on the same float32 tensors: equal up to float64 rounding
        metrics["prototype_shift_mean"] == pytest.approx(float(moved.mean()), rel=1e-9)
        and float(moved.max()) > 0
    )
    # the language model is bit-identical and got no gradient; so are the prompts' token embeddings
    for k, v in enc.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None and not p.requires_grad for p in enc.parameters())
    assert torch.equal(tsp.tuner.prompts.token_embeds, embeds)
    # only the soft prompts, the logit scale (and their momentum) changed; new text prototypes
    assert not torch.equal(new.prompt_ctx, aggregated.prompt_ctx)
    assert not torch.equal(new.logit_scale, aggregated.logit_scale)
    assert set(new.prompt_opt_state) == {0, 1}
    torch.testing.assert_close(  # two forwards of the frozen encoder (with / without autograd)
        new.text_prototypes, tsp.tuner.text_prototypes(new.prompt_ctx), atol=ENC_TOL, rtol=0
    )
    for f in ("image_prototypes", "proto_counts"):
        assert torch.equal(getattr(new, f), getattr(aggregated, f))
    assert new.global_params is None


def test_logit_scale_starts_below_its_clamp_and_moves_both_ways(tsp, golden):
    """The authors' s₀ = ln 100 with a clamp above it (ln 1000): perfectly aligned
    prototypes make the server step sharpen the softmax (s rises above ln 100), the
    clients' misaligned ones flatten it (s falls, test above). A clamp at s₀ pins it."""
    c = FedTSPConfig()
    assert c.logit_scale_init == pytest.approx(LN_100) and c.logit_scale_max > c.logit_scale_init
    aggregated = golden[4]
    present = aggregated.proto_counts > 0
    text = aggregated.text_prototypes  # image prototypes on the text ones: the loss wants a larger s
    kw = dict(steps=3, lr=0.01, scale_lr=0.01)
    up = tsp.tuner.tune(aggregated.prompt_ctx, aggregated.logit_scale, text, present, **kw)
    assert float(up.logit_scale) > LN_100
    pinned = tsp.tuner.tune(aggregated.prompt_ctx, aggregated.logit_scale, text, present,
                            max_logit_scale=LN_100, **kw)  # fmt: skip
    assert float(pinned.logit_scale) == pytest.approx(LN_100, abs=1e-6)
    with pytest.raises(ConfigError, match="could only fall"):
        check("fedtsp", f"method.logit_scale_max={LN_100}", "data.client_test_fraction=0.25")  # no data


def test_table4_switches_handcrafted_prompts_and_no_tuning(fmnist, golden):
    ds, _ = fmnist
    task = TaskInfo(
        num_classes=10, class_names=tuple(ds.class_names), dataset="fmnist", has_client_test_split=True
    )
    plain = FedTSP(
        FedTSPConfig(descriptions=False, tune_prompts=False),
        num_clients=2,
        clients_per_round=2,
        seed=0,
        task=task,
    )
    assert plain.tuner.prompts.k == 1 and plain.tuner.prompts.prompts[0] == ["a photo of a t-shirt."]
    state = plain.init_state(None)
    torch.testing.assert_close(  # prompts spliced as embeddings vs tokenised text: 10 × ENC_TOL
        state.text_prototypes,
        plain.tuner.encoder.encode([f"a photo of a {c}." for c in ds.class_names]).cpu(),
        atol=10 * ENC_TOL,
        rtol=0,
    )
    aggregated = plain.aggregate(state, golden[3])
    assert plain.server_update(aggregated, golden[3], server_ctx(plain)) == (
        aggregated,
        {},
    )  # frozen prompts: nothing to do


ARGS = [
    "method=fedtsp",
    "data=fmnist",
    "model=htfe_cnn3",
    "data.client_test_fraction=0.25",
    "data.train_subset=1500",
    "data.test_subset=200",
    "fl.num_clients=4",
    "fl.batch_size=32",
    "fl.local_epochs=1",  # fedtsp's own defaults: 5 epochs, 20 prompt steps (the paper's)
    "method.server_epochs=1",
    "logger=none",
    "optim.lr=0.01",
    "method.prompt_momentum=0.9",
    "runtime.threads_per_client=1",
]


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _serial_run(out: Path) -> None:
    code = main(
        ["run", *ARGS, "runtime=serial", "fl.rounds=2", f"output_dir={out}", "run_id=serial", "--quiet"]
    )
    (out / "exit_code").write_text(str(code))


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory, data_root):
    out = once(tmp_path_factory, "fedtsp_runs", _serial_run)
    return int((out / "exit_code").read_text()), out / "default" / "serial"


def test_cli_run_writes_personalised_metrics(serial_run):
    code, run_dir = serial_run
    assert code == 0
    assert {"config.yaml", "metrics.jsonl", "summary.json", "partition.json", "checkpoints"} <= {
        p.name for p in run_dir.iterdir()
    }
    recs = _records(run_dir)
    assert [r["round"] for r in recs] == [1, 2]
    for r in recs:
        assert "accuracy" not in r  # no global model in heterogeneous mode
        for k in (
            "client_accuracy",
            "client_accuracy_mean",
            "client_accuracy_std",
            "client_accuracy_worst10",
        ):
            assert 0.0 <= r[k] <= 1.0
        assert r["bytes_up"] == 4 * (10 * 384 * 4 + 10 * 8)  # prototypes + counts, per client
        assert r["bytes_down"] == 4 * (10 * 384 * 4 + 4)  # text prototypes + logit scale
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["accuracy_metric"] == "client_accuracy" and summary["model"] == "htfe_cnn3"
    assert summary["final_accuracy"] == recs[-1]["client_accuracy"]
    assert summary["best_accuracy"] == max(r["client_accuracy"] for r in recs)


def test_soft_prompts_survive_checkpoint_and_resume(serial_run, tsp, tmp_path):
    code, run_dir = serial_run
    assert code == 0
    state2, meta, index2 = checkpoint.load(run_dir / "checkpoints" / "round-000002.json")
    assert isinstance(state2, FedTSPState) and state2.round == 2
    assert state2.prompt_ctx.shape == (10, 4, 384) and set(state2.prompt_opt_state) == {0, 1}
    assert not torch.equal(state2.prompt_ctx, tsp.tuner.initial_ctx())  # tuned twice
    # save / load round trip: every tensor comes back bit for bit
    checkpoint.save(tmp_path, state2, meta)
    again, _, _ = checkpoint.load(checkpoint.latest(tmp_path))
    for f in ("prompt_ctx", "logit_scale", "text_prototypes", "image_prototypes", "proto_counts"):
        assert torch.equal(getattr(again, f), getattr(state2, f)), f
    for i, st in state2.prompt_opt_state.items():
        assert torch.equal(again.prompt_opt_state[i]["momentum_buffer"], st["momentum_buffer"])
    assert sorted(index2) == [0, 1, 2, 3]  # each client's own model, kept in its own file
    for cid, rnd in index2.items():
        personal = checkpoint.load_client_state(run_dir, cid, rnd)["personal"]
        assert set(personal) == set(
            build_client_model("htfe_cnn3", cid, 10, 1, 28, feature_dim=384).state_dict()
        )
    # resume: round 3 continues from the checkpointed prompts, logit scale and momentum; in a
    # copy, as `once` asks (the shared run is read by the other tests of this file, on any
    # worker, before or after this one: resumed in place, a later one found three rounds)
    run_dir = Path(shutil.copytree(run_dir, tmp_path / "copy" / run_dir.name))
    (run_dir / ".lock").unlink(missing_ok=True)
    assert main(["resume", str(run_dir), "fl.rounds=3", "--quiet"]) == 0
    assert [r["round"] for r in _records(run_dir)] == [1, 2, 3]
    state3, _, _ = checkpoint.load(run_dir / "checkpoints" / "round-000003.json")
    out = tsp.tuner.tune(
        state2.prompt_ctx,
        state2.logit_scale,
        state3.image_prototypes,
        state3.proto_counts > 0,
        steps=1,
        lr=0.01,
        momentum=0.9,
        scale_lr=0.01,
        opt_state=state2.prompt_opt_state,
    )
    # One SGD step recomputed here: x - lr·g agrees to the rounding of x (8 ulps of its largest
    # element) plus the float32 error of the step itself (a backward through 6 transformer
    # layers: well under 1e-3 of the step).
    for got, want, before in ((state3.prompt_ctx, out.ctx, state2.prompt_ctx),
                              (state3.logit_scale, out.logit_scale, state2.logit_scale)):  # fmt: skip
        step = float((want - before).abs().max())
        tol = 8 * EPS32 * float(want.abs().max()) + 1e-3 * step
        assert step > 0
        torch.testing.assert_close(got, want, atol=tol, rtol=0)


def test_ray_run_matches_serial(serial_run, tmp_path, ray_workers):
    code, serial_dir = serial_run
    assert code == 0
    summary, ray_dir = start_run(
        compose([*ARGS, "runtime=ray", "runtime.num_actors=2", "fl.rounds=1", f"output_dir={tmp_path}"]),
        console=False,
        session=ray_workers,
    )
    assert summary["executor"] == "ray" and summary["rounds_completed"] == 1 and summary["num_actors"] == 2
    keys = ("client_accuracy", "client_accuracy_mean", "train_loss", "bytes_up")
    assert [_records(ray_dir)[0][k] for k in keys] == [_records(serial_dir)[0][k] for k in keys]


BASELINES = {
    "local": 0,
    "fedproto": 3 * (10 * 512 * 4 + 80),
    "fedtgp": 3 * (10 * 512 * 4 + 80),
    "feddistill": 3 * (10 * 10 * 4 + 80),
    "lg_fedavg": 3 * (512 * 10 + 10) * 4,
}


@pytest.mark.parametrize("method", sorted(BASELINES))
def test_heterogeneous_baselines_run_one_round(method, tmp_path, data_root):
    extra = ["method.server_epochs=5"] if method == "fedtgp" else []
    cfg = compose(
        [
            f"method={method}",
            "data=fmnist",
            "model=htfe_cnn3",
            "data.client_test_fraction=0.25",
            "data.train_subset=600",
            "data.test_subset=100",
            "fl.num_clients=3",
            "fl.rounds=1",
            "logger=none",
            "runtime=serial",
            "optim.lr=0.01",
            f"output_dir={tmp_path}",
            *extra,
        ]
    )
    summary, run_dir = start_run(cfg, console=False)
    assert summary["rounds_completed"] == 1 and 0.0 <= summary["final_accuracy"] <= 1.0
    assert summary["accuracy_metric"] == "client_accuracy"
    assert _records(run_dir)[0]["bytes_up"] == BASELINES[method]
    state, _, index = checkpoint.load(checkpoint.latest(run_dir))
    assert sorted(index) == [0, 1, 2]  # three architectures, each client's own weights
    if method == "lg_fedavg":
        assert set(state.global_params) == {"head.weight", "head.bias"}
    else:
        assert state.global_params is None
    if method == "fedtgp":
        assert state.prototypes.shape == (10, 512) and 0 < _records(run_dir)[0]["server/margin"] <= 100


def test_weight_averaging_methods_refuse_a_model_family(tmp_path, capsys):
    assert (
        main(
            [
                "run",
                "method=fedavg",
                "model=htfe_cnn3",
                "runtime=serial",
                "logger=none",
                "data.train_subset=300",
                f"output_dir={tmp_path}",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "averages weights that differ across the architectures" in err and err.count("\n") == 1


def test_homogeneous_fedavg_then_classifier_finetuning(tmp_path, data_root):
    """share_weights: FedAvg of all weights as well; finetune_after: then only personal heads."""
    cfg = compose(
        [
            "method=fedtsp",
            "method.share_weights=true",
            "method.finetune_after=1",
            "method.server_epochs=1",
            "fl.local_epochs=1",
            "model=cnn_bn",
            "data.client_test_fraction=0.25",
            "data.train_subset=600",
            "data.test_subset=100",
            "fl.num_clients=3",
            "fl.rounds=2",
            "logger=none",
            "runtime=serial",
            "optim.lr=0.01",
            f"output_dir={tmp_path}",
        ]
    )
    summary, run_dir = start_run(cfg, console=False)
    r1, r2 = _records(run_dir)
    assert r1["bytes_up"] > 3 * 384 * 3136 * 4  # round 1: every weight (hidden = text dim) + prototypes
    assert r2["bytes_up"] == 0  # -FT round: the heads stay with their clients
    s1, _, i1 = checkpoint.load(run_dir / "checkpoints" / "round-000001.json")
    s2, _, i2 = checkpoint.load(run_dir / "checkpoints" / "round-000002.json")
    assert i1 == {} and sorted(i2) == [0, 1, 2]
    for cid, rnd in i2.items():
        personal = checkpoint.load_client_state(run_dir, cid, rnd)["personal"]
        assert set(personal) == {"head.weight", "head.bias"}
        assert not torch.equal(personal["head.weight"], s1.global_params["head.weight"])
    assert all(torch.equal(s2.global_params[k], v) for k, v in s1.global_params.items())  # nothing averaged
    assert torch.equal(s2.prompt_ctx, s1.prompt_ctx)  # no prompt tuning without new prototypes
    assert summary["accuracy_metric"] == "client_accuracy"
