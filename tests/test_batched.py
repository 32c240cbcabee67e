"""`runtime.batched`: K clients trained together with stacked weights give each client the
weights it gets alone, and the same aggregate, over two rounds with partial participation
(5 of 8 clients) and unequal client sizes, under the serial executor and under Ray (that
test lives in test_faults.py, on the client workers its tests share).

Every client's training is also written out here as a plain PyTorch loop (torch's own SGD,
the method's loss by hand, the engine's batch order derived from torch's RandomSampler), in
float32 and in float64: the engine's two paths are checked against the float64 loop.

Tolerance (`match` of test_methods): 16 x the float32 loop's own relative rounding error
(|ref32 - ref64| / |ref64|, the largest over all of a round's clients' tensors) plus 4 ulps,
of the float64 value. The batched path computes the same real-number function as the
sequential one; only the order of float32 sums differs (grouped convolutions and batched
matrix products over the client axis, a masked sum divided by the example count instead of
`mean()`), so each lies within a small multiple of that computation's own float32 error of
the exact value, and the two within twice the tolerance of each other (checked directly too,
at one tolerance). The error grows with steps and rounds; the round-2 tolerance comes from
the round-2 loops, which continue from their own round-1 aggregates, as the engine does.

Client sizes 23, 40, 31, 17, 50, 12, 9, 36 at batch 10 cover a last batch of 3..9 (padded),
none (40, 50: the sampler's second permutation is never drawn), one example (31: dropped) and
a single short batch (9); 2 local epochs, SGD with momentum and weight decay.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.core.strategy import round_rng
from fl_lightning.runtime.build import prepare
from fl_lightning.runtime.executor import SerialExecutor
from fl_lightning.runtime.host import ClientHost, torch_threads

from .conftest import small
from .test_methods import f32_tolerances, match

SIZES = [23, 40, 31, 17, 50, 12, 9, 36]
BS, EPOCHS, LR, MOM, WD = 10, 2, 0.02, 0.5, 1e-3
METHOD_ARGS = {
    "fedavg": [],
    "fedprox": ["method.mu=0.1"],
    "fedglcl": [],
    "fedproto": ["data.client_test_fraction=0.25"],
}


def prepared(tmp_path, method: str):
    cfg = compose(small(
        tmp_path, f"method={method}", *METHOD_ARGS[method], "fl.num_clients=8", "fl.clients_per_round=5",
        f"fl.batch_size={BS}", f"fl.local_epochs={EPOCHS}", f"optim.lr={LR}", f"optim.momentum={MOM}",
        f"optim.weight_decay={WD}", "model=cnn", "model.channels=[4,8]", "model.hidden=32", "runtime=serial",
        "data.train_subset=400",
    ))  # fmt: skip
    p = prepare(cfg)
    # label-skewed shards of the sizes above: consecutive runs of the first 400 images sorted by label
    order = np.argsort(p.dataset.train_y[:400], kind="stable")
    cuts = np.cumsum([0, *SIZES])
    shards = {c: order[cuts[c] : cuts[c + 1]] for c in range(len(SIZES))}
    return p, shards


# --- the written-out reference ------------------------------------------------------------
def batches_of(n: int, seed: int) -> list[list[torch.Tensor]]:
    """Each epoch's index batches: DataLoader(shuffle=True, generator seeded with `seed`)
    under Lightning, which takes len(loader) batches per epoch. Per epoch the loader draws one
    int64 (its base seed) and RandomSampler a permutation; the sampler's second permutation is
    drawn when the first runs out, i.e. before a last, partial batch; a last batch of one
    example is dropped (`drop_last`, for batch norm) and then nothing more is drawn."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(EPOCHS):
        torch.empty((), dtype=torch.int64).random_(generator=g)
        order = torch.randperm(n, generator=g)
        full, rest = divmod(n, BS)
        epoch = [order[i * BS : (i + 1) * BS] for i in range(full)]
        if rest and not (rest == 1 and n > 1):
            torch.randperm(n, generator=g)
            epoch.append(order[full * BS :])
        out.append(epoch)
    return out


def ref_client(method, strategy, model, start, x, y, seed, protos, dtype):
    """One client's local training as a plain loop: (trained weights, prototypes, counts)."""
    m = copy.deepcopy(model).to(dtype)
    m.load_state_dict({k: v.to(dtype) for k, v in start.items()})
    x = x.to(dtype)
    anchor = [q.detach().clone() for q in m.parameters()]
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOM, weight_decay=WD)
    sums = counts = None
    for epoch in batches_of(len(y), seed):
        sums, counts = torch.zeros(10, m.feature_dim, dtype=dtype), torch.zeros(10, dtype=dtype)
        for idx in epoch:
            xb, yb = x[idx], y[idx]
            z = m.forward_features(xb)
            if method == "fedglcl":
                t = F.normalize(strategy.class_features.to(dtype), dim=-1)
                logits = F.normalize(m.forward_head(z), dim=-1) @ t.T / strategy.config.tau
            else:
                logits = m.forward_head(z)
            loss = F.cross_entropy(logits, yb)
            if method == "fedprox":
                loss = loss + 0.5 * strategy.config.mu * sum(
                    ((q - a) ** 2).sum() for q, a in zip(m.parameters(), anchor, strict=True)
                )
            if method == "fedproto" and protos is not None:
                p, has = protos
                keep = has[yb]
                if keep.any():
                    loss = loss + strategy.config.lam * F.mse_loss(z[keep], p.to(dtype)[yb[keep]])
            sums.index_add_(0, yb, z.detach())
            counts.index_add_(0, yb, torch.ones(len(yb), dtype=dtype))
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert sums is not None and counts is not None
    return (
        {k: v.detach().clone() for k, v in m.state_dict().items()},
        sums / counts.clamp(min=1)[:, None],
        counts,
    )


def weighted(states, weights):
    total = sum(weights)
    pairs = list(zip(states, weights, strict=True))
    return {k: sum(s[k].double() * (w / total) for s, w in pairs).to(states[0][k].dtype) for k in states[0]}


class Reference:
    """The written-out federated run in one dtype: global (or personal) weights and prototypes."""

    def __init__(self, method, p, shards, dtype):
        self.method, self.p, self.dtype = method, p, dtype
        self.data = {
            c: p.dataset.tensors(p.dataset.train_x[i], p.dataset.train_y[i]) for c, i in shards.items()
        }
        self.glob = {k: v.to(dtype) for k, v in p.init_params.items()}
        self.personal: dict[int, dict] = {}
        self.protos = None  # FedProto's broadcast: (count-weighted mean per class, seen classes)
        self.client_protos: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # this round's uploads

    def round(self, plan) -> dict[int, dict]:
        out, self.client_protos = {}, {}
        for pl in plan.payloads:
            c = pl.client_id
            start = self.personal.get(c, self.glob) if self.method == "fedproto" else self.glob
            out[c], *self.client_protos[c] = ref_client(
                self.method, self.p.strategy, self.p.objective.model, start, *self.data[c], pl.seed,
                self.protos, self.dtype,
            )  # fmt: skip
        if self.method == "fedproto":  # personal weights; the server averages prototypes
            self.personal.update(out)
            ups = [self.client_protos[c] for c in out]
            counts = sum(n for _, n in ups)
            mean = (
                sum(pr.double() * n.double()[:, None] for pr, n in ups)
                / counts.clamp(min=1).double()[:, None]
            )
            self.protos = (mean.to(self.dtype), counts > 0)
        else:  # FedAvg of the weights, by examples
            self.glob = weighted([out[c] for c in out], [len(self.data[c][1]) for c in out])
        return out


def trained(method, host, updates):
    """Each client's trained weights as the engine left them (uploaded, or kept personal)."""
    if method == "fedproto":
        return {u.client_id: host.states[u.client_id]["personal"] for u in updates}
    return {u.client_id: u.params for u in updates}


def flat(per_client: dict) -> dict[str, torch.Tensor]:
    return {f"{c}/{k}": v for c, sd in per_client.items() for k, v in sd.items()}


def run_paths(method, p, shards, executors) -> None:
    """Two rounds through each executor and through the reference loops, checked each round."""
    refs = [Reference(method, p, shards, dt) for dt in (torch.float32, torch.float64)]
    states = {name: p.strategy.init_state(p.init_params) for name in executors}
    for rnd in (1, 2):
        got, counts = {}, {}
        for name, (ex, host) in executors.items():
            plan = p.strategy.configure_round(states[name], rnd, round_rng(p.cfg.seed, rnd))
            updates = sorted(ex.fit(plan), key=lambda u: u.client_id)
            assert [u.client_id for u in updates] == plan.client_ids
            got[name] = flat(trained(method, host, updates))
            if method == "fedproto":
                got[name] |= {f"{u.client_id}/protos": u.prototypes for u in updates}
                counts[name] = {u.client_id: u.proto_counts for u in updates}
            states[name] = p.strategy.aggregate(states[name], updates)
        # the same clients and seeds (sampling depends on seed and round only)
        with torch_threads(1):  # as the engine's fits (threads=1): the float32 loop uses their kernels
            ref32, ref64 = (flat(r.round(plan)) for r in refs)
        if method == "fedproto":
            for r, f in zip(refs, (ref32, ref64), strict=True):
                f |= {f"{c}/protos": pr for c, (pr, _) in r.client_protos.items()}
            for name in executors:  # examples per class over the last epoch: exact
                assert all(
                    torch.equal(n, refs[1].client_protos[c][1].long()) for c, n in counts[name].items()
                )
        for name in executors:
            match(got[name], (ref32, ref64))
            if method == "fedproto":  # the aggregate: prototypes, or weights
                agg = {"protos": states[name].prototypes}
                match(agg, tuple({"protos": r.protos[0]} for r in refs))
            else:
                match(states[name].global_params, (refs[0].glob, refs[1].glob))
        if len(got) == 2:  # and the two engine paths directly, at one tolerance
            tols = f32_tolerances(ref32, ref64)
            a, b = got.values()
            for k in ref64:
                torch.testing.assert_close(a[k].double(), b[k].double(), atol=tols[k], rtol=0, msg=k)


def serial_paths(p, shards, accelerator: str = "cpu") -> dict:
    """The sequential host and a batched one (5 clients a round in chunks of 3 and 2: a chunk
    mixes clients of different sizes), each behind a SerialExecutor."""

    def serial(k: int):
        spec = dataclasses.replace(p.spec, batched=k, threads=1, accelerator=accelerator)
        host = ClientHost(spec, p.dataset, shards)
        return SerialExecutor(host), host

    return {"sequential": serial(0), "batched": serial(3)}


@pytest.mark.parametrize("method", list(METHOD_ARGS))
def test_batched_equals_sequential_per_client(method, tmp_path, data_root):
    p, shards = prepared(tmp_path, method)
    assert (p.spec.batched, p.spec.optim.momentum) == (0, MOM)
    run_paths(method, p, shards, serial_paths(p, shards))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", ["fedprox", "fedproto"])
def test_batched_equals_sequential_on_the_gpu(method, tmp_path, data_root, monkeypatch):
    """Both paths on the GPU against the CPU loops, with cuDNN's TF32 convolutions off (on by
    default: ~1e-3 relative, far above float32 rounding) and its deterministic algorithms.
    FedProto: its round state (prototypes) moves to the device while the clients' weights are
    read and written on the host."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    p, shards = prepared(tmp_path, method)
    run_paths(method, p, shards, serial_paths(p, shards, accelerator="gpu"))


BAD = [
    (["method=moon"], "method 'moon' cannot train clients batched: its client step (MoonObjective)"),
    (["method=scaffold"], "method 'scaffold' cannot train clients batched"),
    (["model=cnn_bn"], "the model has batch norm (features.1)"),
    (["optim.name=adam"], "optim.name=adam: batched clients train with plain SGD only"),
    (["optim.grad_clip=1.0"], "optim.grad_clip: batched clients do not clip gradients"),
    (["runtime.precision=bf16-mixed"], "runtime.precision=bf16-mixed: batched clients train in 32-bit only"),
    (["method=fedglcl", "method.moon_mu=1"], "method.moon_mu > 0: MOON's term needs each client's previous"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_a_method_or_model_that_cannot_run_batched_says_so_in_one_line(overrides, message, tmp_path, capsys):
    code = main(["run", *small(tmp_path, "runtime=serial", "runtime.batched=4"), *overrides])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("fl-lightning: error: runtime.batched=4: "), err
    assert message in err and err.rstrip().endswith("use runtime.batched=0")
    assert list(tmp_path.iterdir()) == []  # nothing was written
