"""LoRA adapters through peft (`model=clip_lora`) and the federated LoRA methods (FedIT, FFA-LoRA,
FLoRA, HetLoRA) on real parts: a tiny open_clip model with random weights saved to a file (the
stand-in for CLIP weights), peft's LoRA layers, scikit-learn's digits, the Lightning Trainer in a
real host. Golden tests write each client's step and each server rule out independently over two
rounds with partial participation (3 clients, 2 a round); exactness tests check the algebra the
methods rest on (FFA-LoRA's and FLoRA's exact means, HetLoRA's truncation) and measure FedIT's gap.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.core.messages import ClientPayload, tensor_nbytes
from fl_lightning.core.optim import OptimConfig
from fl_lightning.core.strategy import TaskInfo
from fl_lightning.data.datasets import DIGIT_NAMES
from fl_lightning.methods import METHODS
from fl_lightning.methods.adapters import AdapterObjective
from fl_lightning.methods.hetlora import pad, truncate
from fl_lightning.models.clip_lora import CLIPLoRA, adapter_keys, adapter_modules, base_weight_key
from fl_lightning.runtime.host import ClientHost, ClientSpec
from fl_lightning.testing import (
    BS,
    EPS32,
    LR,
    SIZES3,
    client_data,
    manual_fit,
    match,
    rounds_1_and_2,
    three_clients,
    twin,
    written_mean,
)
from fl_lightning.text.encoders import OpenCLIPTextEncoder

from .test_prompt import ARCH, DIGITS, clip_file  # noqa: F401  (the module's CLIP weights file)

RANK, ALPHA = 2, 4.0
WIDTH, IMAGE_LAYERS, TEXT_LAYERS = 64, 1, 2  # clip-tiny-random's towers


def lora_model(clip_file: str, **kw) -> CLIPLoRA:  # noqa: F811
    args = {"arch": ARCH, "pretrained": clip_file, "class_names": DIGIT_NAMES, "rank": RANK,
            "alpha": ALPHA, **DIGITS, **kw}  # fmt: skip
    return CLIPLoRA(10, 1, 8, **args)


def upload_of(model: CLIPLoRA) -> dict[str, torch.Tensor]:
    obj = AdapterObjective(model)
    up = obj.end_round(ClientPayload(client_id=0, round=1, seed=0), 10)
    assert up.params is not None
    return up.params


@pytest.mark.parametrize("towers", ["image", "text", "both"])
def test_only_adapter_tensors_train_and_upload_and_their_bytes_follow_the_rank(clip_file, towers):  # noqa: F811
    layers = {"image": IMAGE_LAYERS, "text": TEXT_LAYERS, "both": IMAGE_LAYERS + TEXT_LAYERS}[towers]
    for rank in (1, 2, 4):
        m = lora_model(clip_file, towers=towers, rank=rank)
        up = upload_of(m)
        trainable = {n for n, p in m.named_parameters() if p.requires_grad}
        assert set(up) == trainable and all(".lora_A." in k or ".lora_B." in k for k in up)
        assert set(AdapterObjective(m).model_state()) == set(up)  # what a checkpoint holds
        # per block, peft's LoRA of nn.MultiheadAttention: the packed q/k/v projection
        # (A [r, d], B [3d, r]) and its output projection (A [r, d], B [d, r]), float32
        assert tensor_nbytes(up) == 4 * layers * rank * (WIDTH + 3 * WIDTH + WIDTH + WIDTH)
        ffa = upload_of(lora_model(clip_file, towers=towers, rank=rank, freeze_a=True))
        assert all(".lora_B." in k for k in ffa)  # A frozen by role: never sent
        assert tensor_nbytes(ffa) == 4 * layers * rank * (3 * WIDTH + WIDTH)
    # B = 0 at init: the model is zero-shot CLIP, scale · cos(image, "a photo of a {class}.")
    m = lora_model(clip_file, towers=towers)
    text = OpenCLIPTextEncoder(arch=ARCH, pretrained=clip_file, device="cpu").encode(
        [f"a photo of a {c}." for c in DIGIT_NAMES]
    )
    x = torch.randn(5, 1, 8, 8)
    want = m.logit_scale * m.encode_images(x) @ text.T
    torch.testing.assert_close(m(x), want, atol=1e-5, rtol=1e-5)
    # frozen means unchanged: peft merges and unmerges the adapters of nn.MultiheadAttention in
    # place each call ((W + ΔW) − ΔW moves W by rounding); the model puts W back bit for bit
    before = {k: v.clone() for k, v in m.state_dict().items() if ".lora_" not in k}
    with torch.no_grad():
        for n, p in m.named_parameters():
            if ".lora_B." in n:
                p.normal_()
    for _ in range(3):
        m(x).sum().backward()
    assert all(torch.equal(m.state_dict()[k], v) for k, v in before.items())
    m.train()
    # the towers stay in eval mode (batch norm, dropout); only the adapters' dropout trains
    assert {n for n, t in m.named_modules() if t.training and n} == {
        n for n, _ in m.named_modules() if n.endswith(".lora_dropout.default")
    }


def _two_rounds(name: str, clip_file: str, data, method_kw: dict | None = None, batched: int = 0, **model_kw):  # noqa: F811
    """Two rounds of `name` through its strategy and a real host (round 1: clients 0, 1;
    round 2: clients 0, 2), plain SGD at the kit's rate; `batched`: the host trains a round's
    clients together (`runtime.batched`)."""
    ds, shards = data
    task = TaskInfo(num_classes=10, class_names=tuple(DIGIT_NAMES), image_mean=(0.3,), image_std=(0.4,))
    cls = METHODS.get(name)
    strategy = cls(cls.config_cls(**(method_kw or {})), num_clients=3, clients_per_round=2, seed=0, task=task)
    kwargs = strategy.model_kwargs(
        "clip_lora", {"arch": ARCH, "pretrained": clip_file, "rank": RANK, "alpha": ALPHA, **model_kw}
    )
    model = CLIPLoRA(10, 1, 8, **kwargs)
    init = {k: v.clone() for k, v in AdapterObjective(model).model_state().items()}
    spec = ClientSpec(method=name, objective_kwargs=strategy.objective_kwargs(), model="clip_lora",
                      model_kwargs=kwargs, optim=OptimConfig(lr=LR, momentum=0.0), num_classes=10,
                      in_channels=1, image_size=8, batch_size=BS, threads=1, init_params=init,
                      batched=batched)  # fmt: skip
    host = ClientHost(spec, ds, shards)
    plans, states = rounds_1_and_2(strategy, host, init)
    return strategy, kwargs, init, plans, states, host


def _delta(params: dict[str, torch.Tensor], prefix: str, scaling: float) -> torch.Tensor:
    a, b = adapter_keys(prefix)
    return scaling * params[b].double() @ params[a].double()


HET_RANKS = [1, 2, 3]
#: self-pruning's golden: clients 0 and 2 (rank 3) come back in round 2 with a module worth
#: pruning; γ = 0.5 keeps rank 1 of 3; λ large enough that the last two components fade
PRUNE_RANKS, PRUNE = [3, 2, 3], {"prune_lambda": 2.0, "prune_gamma": 0.5}


def _tail(model: torch.nn.Module, rank: int, kept: int) -> torch.Tensor:
    """Σ_modules ‖B[:, kept:rank]‖_F ‖A[kept:rank]‖_F, written out."""
    p = dict(model.named_parameters())
    return sum(
        p[b][:, kept:rank].norm() * p[a][kept:rank].norm()  # Frobenius; gradient 0 at 0
        for a, b in (adapter_keys(m) for m in adapter_modules(p))
    )


def _server(
    name: str, start: dict, trained: list[dict], sizes: list[int], init: dict, scaling: float
) -> dict:
    """Each method's server rule, written out (float64 where it multiplies)."""
    if name in ("fedit", "ffa_lora"):
        return written_mean(trained, sizes)
    out = dict(start)
    if name == "flora":  # W += Σ_k p_k s B_k A_k, one client at a time (no stacking); fresh adapters
        for prefix in adapter_modules(start):
            base = base_weight_key(prefix, start)
            delta = sum(
                n / sum(sizes) * _delta(t, prefix, scaling) for t, n in zip(trained, sizes, strict=True)
            )
            out[base] = (start[base].double() + delta).to(start[base].dtype)
        out.update({k: init[k].to(start[k].dtype) for k in init if ".lora_" in k})
        return out
    for prefix in adapter_modules(start):  # hetlora: weights ‖B_k A_k‖_F, the padded factors averaged
        norms = [float(_delta(t, prefix, 1.0).norm()) for t in trained]
        for k in adapter_keys(prefix):
            acc = sum(n / sum(norms) * t[k].double() for n, t in zip(norms, trained, strict=True))
            out[k] = acc.to(start[k].dtype)
    return out


#: golden cases: (method, method keys, model keys, runtime.batched)
GOLDEN = {
    "fedit": ("fedit", {}, {}, 0),
    "ffa_lora": ("ffa_lora", {}, {}, 0),
    "flora": ("flora", {}, {}, 0),
    "hetlora": ("hetlora", {"ranks": HET_RANKS}, {}, 0),
    # rank self-pruning: a client's rank shrinks to ⌊γ r⌋ when its last components fade
    "hetlora_pruning": ("hetlora", {"ranks": PRUNE_RANKS, **PRUNE}, {}, 0),
    # runtime.batched: the round's 2 clients stepped together, LoRA on Linear layers (the
    # image tower's MLP; peft's nn.MultiheadAttention LoRA is refused batched)
    "fedit_batched": ("fedit", {}, {"towers": "image", "target_modules": ["c_fc", "c_proj"]}, 2),
    # both towers: the class text through the adapted text tower inside the stacked step; FLoRA's fold
    "flora_batched": ("flora", {}, {"towers": "both", "target_modules": ["c_fc", "c_proj"]}, 2),
}


@pytest.mark.parametrize("case", list(GOLDEN))
# functorch runs attention per client under vmap (no batching rule yet): slower, not different
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
def test_adapter_methods_golden_two_rounds(clip_file, case):  # noqa: F811
    data = three_clients()
    name, method_kw, model_kw, batched = GOLDEN[case]
    strategy, kwargs, init, plans, states, host = _two_rounds(
        name, clip_file, data, method_kw, batched=batched, **model_kw
    )
    ranks = method_kw.get("ranks", HET_RANKS)
    lam, gamma = method_kw.get("prune_lambda", 0.0), method_kw.get("prune_gamma", 0.9)
    scaling = strategy.lora_scaling()
    assert scaling == ALPHA / (max(ranks) if name == "hetlora" else RANK)
    pruned: list[tuple[int, int, int]] = []  # (round, client, rank kept) where the reference pruned
    final_rank: dict[int, int] = {}  # each client's rank after round 2, in the float64 reference

    def run(dt: torch.dtype) -> list[dict[str, torch.Tensor]]:
        model = CLIPLoRA(10, 1, 8, **kwargs).to(dt)
        rank_now = dict(enumerate(ranks))  # a client's rank: its tier's, until it prunes

        def client(rnd: int, cid: int, seed: int, start: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            model.load_state_dict(start, strict=False)  # the frozen towers: its own
            r = rank_now[cid]
            kept = int(gamma * r) if lam > 0 else 0  # ⌊γ r⌋
            if name == "hetlora":  # a rank-r client: the components beyond r are zero
                with torch.no_grad():
                    for k, p in model.named_parameters():
                        if ".lora_A." in k:
                            p[r:] = 0
                        elif ".lora_B." in k:
                            p[:, r:] = 0
            with torch.no_grad():
                received = float(_tail(model, r, kept)) if kept else 0.0

            def loss(m, xb, yb):
                ce = F.cross_entropy(m(xb), yb)
                return ce + lam * _tail(m, r, kept) if kept else ce

            x, y = client_data(data, cid)
            manual_fit(model, x.to(dt), y, seed, loss, momentum=0.0)
            if kept:
                with torch.no_grad():
                    if float(_tail(model, r, kept)) < received:  # fading: prune to rank `kept`
                        rank_now[cid] = kept
                        if dt == torch.float64:
                            pruned.append((rnd, cid, kept))
                        for k, p in model.named_parameters():
                            if ".lora_A." in k:
                                p[kept:] = 0
                            elif ".lora_B." in k:
                                p[:, kept:] = 0
            return {
                k: v.detach().clone() for k, v in model.state_dict().items() if k in start and ".lora_" in k
            }

        out, start = [], {k: v.to(dt) for k, v in init.items()}
        for rnd, plan in enumerate(plans, 1):
            trained = [client(rnd, p.client_id, p.seed, start) for p in plan.payloads]
            sizes = [SIZES3[p.client_id] for p in plan.payloads]
            start = _server(name, start, trained, sizes, init, scaling)
            out.append(start)
        if dt == torch.float64:
            final_rank.update(rank_now)
        return out

    r32, r64 = twin(run)
    for rnd in range(2):
        got = states[rnd].global_params
        assert set(got) == set(init)
        match(got, (r32[rnd], r64[rnd]))
    moved = [k for k in init if not torch.equal(states[1].global_params[k], init[k])]
    assert moved, "nothing trained"
    if name == "ffa_lora":
        assert all(".lora_B." in k for k in init)  # A never leaves the client: the global model is B
    if name == "flora":
        assert all(".lora_B." in k or ".base_layer." in k for k in moved)  # fresh adapters, base folded
    if lam > 0:  # round 1 starts from B = 0 (nothing can fade); in round 2 client 0 prunes, client 2 not
        assert pruned == [(2, 0, 1)], pruned
        assert {c: s["hetlora_rank"] for c, s in host.states.items()} == {0: 1, 1: 2, 2: 3} == final_rank
    # uploads: adapter tensors only (HetLoRA's cut to the client's rank, self-pruned or not)
    for p in plans[1].payloads:
        up = host.fit(plans[1].broadcast, p)
        assert up.params and all(".lora_" in k for k in up.params)
        if name == "hetlora":
            r = int(up.metrics["hetlora/rank"])
            assert r == (final_rank if lam > 0 else dict(enumerate(HET_RANKS)))[p.client_id]
            assert all(v.shape[0] == r for k, v in up.params.items() if ".lora_A." in k)
            assert all(v.shape[1] == r for k, v in up.params.items() if ".lora_B." in k)


def _round_one(name: str, clip_file: str, method_kw: dict | None = None):  # noqa: F811
    strategy, kwargs, init, plans, states, host = _two_rounds(name, clip_file, three_clients(), method_kw)
    state0 = strategy.init_state(init)
    ups = sorted((host.fit(plans[0].broadcast, p) for p in plans[0].payloads), key=lambda u: u.client_id)
    return strategy, init, state0, ups, strategy.aggregate(state0, ups)


def test_ffa_lora_mean_is_exact_and_fedit_mean_is_not(clip_file):  # noqa: F811
    _, init, _, ups, agg = _round_one("ffa_lora", clip_file)
    a_init = lora_model(clip_file, freeze_a=True)  # A: the seeded init every copy builds
    a_state = a_init.state_dict()
    n = [u.num_examples for u in ups]
    for prefix in adapter_modules(a_state):
        ka, kb = adapter_keys(prefix)
        a = a_state[ka].double()
        got = agg.global_params[kb].double() @ a  # the aggregated B · the shared A
        want = sum(w / sum(n) * (u.params[kb].double() @ a) for w, u in zip(n, ups, strict=True))
        # to float rounding: one float32 rounding of each averaged B entry, summed over the rank
        tol = 4 * EPS32 * float(want.abs().max()) * RANK + 1e-12
        torch.testing.assert_close(got, want, atol=tol, rtol=0)
    # FedIT: mean(B) · mean(A) against mean(B · A) on the same round: a real gap, not rounding
    _, _, _, ups, agg = _round_one("fedit", clip_file)
    n = [u.num_examples for u in ups]
    gaps = []
    for prefix in adapter_modules(agg.global_params):
        ka, kb = adapter_keys(prefix)
        inexact = agg.global_params[kb].double() @ agg.global_params[ka].double()
        exact = sum(
            w / sum(n) * (u.params[kb].double() @ u.params[ka].double()) for w, u in zip(n, ups, strict=True)
        )
        gaps.append(float((inexact - exact).norm() / exact.norm()))
    assert max(gaps) > 1e3 * EPS32, gaps  # measured 0.006-0.11 of ‖mean(B·A)‖ by module: not rounding


def test_flora_stacked_product_is_the_sum_of_the_clients_delta_w(clip_file):  # noqa: F811
    strategy, init, state0, ups, agg = _round_one("flora", clip_file)
    s, n = strategy.lora_scaling(), [u.num_examples for u in ups]
    for prefix in adapter_modules(init):
        base = base_weight_key(prefix, init)
        got = agg.global_params[base].double() - init[base].double()
        want = sum(w / sum(n) * _delta(u.params, prefix, s) for w, u in zip(n, ups, strict=True))
        # the fold's one float32 rounding of W + ΔW
        tol = 2 * EPS32 * float(init[base].abs().max() + want.abs().max())
        torch.testing.assert_close(got, want, atol=tol, rtol=0)
        assert float(want.abs().max()) > 100 * tol  # the clients did move it
    for k in state0.restart:  # the next round starts fresh: A at its seeded init, B = 0
        assert torch.equal(agg.global_params[k], init[k])


def test_hetlora_truncation_and_padding_leave_a_rank_r_module_unchanged(clip_file):  # noqa: F811
    strategy, init, state0, ups, agg = _round_one("hetlora", clip_file, {"ranks": HET_RANKS})
    s = strategy.lora_scaling()
    r_max = max(HET_RANKS)
    for u in ups:
        r = HET_RANKS[u.client_id]
        for prefix in adapter_modules(u.params):
            ka, kb = adapter_keys(prefix)
            padded = {k: pad(k, u.params[k], r_max) for k in (ka, kb)}
            assert padded[ka].shape[0] == r_max and padded[kb].shape[1] == r_max
            # re-truncating the padded module gives the client's module back, bit for bit
            assert all(torch.equal(truncate(k, padded[k], r), u.params[k]) for k in (ka, kb))
            # and the padded module is the same ΔW as the rank-r one (its extra components are zero)
            assert torch.equal(_delta(padded, prefix, s), _delta(u.params, prefix, s))
    # the engine's client: loads the r_max global module, truncates to its rank, trains; the
    # components beyond its rank stay exactly zero, so its upload is the whole of its module
    assert any(HET_RANKS[u.client_id] < r_max for u in ups)
    assert set(agg.global_params) == set(init)


LORA_TINY = ["data=fmnist", "data.train_subset=120", "data.test_subset=60", "fl.num_clients=3",
             "fl.clients_per_round=2", "fl.local_epochs=1", "fl.batch_size=16", "logger=none",
             f"model.arch={ARCH}", f"model.rank={RANK}", "model.towers=image", "optim.name=sgd",
             "runtime.threads_per_client=1"]  # fmt: skip


@pytest.mark.slow
def test_ffa_lora_under_the_dp_chain_resumes_exactly_and_ray_matches_serial(
    clip_file,  # noqa: F811
    tmp_path,
    data_root,
    ray_workers,
):
    """FFA-LoRA under `aggregator.steps=[clip_l2,uniform,gaussian]` (its paper's DP setting):
    round 1 on Ray's workers equals round 1 in one process; a run stopped after round 1 and
    resumed equals the uninterrupted run bit for bit; bytes_up is the B matrices only; and
    the same under FedBuff, Ray's worker == one process."""
    import json

    from fl_lightning.cli.main import main
    from fl_lightning.config import compose
    from fl_lightning.runtime.runner import start_run

    from .run_files import final_state

    def lines(d) -> list[dict]:
        return [json.loads(s) for s in (d / "metrics.jsonl").read_text().splitlines()]

    args = [*LORA_TINY, "method=ffa_lora", f"model.pretrained={clip_file}", f"output_dir={tmp_path}",
            "aggregator.steps=[clip_l2,uniform,gaussian]", "aggregator.clip=1.0",
            "aggregator.noise_multiplier=0.1"]  # fmt: skip
    ray, ray_dir = start_run(compose([*args, "runtime=ray", "runtime.num_actors=2", "fl.rounds=1",
                                      "run_id=ray"]), console=False, session=ray_workers)  # fmt: skip
    full, full_dir = start_run(
        compose([*args, "runtime=serial", "fl.rounds=2", "run_id=full"]), console=False
    )
    assert ray["executor"] == "ray" and full["rounds_completed"] == 2
    per_client = 4 * IMAGE_LAYERS * RANK * (3 * WIDTH + WIDTH)  # B only: FFA-LoRA's half
    assert all(r["bytes_up"] == 2 * per_client for r in lines(full_dir))
    keys = ("round", "train_loss", "bytes_up", "accuracy", "loss")
    assert [[r[k] for k in keys] for r in lines(ray_dir)] == [
        [r[k] for k in keys] for r in lines(full_dir)[:1]
    ]
    server, _ = final_state(full_dir)  # the checkpoint: adapter tensors only, by role
    assert server["fields"]["global_params"] and all(
        ".lora_B." in k for k in server["fields"]["global_params"]
    )
    assert main(["resume", str(ray_dir), "fl.rounds=2", "runtime.executor=serial", "--quiet"]) == 0
    assert [[r[k] for k in keys] for r in lines(ray_dir)] == [[r[k] for k in keys] for r in lines(full_dir)]
    # FedBuff (system.mode=fedbuff): 2 clients in flight, a server step per arrival, so the second
    # lands stale (its delta from the B it started from, weighted 1/(1+τ)^0.5, then the DP
    # chain); arrivals in virtual-time order, so Ray's workers give the serial run's numbers
    buff = [*args, "system.mode=fedbuff", "system.concurrency=2", "system.buffer=1",
            "system.seconds_per_example=0.01", "system.noise=exponential", "fl.rounds=2"]  # fmt: skip
    async_runs = [start_run(compose([*buff, f"runtime={rt}", "runtime.num_actors=2", f"run_id=buff_{rt}"]),
                            console=False, session=ray_workers)[1] for rt in ("ray", "serial")]  # fmt: skip
    keys = (*keys, "virtual_time", "system/staleness_max")
    ray_buff, serial_buff = ([[r[k] for k in keys] for r in lines(d)] for d in async_runs)
    assert ray_buff == serial_buff and len(serial_buff) == 2
    assert max(r[-1] for r in serial_buff) >= 1  # a stale update was weighed in
    assert all(r[2] == per_client for r in serial_buff)  # one client's B a step


def test_adapter_model_and_methods_refuse_each_other_and_batched_in_one_line(capsys, tmp_path):
    from fl_lightning.cli.main import main

    from .paper_fixtures import sst2 as write_sst2

    buff = ["system.concurrency=2", "fl.num_clients=4"]
    sgd = ["runtime.batched=2", "optim.name=sgd"]
    text = tmp_path.parent / f"{tmp_path.name}_sst2"  # beside the output folder, which stays empty
    write_sst2(text)
    sst2 = ["data=sst2", f"data.root={text}"]
    for args, says in (
        (["method=fedavg", "model=clip_lora"], "model=clip_lora is trained by method="),
        (["method=promptfl", "model=clip_lora"], "use model=clip_prompt"),
        (["method=fedit", "model=cnn"], "method=fedit trains LoRA adapters: use model=clip_lora"),
        # the text classifier (models/hf_lora.py) on sentences only, and sentences to it only
        (["method=ffa_lora", "model=hf_lora"], "model=hf_lora classifies sentences: use a text dataset"),
        (["method=fedit", *sst2], "method=fedit on data=sst2 (sentences) trains model=hf_lora"),
        (["method=fedit", "model=hf_lora", *sst2, *sgd], "runtime.batched=2: the model has dropout"),
        # any method: an image model would read the sentences' bytes as 1-pixel images, and train
        (["method=fedavg", *sst2], "data=sst2 holds sentences, and model=cnn classifies images: use a model"),
        (["method=fedprox", "model=resnet18", *sst2], "(model=hf_lora)"),
        (["method=flora", "aggregator.steps=[clip_l2,uniform,gaussian]"], "flora"),
        # the asynchronous modes weigh stale updates in the chain, which FLoRA and HetLoRA skip
        (
            ["method=flora", "system.mode=fedbuff", "system.buffer=2", *buff],
            "method flora cannot run in system.mode=fedbuff: it does not aggregate through the chain",
        ),
        (
            ["method=hetlora", "system.mode=fedasync", *buff],
            "method hetlora cannot run in system.mode=fedasync",
        ),
        # runtime.batched: plain SGD on Linear targets only (the golden's `fedit_batched`)
        (
            ["method=fedit", "runtime.batched=2"],
            "optim.name=adamw: batched clients train with plain SGD only",
        ),
        (
            ["method=fedit", *sgd, f"model.arch={ARCH}"],
            "peft's LoRA of visual.transformer.resblocks.0.attn (an nn.MultiheadAttention) merges",
        ),
        (["method=hetlora", *sgd], "method 'hetlora' cannot train clients batched"),
        # FedGLCL's LoRA on the sentence encoder: its own features are the targets
        (
            ["method=fedglcl", "method.text_lora_rank=2", "method.targets=permuted"],
            "method.text_lora_rank=2: the targets are the adapted encoder's text features",
        ),
        (
            ["method=fedglcl", "method.text_lora_rank=2", "text=clip"],
            "text=minilm or text=hf (not text=clip)",
        ),
    ):
        run = ["run", "data=fmnist", "runtime=serial", "logger=none", f"output_dir={tmp_path}"]
        assert main([*run, *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
        assert list(tmp_path.iterdir()) == []  # nothing written


def test_fedglcl_with_lora_on_the_real_minilm_golden_two_rounds():
    """FedGLCL trains its text side with LoRA on the real all-MiniLM-L6-v2 (method.text_lora_rank=2,
    peft on the 6 blocks' query and value projections, 384 -> 384): the encoder's weights are
    frozen by role (never uploaded nor checkpointed), its adapters shared; at B = 0 the class
    features are the frozen encoder's; two rounds with partial participation equal a written-out
    loop (the prompts through the adapted encoder in every step, FedAvg of backbone, projector
    and adapters) in float32 and float64."""
    import copy

    from fl_lightning.core.messages import tensor_nbytes
    from fl_lightning.testing import loop

    rank, tau = 2, 0.1
    data = three_clients()
    r = loop("fedglcl", data, method={"text_lora_rank": rank, "text_lora_alpha": 4.0, "tau": tau})
    obj, init = r.objective, r.init
    text_keys = {k for k in obj.model.state_dict() if k.startswith("text_lora.")}
    adapters = {k for k in text_keys if ".lora_A." in k or ".lora_B." in k}
    assert len(adapters) == 6 * 2 * 2  # 6 blocks x (query, value) x (A, B)
    assert {k for k in init if k.startswith("text_lora.")} == adapters  # checkpoint: no MiniLM weight
    trainable = {f"model.{n}" for n, p in obj.model.named_parameters() if p.requires_grad}
    assert {n for n, p in obj.named_parameters() if p.requires_grad} == trainable
    assert {k.removeprefix("model.") for k in trainable if "text_lora" in k} == adapters
    for u in r.updates[0]:  # uploads: adapters only of the text side, A [2, 384] and B [384, 2] each
        assert {k for k in u.params if k.startswith("text_lora.")} == adapters
        text_bytes = tensor_nbytes({k: v for k, v in u.params.items() if k.startswith("text_lora.")})
        assert text_bytes == 4 * 6 * 2 * rank * (384 + 384)
    # B = 0: the adapted encoder's class features are the frozen MiniLM's (FedGLCL's own targets),
    # to float32 rounding of one forward over a different batch of prompts
    fresh = copy.deepcopy(obj.model)
    fresh.load_state_dict(init, strict=False)
    with torch.no_grad():
        torch.testing.assert_close(fresh.text_lora(), r.strategy.class_features, atol=1e-5, rtol=0)

    def loss(m, x, y):
        logits = F.normalize(m(x), dim=-1) @ F.normalize(m.text_lora(), dim=-1).T / tau
        return F.cross_entropy(logits, y)

    def run(dt: torch.dtype) -> list[dict[str, torch.Tensor]]:
        model = copy.deepcopy(obj.model).to(dt)
        out, start = [], {k: v.to(dt) for k, v in init.items()}
        for plan in r.plans:
            trained = []
            for p in plan.payloads:
                model.load_state_dict(start, strict=False)  # the frozen encoder: its own
                x, y = client_data(data, p.client_id)
                manual_fit(model, x, y, p.seed, loss, momentum=0.0)
                trained.append({k: v.detach().clone() for k, v in model.state_dict().items() if k in start})
            start = written_mean(trained, [SIZES3[p.client_id] for p in plan.payloads])
            out.append(start)
        return out

    r32, r64 = twin(run)
    for rnd in range(2):
        match(r.states[rnd].global_params, (r32[rnd], r64[rnd]))
    b = [k for k in adapters if ".lora_B." in k]
    assert all(float(r.states[1].global_params[k].abs().max()) > 0 for k in b)  # the text side trained


def test_ffa_lora_on_a_text_encoder_mean_is_exact_over_two_rounds(tmp_path):
    """`model=hf_lora` (peft LoRA on the real all-MiniLM-L6-v2's query/value projections, rank 2,
    RoBERTa's classification head) on SST-2 in GLUE's file format (the fixture sentences, read by
    the real loader), FFA-LoRA over two rounds with partial participation (3 clients, 2 a round):
    uploads hold B and the head only (A never leaves: the seeded init every copy builds, which a
    fresh model equals), and each round's aggregated B times the shared A is the example-weighted
    mean of the clients' B_k A, to float rounding."""
    import numpy as np

    from fl_lightning.data.registry import load_dataset
    from fl_lightning.models.hf_lora import HFLoRA
    from fl_lightning.testing import serial_rounds

    from .paper_fixtures import sst2

    sst2(tmp_path)
    ds = load_dataset("sst2", str(tmp_path))
    assert len(ds.train_y) == 64 and set(ds.test_y.tolist()) == {0, 1}
    shards = {0: np.arange(0, 28), 1: np.arange(28, 48), 2: np.arange(48, 64)}  # 28, 20, 16 sentences
    names = tuple(ds.class_names)
    task = TaskInfo(num_classes=2, class_names=names, image_mean=(ds.mean,), image_std=(ds.std,))
    cls = METHODS.get("ffa_lora")
    strategy = cls(cls.config_cls(), num_clients=3, clients_per_round=2, seed=0, task=task)
    kwargs = strategy.model_kwargs("hf_lora", {"rank": RANK, "alpha": ALPHA, "max_length": 32})
    model = HFLoRA(2, 1, 1, **kwargs)
    x, _ = ds.tensors(ds.train_x[:2], ds.train_y[:2])
    first = ["a gorgeous , witty , seductive movie .", "a dull , lifeless mess of a movie ."]
    assert model.sentences(x) == first  # the bytes the pipeline carries decode to the sentences
    init = {k: v.clone() for k, v in AdapterObjective(model).model_state().items()}
    b_keys = {k for k in init if ".lora_B." in k}
    assert len(b_keys) == 6 * 2 and set(init) == b_keys | {k for k in init if k.startswith("head.")}
    spec = ClientSpec(method="ffa_lora", objective_kwargs={}, model="hf_lora", model_kwargs=kwargs,
                      optim=OptimConfig(lr=LR, momentum=0.0), num_classes=2, in_channels=1, image_size=1,
                      batch_size=BS, threads=1, init_params=init)  # fmt: skip
    host = ClientHost(spec, ds, shards)
    r = serial_rounds(strategy, host, init, dataset=ds)  # (the global evaluation on the dev sentences)
    plans, states = r.plans, r.states
    assert [p.client_ids for p in plans] == [[0, 1], [0, 2]]  # partial: client 1 sits out round 2
    a_state = HFLoRA(2, 1, 1, **{**kwargs, "freeze_a": True}).state_dict()  # A: the shared seeded init
    start = strategy.init_state(init)
    for rnd, plan in enumerate(plans):
        ups = sorted((host.fit(plan.broadcast, p) for p in plan.payloads), key=lambda u: u.client_id)
        agg = strategy.aggregate(start, ups)
        for k in init:  # the round's updates again (same seeds, same machine): the run's state
            assert torch.equal(agg.global_params[k], states[rnd].global_params[k]), k
        n = [u.num_examples for u in ups]
        assert n == [len(shards[p.client_id]) for p in plan.payloads]
        for u in ups:
            assert set(u.params) == set(init)  # B and the head: no A, no MiniLM weight
            assert tensor_nbytes({k: u.params[k] for k in b_keys}) == 4 * 6 * 2 * 384 * RANK
        for prefix in adapter_modules(a_state):
            ka, kb = adapter_keys(prefix)
            a = a_state[ka].double()
            got = agg.global_params[kb].double() @ a
            want = sum(w / sum(n) * (u.params[kb].double() @ a) for w, u in zip(n, ups, strict=True))
            # each averaged B entry rounded once to float32, summed over the rank against |A|
            b_max = max(float(u.params[kb].abs().max()) for u in ups)
            tol = 2 * EPS32 * RANK * b_max * float(a.abs().max()) + 1e-12
            torch.testing.assert_close(got, want, atol=tol, rtol=0)
            assert float(want.abs().max()) > 100 * tol  # the clients did move B
        start = agg
    head = "head.2.weight"  # the head: FedAvg of the clients', example-weighted, in round 2 too
    assert not torch.equal(states[1].global_params[head], states[0].global_params[head])
