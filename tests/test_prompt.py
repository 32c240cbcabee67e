"""The CLIP prompt learner (`model=clip_prompt`) and the prompt methods (PromptFL, zero-shot) on
real parts: a tiny open_clip model built with random weights and saved to a file (the stand-in
for CLIP weights), its real tokenizer, scikit-learn's digits and Fashion-MNIST, the Lightning
Trainer, local Ray. Golden tests write each update out over two rounds with partial
participation; the cached image features give the numbers of the uncached path.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.optim import OptimConfig
from fl_lightning.core.strategy import TaskInfo
from fl_lightning.data.datasets import DIGIT_NAMES
from fl_lightning.methods import METHODS
from fl_lightning.methods.prompting import PromptObjective
from fl_lightning.models.clip_prompt import CLIPPrompt
from fl_lightning.runtime.host import ClientHost, ClientSpec
from fl_lightning.runtime.runner import start_run
from fl_lightning.testing import (
    BS,
    LR,
    client_data,
    manual_fit,
    match,
    rounds_1_and_2,
    three_clients,
    twin,
    written_mean,
)
from fl_lightning.text.encoders import OpenCLIPTextEncoder, _register_open_clip_configs

from .run_files import final_state

ARCH = "clip-tiny-random"
#: digits' normalisation (data/datasets.py), as the runs hand it to the model
DIGITS = {"data_mean": [0.3], "data_std": [0.4]}


@pytest.fixture(scope="module")
def clip_file(tmp_path_factory):
    """A tiny open_clip model with random weights, saved as a CLIP weights file is."""
    path = tmp_path_factory.mktemp("clip") / "tiny_clip.pt"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = open_clip.create_model(_register_open_clip_configs(ARCH))
    torch.save(model.state_dict(), path)
    return str(path)


def prompt_model(clip_file: str, **kw) -> CLIPPrompt:
    args = {"arch": ARCH, "pretrained": clip_file, "class_names": DIGIT_NAMES, "n_ctx": 4, **DIGITS, **kw}
    return CLIPPrompt(10, 1, 8, **args)


def test_the_model_holds_only_the_prompt_and_a_phrase_reproduces_the_handwritten_prompt(clip_file):
    encoder = OpenCLIPTextEncoder(arch=ARCH, pretrained=clip_file, device="cpu")
    for position, template in (("end", "a photo of a {}."), ("front", "{} a photo of a."),
                               ("middle", "a photo {} of a.")):  # fmt: skip
        m = prompt_model(clip_file, ctx_init="a photo of a", class_token_position=position)
        want = encoder.encode([template.format(c) for c in DIGIT_NAMES])
        torch.testing.assert_close(m.text_features(), want, atol=2e-6, rtol=0, msg=position)
    shared, csc = prompt_model(clip_file), prompt_model(clip_file, class_specific=True)
    # both towers are in the module tree, frozen by role: only the context is the federation's
    obj = PromptObjective(shared)
    roles = {k: obj.role(k) for k in shared.state_dict()}
    assert {k for k, r in roles.items() if r != "frozen"} == {"prompt.ctx"} and shared.prompt.ctx.shape == (
        4,
        64,
    )
    text_keys = {"prompt.encoder." + k for k in shared.prompt.encoder.state_dict()}
    assert (
        text_keys
        and {k for k, r in roles.items() if r == "frozen"}
        == {"visual." + k for k in shared.visual.state_dict()} | text_keys
    )
    assert set(obj.model_state()) == set(obj.shared_params()) == {"prompt.ctx"} and not obj.personal_params()
    trainable = [n for n, p in csc.named_parameters() if p.requires_grad]
    assert trainable == ["prompt.ctx"] and csc.prompt.ctx.shape == (10, 4, 64)
    shared.train()
    assert not any(m.training for m in (*shared.visual.modules(), *shared.prompt.encoder.modules()))
    assert torch.equal(shared.prompt.ctx, prompt_model(clip_file).prompt.ctx)  # seeded: same everywhere
    assert 0.01 < float(shared.prompt.ctx.detach().std()) < 0.03  # N(0, 0.02^2)
    # logits: scale · cos(image tower on CLIP's view of the image, prompted class text)
    x = torch.randn(5, 1, 8, 8)
    view = (x * 0.4 + 0.3).clamp(0, 1).expand(-1, 3, -1, -1)
    view = F.interpolate(view, size=(32, 32), mode="bicubic", align_corners=False)
    mean, std = (
        torch.tensor([0.48145466, 0.4578275, 0.40821073]),
        torch.tensor([0.26862954, 0.26130258, 0.27577711]),
    )
    img = F.normalize(shared.visual((view - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)), dim=-1)
    want = shared.logit_scale * img @ F.normalize(shared.text_features(), dim=-1).T
    torch.testing.assert_close(shared(x), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared(shared.encode_images(x)), want, atol=1e-5, rtol=1e-5)


def _two_rounds(name: str, clip_file: str, data, task_data: dict | None = None, aggregator=None, **model_kw):
    """Two rounds of `name` through its strategy and a real host: 3 clients, 2 a round
    (round 1: clients 0, 1; round 2: clients 0, 2), plain SGD at the kit's rate; `aggregator`:
    the run's aggregation chain (default: the plain one)."""
    ds, shards = data
    task = TaskInfo(
        num_classes=10, class_names=tuple(DIGIT_NAMES), image_mean=(0.3,), image_std=(0.4,),
        has_client_test_split=True, data=task_data or {},
    )  # fmt: skip
    cls = METHODS.get(name)
    strategy = cls(
        cls.config_cls(), num_clients=3, clients_per_round=2, seed=0, task=task, aggregator=aggregator
    )
    kwargs = strategy.model_kwargs(
        "clip_prompt", {"arch": ARCH, "pretrained": clip_file, "n_ctx": 4, **model_kw}
    )
    model = CLIPPrompt(10, 1, 8, **kwargs)  # the federation's weights: its frozen tower left out, by role
    init = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith(model.frozen_prefixes)}
    spec = ClientSpec(method=name, objective_kwargs=strategy.objective_kwargs(), model="clip_prompt",
                      model_kwargs=kwargs, optim=OptimConfig(lr=LR, momentum=0.0), num_classes=10,
                      in_channels=1, image_size=8, batch_size=BS, threads=1, init_params=init)  # fmt: skip
    host = ClientHost(spec, ds, shards)
    plans, states = rounds_1_and_2(strategy, host, init)
    return init, plans, states, host


def test_promptfl_golden_two_rounds_and_cached_features_equal_the_uncached_path(clip_file):
    data = three_clients()
    init, plans, states, host = _two_rounds("promptfl", clip_file, data)
    assert sorted(host.features) == [("train", 0), ("train", 1), ("train", 2)]  # each shard's, once
    _, _, uncached, _ = _two_rounds("promptfl", clip_file, data, cache_features=False)
    for a, b in zip(states, uncached, strict=True):  # same batches, same steps: rounding apart
        torch.testing.assert_close(a.global_params, b.global_params, atol=1e-6, rtol=1e-5)

    def reference(data, init, plans, classes: int = 10):
        def run(dt: torch.dtype) -> list[dict[str, torch.Tensor]]:
            """Each client's CoOp step written out on images (no cache) over the first
            `classes` classes' scores, then the plain mean."""
            model = prompt_model(clip_file, cache_features=False).to(dt)

            def loss(m, xb, yb):
                return F.cross_entropy(m(xb)[:, :classes], yb)

            def client(cid: int, seed: int, start: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
                model.load_state_dict(start, strict=False)  # its frozen tower: its own
                x, y = client_data(data, cid)
                manual_fit(model, x.to(dt), y, seed, loss, momentum=0.0)
                return {k: v.detach().clone() for k, v in model.state_dict().items() if k in start}

            out, start = [], {k: v.to(dt) for k, v in init.items()}
            for plan in plans:
                trained = [client(p.client_id, p.seed, start) for p in plan.payloads]
                start = written_mean(trained, [1] * len(trained))  # utils.average_weights: unweighted
                out.append(start)
            return out

        return run

    r32, r64 = twin(reference(data, init, plans))
    for rnd in range(2):
        match(states[rnd].global_params, (r32[rnd], r64[rnd]))
        assert not torch.equal(states[rnd].global_params["prompt.ctx"], init["prompt.ctx"])

    # data.base_new: the clients' softmax holds the base half only (CoOp's subsample_classes;
    # the new names stay unseen): the same steps on base-class images, scores of classes 0-4
    ds, shards = data
    kept = {c: s[ds.train_y[s] < 5] for c, s in shards.items()}
    # (a last batch of one example is dropped by the engine, not by the written-out loop)
    base = (ds, {c: k[:-1] if len(k) % BS == 1 else k for c, k in kept.items()})
    binit, bplans, bstates, _ = _two_rounds("promptfl", clip_file, base, {"base_new": True})
    b32, b64 = twin(reference(base, binit, bplans, classes=5))
    for rnd in range(2):
        match(bstates[rnd].global_params, (b32[rnd], b64[rnd]))
    # weighted=true: FedAvg's example-weighted mean of the same uploads (70 and 50 examples)
    ups = [host.fit(plans[0].broadcast, p) for p in plans[0].payloads]
    cls = METHODS.get("promptfl")
    weighted = cls(cls.config_cls(weighted=True), 3, 2, 0).aggregate(states[0], ups).global_params
    want = written_mean([u.params for u in ups], [70, 50])
    torch.testing.assert_close(weighted["prompt.ctx"], want["prompt.ctx"], atol=1e-7, rtol=0)


def test_zeroshot_trains_nothing_and_scores_the_handwritten_prompt(clip_file):
    data = three_clients()
    init, _, states, host = _two_rounds("zeroshot", clip_file, data)
    assert not host.features  # no fit: no features computed either
    assert all(torch.equal(s.global_params["prompt.ctx"], init["prompt.ctx"]) for s in states)
    ds, _ = data
    x, y = ds.tensors(ds.test_x[:50], ds.test_y[:50])
    model = prompt_model(clip_file, ctx_init="a photo of a")
    model.load_state_dict(states[-1].global_params, strict=False)  # the tower: its own
    text = OpenCLIPTextEncoder(arch=ARCH, pretrained=clip_file, device="cpu").encode(
        [f"a photo of a {c}." for c in DIGIT_NAMES]
    )
    want = (model.encode_images(x) @ text.T).argmax(1)
    assert torch.equal(model(x).argmax(1), want)


def _cot_written_out(sim: torch.Tensor, top: float, eps: float, thresh: float, iters: int) -> torch.Tensor:
    """FedOTP's `entropic_COT_fast` as its authors wrote it (diagonal matrices, one batch of
    [B*C, M, N] problems), for the reference."""
    bc, m, n = sim.shape
    a, b = torch.full((bc, m), 1.0 / m, dtype=sim.dtype), torch.full((bc, n), top / n, dtype=sim.dtype)
    k = torch.exp(-(1.0 - sim) / eps)
    kp = torch.matmul(torch.diag_embed(1 / a, dim1=1), k)
    kq = torch.matmul(torch.diag_embed(1 / b, dim1=1), k.permute(0, 2, 1))
    u, v = torch.ones_like(a), torch.ones_like(b)
    for _ in range(iters):
        v0 = v
        u = torch.minimum(
            torch.ones_like(a) / torch.matmul(kp, v.unsqueeze(-1)).squeeze(-1), torch.ones_like(a)
        )
        v = torch.ones_like(b) / torch.matmul(kq, u.unsqueeze(-1)).squeeze(-1)
        if (v - v0).abs().mean().item() < thresh:
            break
    return torch.matmul(torch.matmul(torch.diag_embed(u, dim1=1), k), torch.diag_embed(v, dim1=1))


def test_fedotp_golden_two_rounds_global_averaged_local_kept(clip_file):
    data = three_clients()
    init, plans, states, host = _two_rounds("fedotp", clip_file, data)
    sizes = {0: 70, 1: 50, 2: 40}
    assert set(init) == {"prompt.ctx", "local_prompt.ctx"}
    assert all(set(s.global_params) == set(init) for s in states)  # the local context stays put

    def reference(dt: torch.dtype) -> tuple[list[dict], dict[int, torch.Tensor]]:
        model = prompt_model(clip_file, cache_features=False, local_prompt=True, image_tokens=True).to(dt)
        vis = model.visual

        def logits(m, xb, yb):
            vis.output_tokens = True  # open_clip's own token path, not the model's
            try:
                view = (xb * 0.4 + 0.3).clamp(0, 1).expand(-1, 3, -1, -1)
                view = F.interpolate(view, size=(32, 32), mode="bicubic", align_corners=False)
                mean = torch.tensor([0.48145466, 0.4578275, 0.40821073], dtype=dt).view(1, 3, 1, 1)
                std = torch.tensor([0.26862954, 0.26130258, 0.27577711], dtype=dt).view(1, 3, 1, 1)
                with torch.no_grad():
                    _, tokens = vis((view - mean) / std)
                    img = F.normalize(tokens @ vis.proj, dim=-1)  # [B, M, d]
            finally:
                vis.output_tokens = False
            text = F.normalize(torch.stack([m.prompt()[:, 0], m.local_prompt()[:, 0]]), dim=-1)  # [N, C, d]
            sim = torch.einsum("mbd,ncd->mnbc", img.permute(1, 0, 2), text)  # the authors' layout
            b, c = img.shape[0], text.shape[1]
            sim = sim.reshape(img.shape[1], 2, b * c).permute(2, 0, 1)
            plan = _cot_written_out(sim.detach(), 0.8, 0.1, 1e-3, 100)
            return F.cross_entropy(model.logit_scale * (plan * sim).sum(dim=(1, 2)).view(b, c), yb)

        locals_, out = {}, []
        glob = init["prompt.ctx"].to(dt)
        for plan in plans:
            trained = []
            for p in plan.payloads:
                start = {
                    "prompt.ctx": glob,
                    "local_prompt.ctx": locals_.get(p.client_id, init["local_prompt.ctx"].to(dt)),
                }
                model.load_state_dict(start, strict=False)  # its frozen tower: its own
                x, y = client_data(data, p.client_id)
                manual_fit(model, x.to(dt), y, p.seed, logits, momentum=0.0)
                trained.append({"prompt.ctx": model.prompt.ctx.detach().clone()})
                locals_[p.client_id] = model.local_prompt.ctx.detach().clone()
            glob = written_mean(trained, [sizes[p.client_id] for p in plan.payloads])["prompt.ctx"]
            out.append({"prompt.ctx": glob})
        return out, locals_

    (r32, l32), (r64, l64) = twin(reference)
    for rnd in range(2):
        got = {"prompt.ctx": states[rnd].global_params["prompt.ctx"]}
        match(got, (r32[rnd], r64[rnd]))
    for cid in (0, 1, 2):  # each client's own local context, as its last round left it
        got = {"local_prompt.ctx": host.states[cid]["personal"]["local_prompt.ctx"]}
        match(got, ({"local_prompt.ctx": l32[cid]}, {"local_prompt.ctx": l64[cid]}))
        assert not torch.equal(got["local_prompt.ctx"], init["local_prompt.ctx"])


def test_fedpgp_golden_two_rounds_global_averaged_low_rank_kept(clip_file):
    """FedPGP's step written out: the text tower reads "X X X X {class}." with the context
    spliced in (σ + U V for the classifier, σ alone and the tokenised words for the
    contrastive term), cross-entropy plus mu times the two-way contrastive cross-entropy."""
    data = three_clients()
    init, plans, states, host = _two_rounds("fedpgp", clip_file, data)
    sizes, (mu, temp) = {0: 70, 1: 50, 2: 40}, (0.5, 0.5)  # the config's defaults
    assert set(init) == {"prompt.ctx", "lowrank_u", "lowrank_v"}
    assert init["lowrank_u"].shape == (4, 8) and init["lowrank_v"].shape == (8, 64)  # rank 8

    def reference(dt: torch.dtype) -> tuple[list[dict], dict[int, dict]]:
        model = prompt_model(clip_file, cache_features=False).to(dt)  # its image tower only
        enc = OpenCLIPTextEncoder(arch=ARCH, pretrained=clip_file, device="cpu").to(dt)
        ids, mask = enc.tokenize([f"X X X X {c}." for c in DIGIT_NAMES])
        with torch.no_grad():
            words = enc.embed_tokens(ids)
            h0 = enc.forward_embeddings(words, mask)

        def text(ctx: torch.Tensor) -> torch.Tensor:
            spliced = torch.cat([words[:, :1], ctx.expand(10, -1, -1), words[:, 5:]], 1)  # "X"s replaced
            return enc.forward_embeddings(spliced, mask)

        def fit(cid: int, seed: int, sigma, u, v):
            sigma, u, v = (t.clone().requires_grad_(True) for t in (sigma, u, v))
            x, y = client_data(data, cid)
            x = x.to(dt)
            torch.manual_seed(seed)
            loader = torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(x, y), batch_size=BS, shuffle=True,
                generator=torch.Generator().manual_seed(seed),
            )  # fmt: skip
            opt = torch.optim.SGD([sigma, u, v], lr=LR, momentum=0.0)
            for xb, yb in loader:
                opt.zero_grad()
                hp, hs = text(sigma + u @ v), text(sigma)
                img = model.encode_images(xb)
                ce = F.cross_entropy(model.logit_scale * img @ hp.T, yb)
                pair = torch.stack([(h0 * hs).sum(1), (hs * hp).sum(1)], 1) / temp
                con = F.cross_entropy(pair, torch.zeros(10, dtype=torch.long))
                (ce + mu * con).backward()
                opt.step()
            return sigma.detach(), u.detach(), v.detach()

        mine, out = {}, []
        glob = init["prompt.ctx"].to(dt)
        for plan in plans:
            trained = []
            for p in plan.payloads:
                u, v = mine.get(p.client_id, (init["lowrank_u"].to(dt), init["lowrank_v"].to(dt)))
                sigma, u, v = fit(p.client_id, p.seed, glob, u, v)
                trained.append({"prompt.ctx": sigma})
                mine[p.client_id] = (u, v)
            glob = written_mean(trained, [sizes[p.client_id] for p in plan.payloads])["prompt.ctx"]
            out.append({"prompt.ctx": glob})
        return out, {c: {"lowrank_u": u, "lowrank_v": v} for c, (u, v) in mine.items()}

    (r32, l32), (r64, l64) = twin(reference)
    for rnd in range(2):
        match({"prompt.ctx": states[rnd].global_params["prompt.ctx"]}, (r32[rnd], r64[rnd]))
    for cid in (0, 1, 2):  # each client's own U, V, as its last round left them
        got = {k: host.states[cid]["personal"][k] for k in ("lowrank_u", "lowrank_v")}
        match(got, (l32[cid], l64[cid]))
        assert not torch.equal(got["lowrank_v"], init["lowrank_v"])
    ups = [host.fit(plans[0].broadcast, p) for p in plans[0].payloads]  # (moves the hosts' U, V on)
    assert all(set(u.params) == {"prompt.ctx"} for u in ups)  # U, V never leave a client
    # evaluation: "" scores σ + U V, "global" σ alone (equal once U V is zero)
    obj = METHODS.get("fedpgp").objective_cls(prompt_model(clip_file, low_rank=8))
    z = obj.model.encode_images(client_data(data, 0)[0][:5])
    heads = obj.eval_heads()
    assert not torch.allclose(heads[""](z), heads["global"](z))
    with torch.no_grad():
        obj.model.lowrank_v.zero_()
    torch.testing.assert_close(heads[""](z), heads["global"](z))
    # data.base_new: both terms over the first k classes only (their SUBSAMPLE_CLASSES base)
    obj.trained_classes, obj.mu = tuple(range(5)), 0.0
    yb = torch.tensor([0, 4, 2, 1, 3])
    want = F.cross_entropy(obj.model.logit_scale * z @ obj.model.text_features()[:5].T, yb)
    torch.testing.assert_close(obj.loss_terms((z, yb))["ce"], want)


TINY = ["data=fmnist", "data.train_subset=120", "data.test_subset=60", "fl.num_clients=3",
        "fl.clients_per_round=2", "fl.local_epochs=1", "fl.batch_size=16", "logger=none",
        f"model.arch={ARCH}", "model.n_ctx=4", "runtime.threads_per_client=1"]  # fmt: skip


def _lines(run_dir) -> list[dict]:
    return [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_global_evaluation_keeps_the_test_images_features(clip_file, tmp_path, data_root):
    """The driver's evaluation of a prompt learner (frozen image tower) computes the test
    images' features once and evaluates the text side on them: the same numbers as on the
    images; with `model.cache_features=false` it keeps nothing."""
    from fl_lightning.core.objective import evaluate
    from fl_lightning.runtime.build import prepare
    from fl_lightning.runtime.steps import GlobalEval, WallClock

    args = [*TINY, "method=promptfl", f"model.pretrained={clip_file}", "runtime=serial"]
    for cache in (True, False):
        p = prepare(compose([*args, f"model.cache_features={cache}"]))
        ev = GlobalEval(p, tmp_path, WallClock())
        state = p.strategy.init_state(p.init_params)
        first = ev.now(state)
        assert (ev.test_features is not None) is cache
        if cache:
            assert ev.test_features.shape == (60, p.objective.model.feature_dim)
            kept = ev.test_features
            state.global_params["prompt.ctx"] += 0.5  # another round's context: the same features
            again = ev.now(state)
            assert ev.test_features is kept and again["loss"] != first["loss"]
        obj = p.objective
        images = evaluate(obj, *ev.test, spec=p.eval_spec, batch_size=ev.batch_size)
        assert images["accuracy"] == (again if cache else first)["accuracy"]
        assert images["loss"] == pytest.approx((again if cache else first)["loss"], rel=1e-5)


def test_evaluation_on_stored_images_is_the_float_copys_bit_for_bit(clip_file, tmp_path, data_root):
    """The global and the clients' evaluations keep the test images uint8 and normalise each
    batch as it is scored (`StoredImages`; a frozen tower's features a batch at a time): every
    metric equals, exactly, `evaluate` on the whole float copy (`ArrayDataset.tensors`, the tower
    given all of it at once) under the same weights. A CNN (images into every batch) and the
    prompt learner (its features kept); 300 test images: past the tower's 256-image batch."""
    from fl_lightning.core.metrics import EvalSpec
    from fl_lightning.core.objective import evaluate
    from fl_lightning.runtime.build import prepare
    from fl_lightning.runtime.host import frozen_tower, torch_threads
    from fl_lightning.runtime.steps import GlobalEval, WallClock

    def float_copy(obj, x, y, batch_size, spec):  # the path before: all of x as float, at once
        x, y = p.dataset.tensors(x, y)
        tower = frozen_tower(obj.model)
        with torch_threads(1):  # as both evaluations run (EVAL_THREADS, threads_per_client=1)
            return evaluate(obj, tower.encode_images(x) if tower else x, y, spec, batch_size)

    base = [*(a for a in TINY if not a.startswith("model.")), "data.test_subset=300",
            "data.client_test_fraction=0.25", "eval.batch_size=64", "runtime=serial"]  # fmt: skip
    prompt = ["method=promptfl", f"model.arch={ARCH}", "model.n_ctx=4", f"model.pretrained={clip_file}"]
    for args in (["method=fedavg", "model=cnn"], prompt):
        p = prepare(compose([*base, *args]))
        ev = GlobalEval(p, tmp_path, WallClock())
        state = p.strategy.init_state(p.init_params)
        state.global_params = {k: v + 0.01 for k, v in state.global_params.items()}  # not the init's
        got = ev.now(state)
        assert (ev.test_features is not None) is (args[0] == "method=promptfl")
        assert got == float_copy(p.objective, p.dataset.test_x, p.dataset.test_y, 64, p.eval_spec)
        spec1 = dataclasses.replace(p.spec, threads=1)  # as a placement gives it (threads_per_client=1)
        host = ClientHost(spec1, p.dataset, dict(enumerate(p.split.train)), dict(enumerate(p.split.test)))
        plan = p.strategy.configure_evaluate(state, range(3))
        for payload, rows in zip(plan.payloads, p.split.test, strict=True):
            mine = host.evaluate(plan.broadcast, payload)  # leaves the client's weights in its objective
            obj = host.objective(payload.client_id)
            spec = obj.eval_spec or EvalSpec(num_classes=p.spec.num_classes)
            x, y = p.dataset.train_x[rows], p.dataset.train_y[rows]
            want = float_copy(obj, x, y, p.spec.eval_batch_size, spec)
            assert mine.num_examples == len(rows) > 0 and mine.metrics == want


def _keys(tree) -> list[str]:
    """Every string key of a checkpoint tree (`run_files`), at any depth."""
    if isinstance(tree, dict):
        return [k for k in tree if isinstance(k, str)] + [k for v in tree.values() for k in _keys(v)]
    if isinstance(tree, list):
        return [k for v in tree for k in _keys(v)]
    return []


def _resumes_exactly_and_ray_matches_serial(method: str, args: list[str], warm, first: bool) -> None:
    """Round 1 on Ray's (warm) workers, resumed in this process to round 2 serially, and 2 rounds
    serial: one run both stopped and resumed and on Ray (a serial 1-round run cost as much)."""
    personal = method != "promptfl"
    ray_args = [*args, "runtime=ray", "runtime.num_actors=2", "fl.rounds=1", "run_id=ray"]
    ray, ray_dir = start_run(compose(ray_args), console=False, session=warm)
    assert ray["executor"] == "ray" and ray["num_actors"] == 2 and (first or ray["actors_reused"] == 2)
    args = [*args, "runtime=serial"]
    full, full_dir = start_run(compose([*args, "fl.rounds=2", "run_id=full"]), console=False)
    assert full["rounds_completed"] == 2
    assert full["accuracy_metric"] == ("client_accuracy" if personal else "accuracy")
    lines = _lines(full_dir)
    # 2 clients x the 4 x 64 (global) context, float32: FedOTP's and FedPGP's own parts stay
    assert all(r["bytes_up"] == 2 * 4 * 64 * 4 for r in lines)
    # the checkpoint holds no tower weight, by role: the global model and each client's state
    server, clients = final_state(full_dir)
    assert "prompt.ctx" in server["fields"]["global_params"]
    towers = ("visual.", "prompt.encoder.", "local_prompt.encoder.")
    assert not [k for k in server["fields"]["global_params"] if k.startswith(towers)]
    assert not [k for c in clients.values() for k in _keys(c) if k.startswith(towers)]
    keys = ("round", "train_loss", "bytes_up", *(["client_accuracy"] if personal else ["accuracy", "loss"]))
    if method == "fedpgp":
        keys = (*keys, "client/loss/con", "client_global/accuracy")
    assert [[r[k] for k in keys] for r in _lines(ray_dir)] == [[r[k] for k in keys] for r in lines[:1]]
    # round 2 from the Ray run's checkpoint (each client's own parts collected from its worker)
    assert main(["resume", str(ray_dir), "fl.rounds=2", "runtime.executor=serial", "--quiet"]) == 0
    assert [[r[k] for k in keys] for r in _lines(ray_dir)] == [[r[k] for k in keys] for r in lines]


@pytest.mark.slow
def test_prompt_methods_resume_exactly_and_ray_matches_serial(clip_file, tmp_path, data_root, ray_workers):
    """PromptFL, FedOTP and FedPGP: a run stopped after round 1 and resumed gives round 2 bit
    for bit as the uninterrupted run (FedOTP's local context, FedPGP's U and V: kept by each
    client, checkpointed, resumed); on Ray's workers, round 1 as in one process. The three Ray
    runs go one after another on the same two warm workers (a sequential sweep's reuse: their
    start and imports paid once, `ray_workers`), each still the serial run's numbers."""
    for i, method in enumerate(("promptfl", "fedotp", "fedpgp")):
        out = tmp_path / method
        args = [*TINY, f"method={method}", f"model.pretrained={clip_file}", f"output_dir={out}"]
        args += ["data.client_test_fraction=0.25"] if method != "promptfl" else []
        _resumes_exactly_and_ray_matches_serial(method, args, ray_workers, first=i == 0)


def test_the_prompt_model_and_methods_refuse_each_other_in_one_line(capsys):
    for args, says in (
        (["method=fedavg", "model=clip_prompt"], "model=clip_prompt is trained by method="),
        (["method=promptfl", "model=cnn"], "method=promptfl trains CLIP prompts: use model=clip_prompt"),
        (["method=promptfl", "model.align_holdout_from=55000"], "set data.train_subset<=55000"),
        (["method=zeroshot", "method.template=a {} photo."], "expected words then '{}.'"),
        (["method=fedotp", "data.client_test_fraction=0.25"], "model.arch=RN50 is no open_clip ViT"),
        (["method=fedpgp", "method.rank=0", "data.client_test_fraction=0.25"], "method.rank must be >= 1"),
        (["method=fedpgp", "method.temp=0", "data.client_test_fraction=0.25"], "method.temp must be > 0"),
        (["method=fedotp", "data.client_test_fraction=0.25", "data.base_new=true"], "takes no data.base_new"),
    ):
        assert main(["run", "data=fmnist", "runtime=serial", "logger=none", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err


@pytest.mark.slow
def test_aligned_stand_in_is_built_once_and_scores_above_chance(tmp_path, monkeypatch, data_root):
    """The mini scales' stand-in: the random model's image tower aligned on held-out images
    against its own frozen text tower's "a photo of a {class}." (a few hundred images here)."""
    monkeypatch.setenv("FL_LIGHTNING_TEACHER_CACHE", str(tmp_path / "cache"))
    # k shots of the base classes for the clients (FedTPG's protocol): the held-out images are
    # still the training set's 55,000.. of every class
    args = [*TINY, "method=zeroshot", "model.align_holdout_from=55000", "model.align_holdout_size=600",
            "model.align_epochs=4", "data.test_subset=300", f"output_dir={tmp_path}",
            "runtime=serial", "data.shots=8", "data.base_new=true"]  # fmt: skip
    summary, run_dir = start_run(compose(args), console=False)
    info = summary["aligned_clip"]
    assert info["train_range"] == [55000, 55600] and (tmp_path / "cache").is_dir()
    # chance is 0.1 (its sd on 300 images: 0.017); 0.30 measured after 4 epochs on 600 images
    assert info["zero_shot_accuracy"] > 0.2
    # the run scored the handwritten prompt on the aligned towers: the builder's own number
    assert summary["final_accuracy"] == pytest.approx(info["zero_shot_accuracy"])
    again, _ = start_run(compose([*args, "run_id=again"]), console=False)
    assert again["aligned_clip"] == info  # read from the cache, not rebuilt
    assert np.isclose(again["final_accuracy"], summary["final_accuracy"])
