"""FedTPG on real parts (the tiny open_clip model saved as a weights file, its tokenizer,
scikit-learn's digits and Fashion-MNIST, the Lightning Trainer, local Ray): the prompt
generator and its federated training written out over two rounds with partial participation;
its prompts for classes no client held (base / new); exact resume and Ray == serial."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.cli.main import main
from fl_lightning.config import compose
from fl_lightning.data.datasets import DIGIT_NAMES
from fl_lightning.models.clip_prompt import CLIPPrompt
from fl_lightning.runtime.runner import start_run
from fl_lightning.testing import client_data, manual_fit, match, three_clients, twin, written_mean
from fl_lightning.text.encoders import OpenCLIPTextEncoder

from .test_prompt import ARCH, DIGITS, TINY, _lines, _two_rounds, clip_file  # noqa: F401  (a fixture)

N_CTX, HEADS = 4, 4


def _ln(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * w + b


def _generator(p: dict[str, torch.Tensor], names: torch.Tensor) -> torch.Tensor:
    """The authors' `PromptTranslator` (depth 0) written out: LN'd queries attend, in 4 heads,
    to the LN'd class-name features (no residual), then x + FF(x) with a GEGLU."""
    g = "generator."
    q = _ln(p[g + "soft_prompt"], p[g + "norm.weight"], p[g + "norm.bias"])
    t = _ln(names, p[g + "norm_context.weight"], p[g + "norm_context.bias"])
    bq, bk, bv = p[g + "cross.in_proj_bias"].chunk(3)
    q, k, v = (
        q @ p[g + "cross.q_proj_weight"].T + bq,
        t @ p[g + "cross.k_proj_weight"].T + bk,
        t @ p[g + "cross.v_proj_weight"].T + bv,
    )
    heads = []
    for h in range(HEADS):
        cols = slice(h * q.shape[1] // HEADS, (h + 1) * q.shape[1] // HEADS)
        a = torch.softmax(q[:, cols] @ k[:, cols].T / math.sqrt(q.shape[1] // HEADS), dim=-1)
        heads.append(a @ v[:, cols])
    x = torch.cat(heads, dim=1) @ p[g + "cross.out_proj.weight"].T + p[g + "cross.out_proj.bias"]
    h = _ln(x, p[g + "ff.0.weight"], p[g + "ff.0.bias"]) @ p[g + "ff.1.weight"].T + p[g + "ff.1.bias"]
    a, gate = h[:, : h.shape[1] // 2], h[:, h.shape[1] // 2 :]
    return (a * F.gelu(gate)) @ p[g + "ff.3.weight"].T + p[g + "ff.3.bias"] + x


class Written(torch.nn.Module):
    """FedTPG's text side by hand: the generated context after the start token of
    "X X X X {name}.", the frozen text tower, scale · cos against the image features."""

    def __init__(self, weights: str, start: dict[str, torch.Tensor], dt: torch.dtype) -> None:
        super().__init__()
        enc = OpenCLIPTextEncoder(arch=ARCH, pretrained=weights, device="cpu")
        self.enc, self.dt = enc.to(dt), dt
        ids, self.mask = enc.tokenize([f"X X X X {c}." for c in DIGIT_NAMES])
        with torch.no_grad():
            self.tokens = enc.embed_tokens(ids).to(dt)
        self.names = enc.encode(list(DIGIT_NAMES)).to(dt)  # the bare names, as their code encodes them
        self.p = torch.nn.ParameterDict(
            {k.replace(".", "/"): torch.nn.Parameter(v.to(dt).clone()) for k, v in start.items()}
        )

    def params(self) -> dict[str, torch.Tensor]:
        return {k.replace("/", "."): v for k, v in self.p.items()}

    def text(self, classes: torch.Tensor) -> torch.Tensor:
        ctx = _generator(self.params(), self.names[classes])
        t = self.tokens[classes]
        x = torch.cat([t[:, :1], ctx.expand(len(classes), -1, -1), t[:, 1 + N_CTX :]], dim=1)
        return F.normalize(self.enc.forward_embeddings(x, self.mask[classes], normalize=False), dim=-1)


def test_fedtpg_golden_two_rounds_and_prompts_for_classes_no_client_held(clip_file):  # noqa: F811
    data = three_clients()  # client 0 holds digits 0-5, client 1 digits 3-9, client 2 the even ones
    init, plans, states, host = _two_rounds("fedtpg", clip_file, data)
    assert set(init) == {k for k in init if k.startswith("generator.")} and "generator.soft_prompt" in init
    frozen = CLIPPrompt(
        10, 1, 8, arch=ARCH, pretrained=clip_file, class_names=DIGIT_NAMES, n_ctx=N_CTX, **DIGITS
    )
    scale = frozen.logit_scale

    def reference(dt: torch.dtype) -> list[dict[str, torch.Tensor]]:
        out, start = [], {k: v.to(dt) for k, v in init.items()}
        tower = frozen.to(dt)
        for plan in plans:
            trained = []
            for p in plan.payloads:
                x, y = client_data(data, p.client_id)
                held = torch.unique(y)  # the client's classes: its logits, its names, its labels
                model = Written(clip_file, start, dt)

                def loss(m, zb, yb, held=held):
                    return F.cross_entropy(scale * zb @ m.text(held).T, torch.searchsorted(held, yb))

                manual_fit(model, tower.encode_images(x.to(dt)), y, p.seed, loss, momentum=0.0)
                trained.append({k: v.detach().clone() for k, v in model.params().items()})
            start = written_mean(trained, [1] * len(trained))  # server.py: the plain mean
            out.append(start)
        return out

    r32, r64 = twin(reference)
    for rnd in range(2):
        match(states[rnd].global_params, (r32[rnd], r64[rnd]))
    # base / new: base (0-4) and new (5-9) classes are scored with contexts generated from
    # their own names only, by the trained generator; the new classes' prompts moved with it
    kw = {"arch": ARCH, "pretrained": clip_file, "class_names": DIGIT_NAMES, "n_ctx": N_CTX, **DIGITS}
    model = CLIPPrompt(10, 1, 8, **kw, generator={"base_classes": 5})
    model.load_state_dict(states[-1].global_params, strict=False)  # the tower: its own
    written = Written(clip_file, states[-1].global_params, torch.float32)
    z = model.encode_images(data[0].tensors(data[0].test_x[:40], data[0].test_y[:40])[0])
    with torch.no_grad():
        base, new = torch.arange(5), torch.arange(5, 10)
        want = scale * z @ torch.cat([written.text(base), written.text(new)]).T
        torch.testing.assert_close(model(z), want, atol=1e-4, rtol=1e-4)
        together = scale * z @ written.text(torch.arange(10))[5:].T  # one context for all ten
        assert (model(z)[:, 5:] - together).abs().max() > 1e-3  # the grouping is what scores new
        before = Written(clip_file, init, torch.float32).text(new)
        assert (written.text(new) - before).abs().max() > 1e-4  # the generator's training moved them
        # a composite of two 5-class datasets (data=coop_multi): each dataset's base (3 classes)
        # and new (2) halves scored apart, each with the context generated from its own names
        two = CLIPPrompt(10, 1, 8, **kw, generator={"cuts": [0, 3, 5, 8, 10]})
        two.load_state_dict(states[-1].global_params, strict=False)
        groups = [torch.arange(a, b) for a, b in ((0, 3), (3, 5), (5, 8), (8, 10))]
        want = scale * z @ torch.cat([written.text(g) for g in groups]).T
        torch.testing.assert_close(two(z), want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_fedtpg_base_new_resumes_exactly_and_ray_matches_serial(clip_file, tmp_path, data_root, ray_workers):  # noqa: F811
    """FedTPG's protocol: clients hold blocks of the base classes (2 of Fashion-MNIST's 5 base
    classes each: round(5/2) = 2 clients, 1 a round), the new classes only reach the generator
    as names at evaluation."""
    args = [*TINY, "method=fedtpg", f"model.pretrained={clip_file}", f"output_dir={tmp_path}",
            "data.base_new=true", "data.partition=class_blocks", "data.classes_per_client=2",
            "fl.num_clients=2", "fl.clients_per_round=1"]  # fmt: skip
    full, full_dir = start_run(
        compose([*args, "runtime=serial", "fl.rounds=2", "run_id=full"]), console=False
    )
    lines = _lines(full_dir)
    assert full["rounds_completed"] == 2 and all(0 <= r["new_accuracy"] <= 1 for r in lines)
    assert len({r["new_accuracy"] for r in lines}) > 1  # the unseen classes' prompts move with training
    keys = ("round", "train_loss", "accuracy", "base_accuracy", "new_accuracy", "base_new_hm", "bytes_up")
    ray_args = [*args, "runtime=ray", "runtime.placement=pool", "runtime.num_actors=2", "fl.rounds=1"]
    ray, ray_dir = start_run(compose([*ray_args, "run_id=ray"]), console=False, session=ray_workers)
    assert ray["executor"] == "ray" and ray["num_actors"] == 2
    assert [[r[k] for k in keys] for r in _lines(ray_dir)] == [[r[k] for k in keys] for r in lines[:1]]
    # the Ray run stopped after round 1 resumes serially to round 2 as the uninterrupted run (no
    # serial 1-round run of its own: it cost as much)
    assert main(["resume", str(ray_dir), "fl.rounds=2", "runtime.executor=serial", "--quiet"]) == 0
    assert [[r[k] for k in keys] for r in _lines(ray_dir)] == [[r[k] for k in keys] for r in lines]


def test_fedtpg_refuses_a_context_it_does_not_generate(capsys):
    for args, says in (
        (["model.class_specific=true"], "method=fedtpg generates one context"),
        (["method.heads=0"], "method.heads >= 1"),
    ):
        assert main(["run", "data=fmnist", "runtime=serial", "logger=none", "method=fedtpg", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
