"""CReFF and CLIP2FL (issue 11) against written-out PyTorch loops, on the toy model and
scikit-learn digits: three clients, two per round, two rounds (partial participation).

The reference computes, in float32 and float64 (`twin`), what the spec says with autograd and
nn.Linear/torch.optim where the engine writes gradients out: the clients' per-class classifier
gradients (eval mode, the received model and the server's classifier φ̂), local SGD, FedAvg,
the unweighted per-class mean of the gradients, the feature steps on CReFF's distance (per
class: Σ rows 1 − cos + bias 1 − cos, gradients of the features' CE taken with
create_graph=True), and a fresh nn.Linear re-trained by torch.optim.SGD. `match` bounds the
engine's error by the reference's own float32 error (see tests/test_methods.py).

Mutations tried (each failed a test here): the bias term dropped from the distance; a mean
instead of a sum over the rows; the features moved with + instead of − lr; the clients'
gradients taken in train mode; one client's gradient counted 1.5× in the per-class mean;
T² dropped from the KD term; the KL's arguments swapped; the contrastive positive taken from
another class.
"""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.cli.main import main
from fl_lightning.core.augment import Augment, augment_batch
from fl_lightning.core.messages import ClientUpdate
from fl_lightning.core.params import nbytes, to_cpu, weighted_mean
from fl_lightning.core.strategy import OptimConfig, TaskInfo, server_rng
from fl_lightning.methods.creff import CReFFUpdate, derived_generator
from fl_lightning.server_steps.federated_features import prototype_contrastive
from fl_lightning.testing import loop

from .conftest import small
from .run_files import assert_same_run
from .test_methods import LR, MOM, Toy, ctx, manual_fit, match, twin
from .test_pfl_personal_heads import clients3  # noqa: F401  (fixture)

C = 10
SMALL_CREFF = dict(num_features=4, match_steps=3, feature_lr=0.5, retrain_epochs=2, retrain_lr=0.05,
                   retrain_batch_size=8, grad_repeats=2, grad_batch=16, grad_augment="none")  # fmt: skip


def run(name, data, rounds=2, per_round=2, task_data=None, **kw):
    """`rounds` rounds of `name` through the run's own loop (`fl_lightning.testing.loop`), SGD
    with momentum, `per_round` of the three clients a round."""
    ds = data[0]
    task = TaskInfo(num_classes=C, class_names=tuple(ds.class_names), dataset="digits",
                    has_client_test_split=True, data=task_data or {})  # fmt: skip
    r = loop(name, data, method=kw, rounds=rounds, clients_per_round=per_round, task=task,
             optim=OptimConfig(lr=LR, momentum=MOM))  # fmt: skip
    return SimpleNamespace(strategy=r.strategy, plans=r.plans, updates=r.updates, state=r.state,
                           state0=r.initial, init=r.init, host=r.host, metrics=r.metrics,
                           obj=r.objective)  # fmt: skip


def shard(data, cid, dt=torch.float32):
    ds, train, _ = data
    x, y = ds.tensors(ds.train_x[train[cid]], ds.train_y[train[cid]])
    return x.to(dt), y


# --- the written-out reference ------------------------------------------------------------------
def ref_class_grads(model, x, y, w, b, seed, repeats, batch):
    """Per class present: mean over draws of autograd's ∇_(W,b) CE(F.linear(f(x), W, b), c)."""
    g = derived_generator(seed, 0xC4EF)  # the same draws (the seed is given, not the formula)
    model.eval()
    out = {}
    for c in sorted(set(y.tolist())):
        idx = torch.nonzero(y == c).squeeze(1)
        acc = None
        for _ in range(repeats):
            sel = idx[torch.randperm(len(idx), generator=g)[:batch]]
            W, B = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
            with torch.no_grad():
                z = model.forward_features(x[sel])
            loss = F.cross_entropy(F.linear(z, W, B), torch.full((len(sel),), c))
            gw, gb = torch.autograd.grad(loss, (W, B))
            acc = (gw, gb) if acc is None else (acc[0] + gw, acc[1] + gb)
        out[c] = (acc[0] / repeats, acc[1] / repeats)
    model.train()
    return out


def ref_distance(gw, gb, rw, rb):
    cos = (gw * rw).sum(-1) / (gw.norm(dim=-1) * rw.norm(dim=-1) + 1e-6)
    return (1 - cos).sum() + 1 - (gb * rb).sum() / (gb.norm() * rb.norm() + 1e-6)


def ref_server(v, w, b, agg, cfg, rnd, dt, text=None):
    """Feature steps (autograd, create_graph) then a fresh nn.Linear re-trained by optim.SGD."""
    m = cfg["num_features"]
    for _ in range(cfg["match_steps"]):
        v = v.detach().requires_grad_(True)
        loss = 0
        for c, (rw, rb) in agg.items():
            W, B = w.clone().requires_grad_(True), b.clone().requires_grad_(True)
            lc = F.cross_entropy(F.linear(v[c * m : (c + 1) * m], W, B), torch.full((m,), c))
            gw, gb = torch.autograd.grad(lc, (W, B), create_graph=True)
            loss = loss + ref_distance(gw, gb, rw, rb)
        if text is not None:
            loss = loss + cfg["pcl_weight"] * ref_supcon_text(v, text, cfg["pcl_temperature"])
        (grad,) = torch.autograd.grad(loss, v)
        v = v.detach() - cfg["feature_lr"] * grad
    g = derived_generator(int(server_rng(0, rnd).integers(2**62)), 0xC7F)
    d = v.shape[1]
    lin = nn.Linear(d, C).to(dt)
    with torch.no_grad():
        lin.weight.copy_((torch.rand(C, d, generator=g) * 2 - 1) / d**0.5)
        lin.bias.copy_((torch.rand(C, generator=g) * 2 - 1) / d**0.5)
    opt = torch.optim.SGD(lin.parameters(), lr=cfg["retrain_lr"])
    labels = torch.arange(C).repeat_interleave(m)
    for _ in range(cfg["retrain_epochs"]):
        perm = torch.randperm(len(v), generator=g)
        for i in range(0, len(v), cfg["retrain_batch_size"]):
            sel = perm[i : i + cfg["retrain_batch_size"]]
            opt.zero_grad()
            F.cross_entropy(lin(v[sel]), labels[sel]).backward()
            opt.step()
    return v.detach(), lin.weight.detach(), lin.bias.detach()


def ref_supcon_text(v, text, tau):
    """SupConLoss_text written out: anchors v_i, contrast 'features' text[y_j] for every j,
    self excluded, positives the same label; mean over anchors of −mean log-prob of positives."""
    n, m = len(v), len(v) // C
    labels = torch.arange(C).repeat_interleave(m)
    t = F.normalize(text.to(v), dim=-1)[labels]  # [N, d]
    logits = v @ t.T / tau
    not_self = 1 - torch.eye(n, dtype=v.dtype)
    pos = (labels[:, None] == labels[None, :]).to(v) * not_self
    log_prob = logits - torch.log((torch.exp(logits) * not_self).sum(1, keepdim=True))
    return (-(pos * log_prob).sum(1) / pos.sum(1)).mean()


def reference(data, r, cfg, loss_fn=None, text=None):
    """The whole run, written out, in float32 and float64."""

    def go(dt):
        glob = {k: v.to(dt) if v.is_floating_point() else v for k, v in r.init.items()}
        w, b, v = (
            t.to(dt) for t in (r.state0.classifier_weight, r.state0.classifier_bias, r.state0.features)
        )
        per_round = []
        for rnd, plan in enumerate(r.plans, start=1):
            outs, grads = [], {}
            for p in plan.payloads:
                model = Toy().to(dt)
                model.load_state_dict(glob)
                x, y = shard(data, p.client_id, dt)
                gr = ref_class_grads(model, x, y, w, b, p.seed, cfg["grad_repeats"], cfg["grad_batch"])
                for c, g in gr.items():
                    grads.setdefault(c, []).append(g)
                manual_fit(model, x, y, p.seed, loss_fn or (lambda m, xb, yb: F.cross_entropy(m(xb), yb)))
                outs.append((to_cpu(model.state_dict()), len(y), gr))
            glob = weighted_mean([o[0] for o in outs], [o[1] for o in outs])
            agg = {
                c: (sum(g[0] for g in gs) / len(gs), sum(g[1] for g in gs) / len(gs))
                for c, gs in grads.items()
            }
            v, w, b = ref_server(v, w, b, agg, cfg, rnd, dt, text)
            per_round.append(outs)
        return {**glob, "clf.weight": w, "clf.bias": b, "features": v}, per_round

    (s32, r32), (s64, r64) = twin(go)
    return (s32, s64), (r32, r64)


def engine_state(r):
    s = r.state
    return {**s.global_params, "clf.weight": s.classifier_weight, "clf.bias": s.classifier_bias,
            "features": s.features}  # fmt: skip


# --- tests ----------------------------------------------------------------------------------------
def test_creff_matches_the_written_out_loop(clients3):  # noqa: F811
    r = run("creff", clients3, **SMALL_CREFF)
    assert [p.client_ids for p in r.plans] != [[0, 1, 2]] * 2  # partial participation
    final, rounds = reference(clients3, r, SMALL_CREFF)
    match(engine_state(r), final)
    # the uploads of the last round: per-class gradients of the classes present, in class order
    (r32, r64) = rounds
    for i, u in enumerate(r.updates[-1]):
        present = sorted(r64[-1][i][2])
        assert torch.equal(torch.nonzero(u.class_counts).squeeze(1), torch.tensor(present))
        for j, c in enumerate(present):
            got = {"w": u.grad_weight[j], "b": u.grad_bias[j]}
            match(got, ({"w": r32[-1][i][2][c][0], "b": r32[-1][i][2][c][1]},
                        {"w": r64[-1][i][2][c][0], "b": r64[-1][i][2][c][1]}))  # fmt: skip


def test_creff_predicts_with_the_retrained_classifier_and_logs_the_fedavg_head(clients3):  # noqa: F811
    r = run("creff", clients3, rounds=1, **SMALL_CREFF)
    obj = r.obj
    obj.begin_round(r.strategy.eval_broadcast(r.state), None)
    obj.eval()
    x, _ = shard(clients3, 0)
    heads = obj.eval_heads()
    assert set(heads) == {"", "fedavg_head"}
    with torch.no_grad():
        z = obj.model.forward_features(x)
        assert torch.equal(heads[""](x), F.linear(z, r.state.classifier_weight, r.state.classifier_bias))
        assert torch.equal(heads["fedavg_head"](x), obj.model(x))


def test_a_client_uploads_weights_counts_and_class_gradients_only(clients3):  # noqa: F811
    r = run("creff", clients3, rounds=1, **SMALL_CREFF)
    base = {f.name for f in dataclasses.fields(ClientUpdate)}
    for u in r.updates[0]:
        assert isinstance(u, CReFFUpdate)
        assert {f.name for f in dataclasses.fields(u)} - base == {"class_counts", "grad_weight", "grad_bias"}
        k = int((u.class_counts > 0).sum())
        d = u.params["head.weight"].shape[1]
        assert u.class_counts.shape == (C,) and u.class_counts.sum() == u.num_examples
        assert u.grad_weight.shape == (k, C, d) and u.grad_bias.shape == (k, C)
        assert u.upload_nbytes() == nbytes(list(u.params.values())) + C * 8 + k * C * (d + 1) * 4


def test_the_server_step_lowers_the_matching_loss(clients3):  # noqa: F811
    r = run("creff", clients3, rounds=2, **{**SMALL_CREFF, "match_steps": 30})
    for m in r.metrics:
        assert m["classes_matched"] == 10 or m["classes_matched"] > 0
        assert m["match_loss_after"] < 0.9 * m["match_loss_before"]


def test_clip2fl_without_kd_and_contrast_is_creff_bit_for_bit(clients3):  # noqa: F811
    a = run("creff", clients3, **SMALL_CREFF)
    b = run("clip2fl", clients3, beta=0.0, pcl_weight=0.0, **SMALL_CREFF)
    for k, v in engine_state(a).items():
        assert torch.equal(v, engine_state(b)[k]), k
    for ua, ub in zip(a.updates[-1], b.updates[-1], strict=True):
        assert torch.equal(ua.grad_weight, ub.grad_weight) and ua.metrics.keys() == ub.metrics.keys()


@pytest.fixture(scope="module")
def digits_teacher(tmp_path_factory):
    """A tiny aligned teacher on digits images 1000.. (held out: the clients' pool is 0..899)."""
    old = os.environ.get("FL_LIGHTNING_TEACHER_CACHE")
    os.environ["FL_LIGHTNING_TEACHER_CACHE"] = str(tmp_path_factory.mktemp("teachers"))
    yield (
        {"name": "digits", "root": "", "download": False, "train_subset": 1000},
        dict(teacher_holdout_from=1000, teacher_epochs=2, teacher_model_kwargs={"scaling": 1}),
    )
    if old is None:
        os.environ.pop("FL_LIGHTNING_TEACHER_CACHE", None)
    else:
        os.environ["FL_LIGHTNING_TEACHER_CACHE"] = old


def test_clip2fl_kd_term_is_beta_t2_kl_of_teacher_and_student(clients3, digits_teacher):  # noqa: F811
    """CE + β·T²·KL(softmax(q/T) ‖ softmax(p/T)), q = 100·cos(teacher image, class text)."""
    data, teacher_kw = digits_teacher
    r = run(
        "clip2fl", clients3, rounds=1, task_data=data, beta=2.0, pcl_weight=0.0, **teacher_kw, **SMALL_CREFF
    )
    assert r.strategy.teacher_info["held_out_accuracy"] > 0.3  # 2 epochs on 437 images: well above 0.1
    teacher, text = r.obj.teacher, F.normalize(r.strategy.text, dim=-1)

    def kd_loss(m, x, y):
        p = m(x)
        with torch.no_grad():
            q = 100.0 * teacher(x.float()).to(x.dtype) @ text.to(x.dtype).T
        pt, qt = F.softmax(p / 3, -1), F.softmax(q / 3, -1)
        kl = (qt * (torch.log(qt) - torch.log(pt))).sum(1).mean()
        return F.cross_entropy(p, y) + 2.0 * 9.0 * kl

    final, _ = reference(clients3, r, SMALL_CREFF, loss_fn=kd_loss)
    match(engine_state(r), final)
    assert r.updates[0][0].metrics["loss/kd"] > 0
    # data.augment: batches come as (augmented, y, clean); the student learns from the augmented
    # images, the teacher sees the clean ones (the authors' code)
    x, y = (t[:16] for t in shard(clients3, 0))
    seen = augment_batch(x, Augment(("hflip", "rotate"), degrees=30.0), 0)
    assert r.obj.clean_view
    with torch.no_grad():
        kd = r.obj.loss_terms((seen, y, x))["kd"]
        q, p = 100.0 * teacher(x) @ text.T, r.obj.model(seen)
        kl = F.kl_div(F.log_softmax(p / 3, -1), F.softmax(q / 3, -1), reduction="batchmean")
        teacher_on_seen = kd_loss(r.obj.model, seen, y) - F.cross_entropy(r.obj.model(seen), y)
    assert torch.allclose(kd, 18.0 * kl) and not torch.allclose(kd, teacher_on_seen)


def test_prototype_contrastive_is_the_codes_supcon_text_loss():
    g = torch.Generator().manual_seed(0)
    v, text = (
        torch.randn(C * 3, 16, generator=g, dtype=torch.float64),
        torch.randn(C, 16, generator=g, dtype=torch.float64),
    )
    labels = torch.arange(C).repeat_interleave(3)
    got = prototype_contrastive(v, labels, text, 0.1)
    torch.testing.assert_close(got, ref_supcon_text(v, text, 0.1), atol=1e-12, rtol=1e-12)


def test_clip2fl_contrastive_server_step_matches_the_loop(clients3):  # noqa: F811
    """η·L_pcl in the feature objective (a toy 'text' of the feature dimension: the server
    term only needs prototypes of the features' size)."""
    cfg = {**SMALL_CREFF, "pcl_weight": 0.01, "pcl_temperature": 0.1}
    r = run("clip2fl", clients3, rounds=1, beta=0.0, pcl_weight=0.0, **SMALL_CREFF)
    text = torch.randn(C, 8, generator=torch.Generator().manual_seed(1))
    r.strategy.text = text  # the toy's 8-d features need 8-d prototypes (MiniLM's are 384-d)
    r.strategy.config = dataclasses.replace(r.strategy.config, pcl_weight=0.01)
    r = rerun_server(r, text)
    final, _ = reference(clients3, r, cfg, text=text)
    match(engine_state(r), final)
    assert "contrastive_loss_after" in r.metrics[-1]


def rerun_server(r, text):
    """Replay the run's round 1 with the strategy's prototypes replaced (same clients)."""
    s = r.strategy
    ups = r.updates[0]
    state, m = s.server_update(s.aggregate(r.state0, ups), ups, ctx(s, 1))
    r.state, r.metrics = dataclasses.replace(state, round=1), [m]
    return r


def _lines(run_dir):
    drop = ("time", "wall", "driver", "fit_time")
    return [{k: v for k, v in json.loads(line).items() if not any(d in k for d in drop)}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]  # fmt: skip


def test_cli_clip2fl_longtail_writes_group_accuracy_and_resumes_exactly(tmp_path, data_root, monkeypatch):
    """`fl-lightning run method=clip2fl data=fmnist data.partition=longtail` with the aligned
    teacher, two rounds: overall, many/medium/few and FedAvg-head accuracy every round; a run
    stopped after round 1 and resumed ends identical (features, classifier: server state), with
    the student's images augmented and the teacher's clean."""
    monkeypatch.setenv("FL_LIGHTNING_TEACHER_CACHE", str(tmp_path / "teachers"))
    args = small(tmp_path, "method=clip2fl", "data.partition=longtail", "data.imbalance_factor=100",
                 "model=cnn", "runtime=serial", "eval.longtail=[60,8]", "fl.local_epochs=1",
                 "method.teacher_holdout_from=2000", "method.teacher_holdout_size=400",
                 "method.teacher_epochs=1",
                 "method.teacher_model_kwargs.scaling=1", "method.num_features=5", "method.match_steps=3",
                 "method.retrain_epochs=2", "method.grad_repeats=1", "eval.clients=false",
                 "data.augment=[random_crop,hflip]",
                 # in line: beside an augmented CLIP2FL fit, the overlapped evaluation of round 1
                 # gave fedavg_head/loss 2.3295054 vs 2.3295051 in line (FedAvg's did not; open)
                 "eval.overlap=false")  # fmt: skip
    assert main(["run", *args, "experiment=full", "run_id=a", "--quiet"]) == 0
    full = tmp_path / "full" / "a"
    lines = _lines(full)
    assert len(lines) == 2
    for line in lines:
        for key in ("accuracy", "many_accuracy", "medium_accuracy", "few_accuracy", "fedavg_head/accuracy",
                    "server/match_loss_after", "server/contrastive_loss_after",
                    "client/loss/kd"):  # fmt: skip
            assert key in line, key
    assert main(["run", *args, "fl.rounds=1", "experiment=cut", "run_id=b", "--quiet"]) == 0
    assert main(["resume", str(tmp_path / "cut" / "b"), "fl.rounds=2", "--quiet"]) == 0
    assert _lines(tmp_path / "cut" / "b") == lines
    assert_same_run(tmp_path / "cut" / "b", full, stateful=False)  # the features and classifier too


def test_teacher_clip_without_weights_is_one_line_before_any_work(tmp_path, capsys):
    assert (
        main(["run", "method=clip2fl", "method.teacher=clip", "runtime=serial", f"output_dir={tmp_path}"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "text.pretrained" in err
    assert (
        main(["run", "method=clip2fl", "runtime=serial", "data.train_subset=60000", f"output_dir={tmp_path}"])
        == 2
    )
    assert "data.train_subset=55000" in capsys.readouterr().err


def test_resnet8_shapes_and_feature_dim():
    from fl_lightning.models import MODELS, feature_dim_key

    m = MODELS.get("resnet8")(num_classes=10, in_channels=3, image_size=32, feature_dim=384)
    assert feature_dim_key("resnet8") == "feature_dim"
    z = m.forward_features(torch.randn(2, 3, 32, 32))
    assert z.shape == (2, 384) and m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    convs = [p for n, p in m.named_parameters() if p.dim() == 4]
    assert [c.shape[0] for c in convs] == [64, 64, 64, 128, 128, 128, 256, 256, 256]
    assert np.isclose(sum(p.numel() for p in m.trunk.parameters()), 1_227_840, rtol=0.05)


def test_cnn_linear_neck_is_the_relu_necks_preactivation():
    """model.neck=linear (CLIP2FL's add_mlp): the same layers and weights, no ReLU after the
    hidden layer, so features take both signs; anything else is refused."""
    from fl_lightning.core.errors import ConfigError
    from fl_lightning.models import MODELS

    torch.manual_seed(0)
    relu = MODELS.get("cnn")(num_classes=10, hidden=32)
    linear = MODELS.get("cnn")(num_classes=10, hidden=32, neck="linear")
    linear.load_state_dict(relu.state_dict())  # same parameters: checkpoints carry over
    x = torch.randn(5, 1, 28, 28)
    z = linear.forward_features(x)
    assert (z < 0).any()
    assert torch.equal(relu.forward_features(x), z.clamp(min=0))
    with pytest.raises(ConfigError, match="model.neck"):
        MODELS.get("cnn")(num_classes=10, neck="tanh")


def test_teacher_on_a_class_subset_learns_only_those_and_reports_its_zero_shot(tmp_path):
    """method.teacher_classes: the aligned teacher trains on the held-out images of those classes
    only, keeps the cache key of a teacher without the switch when null, and reports its
    zero-shot accuracy on the other classes (among all classes, and among the unseen ones),
    recomputed here from its weights."""
    from dataclasses import asdict

    from fl_lightning.data.registry import load_from_config
    from fl_lightning.methods.teacher import AlignedTeacherConfig, teacher_key, train_aligned_teacher
    from fl_lightning.models import build_model

    data = {"name": "digits", "root": "", "download": False, "train_subset": 1000}
    seen = (0, 1, 2, 3, 4, 5, 6)
    cfg = AlignedTeacherConfig(holdout_from=1000, arch="cnn", model_kwargs={"channels": [4, 8]}, epochs=1,
                               classes=seen)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    text = F.normalize(torch.randn(10, 16, generator=g), dim=-1)
    state, info = train_aligned_teacher(data, text, cfg)
    ds = load_from_config({**data, "train_subset": None})
    assert info["train_images"] == int(np.isin(ds.train_y[1000:], seen).sum()) < len(ds.train_y) - 1000
    tower = build_model("cnn", 10, ds.in_channels, ds.image_size, **info["model_kwargs"])
    tower.load_state_dict(state)
    tower.eval()
    tx, ty = ds.tensors(ds.test_x, ds.test_y)
    with torch.no_grad():
        sims = F.normalize(tower.forward_features(tx), dim=-1) @ text.T
    tail = ty >= 7
    assert info["unseen_accuracy"] == pytest.approx(float((sims[tail].argmax(1) == ty[tail]).float().mean()))
    within = (sims[tail][:, 7:].argmax(1) + 7 == ty[tail]).float().mean()
    assert info["unseen_within_accuracy"] == pytest.approx(float(within))
    # null: the key every teacher had before the switch (no "classes" entry)
    full = AlignedTeacherConfig(holdout_from=1000)
    old = asdict(full)
    del old["targets"], old["classes"]
    blob = json.dumps(
        {"v": 1, "data": {"name": "digits"}, "text": "t", "classes": ["a"], "teacher": old},
        sort_keys=True, default=str,
    )  # fmt: skip
    import hashlib

    assert teacher_key({"name": "digits"}, "t", ["a"], full) == hashlib.sha256(blob.encode()).hexdigest()[:24]

    def key(c):
        return teacher_key({"name": "digits"}, "t", ["a"], c)

    without = dataclasses.replace(cfg, classes=None)
    assert key(cfg) != key(without)


def test_data_keys_added_later_keep_cached_teachers_unless_set():
    """A data key added after teachers were cached (the few-shot protocols) leaves the cache key
    of every run that does not set it unchanged, and changes it when set."""
    from fl_lightning.config import compose
    from fl_lightning.methods.teacher import AlignedTeacherConfig, teacher_key

    data = dataclasses.asdict(compose(["method=clip2fl", "data=fmnist"]).data)
    before = {k: v for k, v in data.items() if k not in ("shots", "shots_seed", "personal_shots",
                                                         "personal_from_test", "base_new")}  # fmt: skip
    cfg = AlignedTeacherConfig()
    key = teacher_key(data, "minilm", ["a", "b"], cfg)
    assert key == teacher_key(before, "minilm", ["a", "b"], cfg)
    assert key != teacher_key({**data, "shots": 16}, "minilm", ["a", "b"], cfg)
