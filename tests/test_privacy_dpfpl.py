"""DP-FPL (methods/dpfpl.py) against its arithmetic written out by hand: two golden rounds with
partial participation under `privacy=dp_fedavg` (the local prompt factorised every step, the
per-batch clip and local noise, the full gradient, the global prompt's clipped uniform mean and
the chain's noise), and the refusals; real runs: serial == Ray and kill -9 + resume, bit for bit
(the local noise drawn from (seed, round, client), the local prompts in the checkpoint)."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fl_lightning.cli.main import main
from fl_lightning.core.aggregation import Aggregator
from fl_lightning.core.optim import OptimConfig
from fl_lightning.core.privacy.accountant import Sampling
from fl_lightning.core.privacy.plan import PrivacyPlan
from fl_lightning.core.privacy.steps import DpFedAvgStep
from fl_lightning.core.strategy import TaskInfo
from fl_lightning.data.datasets import DIGIT_NAMES
from fl_lightning.methods import METHODS
from fl_lightning.models.clip_prompt import CLIPPrompt
from fl_lightning.runtime.host import ClientHost, ClientSpec
from fl_lightning.testing import BS, LR, client_data, match, rounds_1_and_2, three_clients, twin

from .conftest import small
from .run_files import assert_serial_is_ray_and_resume_is_exact, records
from .test_prompt import ARCH, TINY, clip_file, prompt_model  # noqa: F401  (clip_file: a fixture)

RANK, NOISE, ROUNDS = 2, 0.5, 2


def _rounds(clip_file, data, norm_thresh, chain):  # noqa: F811
    """Two rounds of DP-FPL (3 clients, 2 a round) through its strategy, a real host and the
    run's own loop, with `chain` as the run's aggregation chain."""
    ds, shards = data
    task = TaskInfo(
        num_classes=10, class_names=tuple(DIGIT_NAMES), image_mean=(0.3,), image_std=(0.4,),
        has_client_test_split=True, rounds=ROUNDS,
    )  # fmt: skip
    cls = METHODS.get("dpfpl")
    config = cls.config_cls(rank=RANK, norm_thresh=norm_thresh, noise=NOISE)
    strategy = cls(config, num_clients=3, clients_per_round=2, seed=0, task=task, aggregator=chain)
    kwargs = strategy.model_kwargs("clip_prompt", {"arch": ARCH, "pretrained": clip_file, "n_ctx": 4})
    model = CLIPPrompt(10, 1, 8, **kwargs)
    init = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith(model.frozen_prefixes)}
    spec = ClientSpec(method="dpfpl", objective_kwargs=strategy.objective_kwargs(), model="clip_prompt",
                      model_kwargs=kwargs, optim=OptimConfig(lr=LR, momentum=0.0), num_classes=10,
                      in_channels=1, image_size=8, batch_size=BS, threads=1, init_params=init)  # fmt: skip
    host = ClientHost(spec, ds, shards)
    plans, states = rounds_1_and_2(strategy, host, init)
    return init, plans, states, host


def orthonormal(a: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt as a QR decomposition with R's diagonal made positive (the same columns)."""
    q, r = torch.linalg.qr(a)
    return q * torch.sign(torch.diagonal(r))


def server_noise(rnd: int, shape, std: float) -> torch.Tensor:
    """The chain's draw for round `rnd` of a run of seed 0: a generator seeded by (seed, round,
    crc32 of the step's name), as docs/privacy.md says."""
    seed = np.random.SeedSequence([0, rnd, zlib.crc32(b"dp_fedavg")]).generate_state(2, np.uint64)[0]
    gen = torch.Generator().manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
    return std * torch.randn(shape, generator=gen, dtype=torch.float64)


def test_dpfpl_golden_two_rounds_under_dp_fedavg(clip_file):  # noqa: F811
    """Each step: L = U V + R from one power iteration (V₀ from the fit's generator), logits of
    G + U V + R, grad G, U, V each clipped to C, N(0, s²) on U's and V's, L along
    (g_U V + U g_V + U Uᵀ g_U V)/10; each round the deltas of G clipped to C_d, their plain mean
    and N(0, (σ C_d / 2)²). Mutations caught (each tried): a missing /10, U Uᵀ dropped, the residual
    scaled by 0.999."""
    data = three_clients()
    c, sigma = 0.02, 0.5  # C binds on every step's gradients here (their norms: 0.6..27)
    probe = _rounds(clip_file, data, c, None)
    deltas = [float((probe[2][0].global_params["prompt.ctx"] - probe[0]["prompt.ctx"]).norm())]
    clip_d = 0.5 * deltas[0]  # the chain's clip binds too
    plan = PrivacyPlan(
        name="dp_fedavg", clip=clip_d, noise_multiplier=sigma, update_noise_multiplier=sigma,
        count_stddev=0.0, sampling=Sampling("without_replacement", 3, 2), delta=1e-3, method="rdp",
        rounds=ROUNDS,
    )  # fmt: skip
    init, plans, states, host = _rounds(clip_file, data, c, Aggregator([DpFedAvgStep(plan)]))
    s = math.sqrt(ROUNDS * math.log(1e5)) / NOISE * c / BS  # the authors' local std

    def reference(dt: torch.dtype):
        model = prompt_model(clip_file, cache_features=False).to(dt)  # its towers only
        prompts = model.prompt

        def fit(cid: int, seed: int, glob: torch.Tensor, local: torch.Tensor):
            g, lo = glob.clone().requires_grad_(True), local.clone()
            x, y = client_data(data, cid)
            gen = torch.Generator().manual_seed(seed)
            torch.manual_seed(seed)
            loader = torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(x.to(dt), y), batch_size=BS, shuffle=True,
                generator=torch.Generator().manual_seed(seed),
            )  # fmt: skip
            for xb, yb in loader:
                v0 = torch.randn(lo.shape[1], RANK, generator=gen).to(dt)
                u = orthonormal(lo @ v0)
                v = orthonormal(lo.T @ u).T
                residual = lo - u @ v
                u, v = u.requires_grad_(True), v.requires_grad_(True)
                text = F.normalize(prompts(ctx=g + u @ v + residual)[:, 0], dim=-1)
                img = model.encode_images(xb)
                loss = F.cross_entropy(model.logit_scale * img @ text.T, yb)
                gg, gu, gv = torch.autograd.grad(loss, (g, u, v))
                gg, gu, gv = (t * min(1.0, c / float(t.norm())) for t in (gg, gu, gv))
                gu = gu + s * torch.randn(gu.shape, generator=gen).to(dt)
                gv = gv + s * torch.randn(gv.shape, generator=gen).to(dt)
                u, v, gu, gv = u.detach(), v.detach(), gu / 10, gv / 10
                full = gu @ v + u @ gv + u @ u.T @ gu @ v
                with torch.no_grad():
                    g -= LR * gg
                lo = lo - LR * full
            return g.detach(), lo

        locals_, out = {}, []
        glob = init["prompt.ctx"].to(dt)
        for rnd, pl in enumerate(plans, start=1):
            clipped = []
            for p in pl.payloads:
                start = locals_.get(p.client_id, init["local_prompt.ctx"].to(dt))
                g, locals_[p.client_id] = fit(p.client_id, p.seed, glob, start)
                d = (g - glob).double()
                clipped.append(d * min(1.0, clip_d / float(d.norm())))
            mean = sum(clipped) / len(clipped) + server_noise(rnd, glob.shape, sigma * clip_d / 2)
            glob = (glob.double() + mean).to(dt)
            out.append({"prompt.ctx": glob})
        return out, locals_

    (r32, l32), (r64, l64) = twin(reference)
    for rnd in range(2):
        match({"prompt.ctx": states[rnd].global_params["prompt.ctx"]}, (r32[rnd], r64[rnd]))
        assert states[rnd].aggregation["dp_fedavg"]["rounds"] == rnd + 1  # the accountant's count
    for cid in (0, 1, 2):  # each client's own local prompt, as its last round left it
        got = {"local_prompt.ctx": host.states[cid]["personal"]["local_prompt.ctx"]}
        match(got, ({"local_prompt.ctx": l32[cid]}, {"local_prompt.ctx": l64[cid]}))
    ups = [host.fit(plans[0].broadcast, p) for p in plans[0].payloads]
    assert all(set(u.params) == {"prompt.ctx"} for u in ups)  # the local prompt never leaves


DPFPL = ["method=dpfpl", "data.client_test_fraction=0.25", "model.n_ctx=4"]


@pytest.mark.parametrize(
    "extra, says",
    [
        (["method.noise=0.4", "method.rank=2"], "method.noise=0.4 noises the client-kept prompt only"),
        (["method.rank=8"], "method.rank=8 is above model.n_ctx=4"),
    ],
)
def test_dpfpl_refuses_in_one_line(extra, says, tmp_path, capsys, data_root):
    code = main(["run", *small(tmp_path, *TINY, *DPFPL, *extra)])
    err = "".join(line for line in capsys.readouterr().err.splitlines(True) if "(pid=" not in line)
    assert code == 2 and err.count("\n") == 1 and err.startswith("fl-lightning: error: "), err
    assert says in err
    assert not (tmp_path / "default").exists()


@pytest.mark.slow
def test_dpfpl_serial_equals_ray_and_a_killed_run_resumes_exact(tmp_path, data_root, ray_workers):
    """The local noise and V₀ come from a generator seeded by the client's round seed, and the
    local prompt is client state: pooled Ray actors give the serial run's metrics, global prompt
    and every client's local prompt bit for bit, and so does a run killed after round 1's
    checkpoint and resumed (round 2's noise is drawn as the uninterrupted run draws it)."""
    args = small(tmp_path, *TINY, *DPFPL, "method.rank=2", "method.noise=0.4", "privacy=dp_fedavg",
                 "privacy.clip=0.01", "privacy.delta=1e-3", "fl.rounds=2")  # fmt: skip
    serial = assert_serial_is_ray_and_resume_is_exact(args, ray_workers)
    lines = records(serial)
    assert [line["clients"] for line in lines] == [2, 2]  # 2 of 3 a round: one sits out, keeps its prompt
    assert 0 < lines[0]["privacy/epsilon"] < lines[1]["privacy/epsilon"]
    assert all(line["server/dp_fedavg/std"] > 0 for line in lines)  # the global prompt was noised
