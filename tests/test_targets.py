"""The controls switch every text-using method shares (`text/targets.py`): `permuted` keeps the
vectors exactly (their geometry up to float32 rounding) and moves every class, `uniform` is
correlated, `orthogonal` orthonormal, `centred` has no common direction. On MiniLM's real class
features of Fashion-MNIST."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.core.errors import ConfigError
from fl_lightning.data.datasets import FMNIST_CLASSES
from fl_lightning.text import class_text_features
from fl_lightning.text.targets import TARGETS, class_targets, derangement, mean_cosine

EPS32 = torch.finfo(torch.float32).eps  # 2^-23


@pytest.fixture(scope="module")
def text() -> torch.Tensor:
    t = class_text_features({"name": "minilm"}, list(FMNIST_CLASSES), templates=["a photo of a {}"])
    assert isinstance(t, torch.Tensor)
    return t


def test_permuted_keeps_the_gram_matrix_and_moves_every_class(text):
    for seed in range(5):
        perm = derangement(len(text), seed)
        assert not bool((perm == torch.arange(len(text))).any())  # no class keeps its own vector
        out = class_targets("permuted", text, seed)
        assert torch.equal(out, text[perm])  # the same vectors, only reassigned: bit for bit
        # so its Gram matrix is text's, relabelled. Not bit for bit: a float32 matmul may sum a
        # dot product in another order at another row position (BLAS blocking differs across
        # CPUs), so each entry is within float32's dot-product error bound, γ_d Σ_k |a_k b_k|
        # (γ_d = d u / (1 - d u), u = 2^-24), of the exact (float64) value, relabelled
        exact = (text.double() @ text.double().T)[perm][:, perm]
        d, u = text.shape[1], EPS32 / 2
        bound = d * u / (1 - d * u) * (text.double().abs() @ text.double().abs().T)[perm][:, perm]
        assert bool(((out @ out.T).double() - exact).abs().le(bound).all())
        assert bool(((text @ text.T).double()[perm][:, perm] - exact).abs().le(bound).all())
        assert all(not torch.equal(out[c], text[c]) for c in range(len(text)))
    assert not torch.equal(derangement(10, 0), derangement(10, 1))  # the seed draws it
    assert torch.equal(derangement(10, 3), derangement(10, 3))


def test_uniform_is_correlated_orthogonal_orthonormal_centred_has_no_mean(text):
    uniform = class_targets("uniform", text, 0)
    assert mean_cosine(uniform) > 0.5  # the papers' "random tensors" (normalised randn: ~0.01)
    orth = class_targets("orthogonal", text, 0)
    # QR in float32: orthonormal to ~sqrt(d) ulps; 1e-5 = 84 ulps of 1
    torch.testing.assert_close(orth @ orth.T, torch.eye(len(text)), atol=1e-5, rtol=0)
    centred = class_targets("centred", text, 0)
    raw = text - text.mean(0)
    torch.testing.assert_close(centred, raw / raw.norm(dim=-1, keepdim=True))
    assert mean_cosine(centred) < 0 < mean_cosine(text)  # minus the mean: negative on average
    for kind in TARGETS:  # unit-norm text gives unit-norm targets, of the same shape and dtype
        out = class_targets(kind, text, 1)
        assert out.shape == text.shape and out.dtype == text.dtype
        torch.testing.assert_close(out.norm(dim=-1), torch.ones(len(text)))
    assert class_targets("text", text, 0) is text
    with pytest.raises(ConfigError, match="method.targets='shuffled' is not one of: text, permuted"):
        class_targets("shuffled", text, 0)
    with pytest.raises(ConfigError, match="dimension >= classes"):
        class_targets("orthogonal", torch.randn(5, 3), 0)


@pytest.mark.slow  # MiniLM's backward through the prompts (~20 s on 2 busy cores)
def test_fedtsp_prompt_tuning_works_through_permuted_and_centred_targets(text):
    """FedTSP's controls are fixed maps on the prompts' output: at the start they are the
    switch applied to the text prototypes, and a server step still lowers the loss."""
    from fl_lightning.server_steps.prompt_tuning import PromptTuner

    names, cfg = list(FMNIST_CLASSES), {"name": "minilm"}
    plain = PromptTuner(cfg, names, seed=0)
    ctx = plain.initial_ctx()
    raw = plain.text_prototypes(ctx)
    perm = PromptTuner(cfg, names, seed=0, targets="permuted")
    torch.testing.assert_close(perm.text_prototypes(ctx), raw[derangement(10, 0)], atol=1e-6, rtol=0)
    centred = PromptTuner(cfg, names, seed=0, targets="centred")
    torch.testing.assert_close(
        centred.text_prototypes(ctx), class_targets("centred", raw, 0), atol=1e-6, rtol=0
    )
    image = torch.nn.functional.normalize(
        torch.randn(10, 384, generator=torch.Generator().manual_seed(1)), dim=-1
    )
    out = perm.tune(ctx, torch.tensor(2.0), image, steps=1, lr=1.0)
    assert out.losses[-1] < out.losses[0] and not torch.equal(out.ctx, ctx)


@pytest.fixture(scope="module")
def digits20_text() -> torch.Tensor:
    from fl_lightning.data import fmnist_digits20 as fd

    t = class_text_features({"name": "minilm"}, list(fd.CLASSES), templates=["The photo contains {}."])
    assert isinstance(t, torch.Tensor)
    return t


def test_controls_inside_the_coarse_groups(digits20_text):
    """E4's missing controls on MiniLM's real fmnist_digits20 label texts: `permuted_within`
    moves every class inside its group; `group_only` keeps the text's mean cosine between the
    groups and inside each group exactly, and has no structure inside a group."""
    from fl_lightning.data import fmnist_digits20 as fd

    text, groups = digits20_text, fd.COARSE_GROUPS[fd.NAME]
    g = torch.tensor(groups)
    for seed in range(3):
        out = class_targets("permuted_within", text, seed, groups)
        perm = [int(torch.nonzero((text == out[c]).all(1)).flatten()[0]) for c in range(20)]
        assert all(perm[c] != c and groups[perm[c]] == groups[c] for c in range(20))
        # the same vectors, relabelled (BLAS's summation order: 384 x 2^-24 at most)
        torch.testing.assert_close(out @ out.T, (text @ text.T)[perm][:, perm], atol=2.5e-5, rtol=0)
    u = torch.nn.functional.normalize(text.double(), dim=-1)
    only = class_targets("group_only", text, 0, groups).double()
    torch.testing.assert_close(only.norm(dim=-1), torch.ones(20, dtype=torch.float64), atol=1e-6, rtol=0)
    off = ~torch.eye(20, dtype=torch.bool)
    for name, block in (("between", g[:, None] != g[None, :]),
                        ("clothing", (g == 0)[:, None] & (g == 0)[None, :] & off),
                        ("digits", (g == 1)[:, None] & (g == 1)[None, :] & off)):  # fmt: skip
        want = float((u @ u.T)[block].mean())
        got = (only @ only.T)[block]
        # float32 storage of unit vectors: ~1e-7 per cosine; every pair in a block alike
        assert float(got.min()) == pytest.approx(want, abs=1e-6), name
        assert float(got.max()) == pytest.approx(want, abs=1e-6), name
    with pytest.raises(ConfigError, match="needs the classes' coarse groups"):
        class_targets("group_only", text, 0)
    with pytest.raises(ConfigError, match="coarse group 1 has one class"):
        class_targets("permuted_within", text[:3], 0, (0, 0, 1))
