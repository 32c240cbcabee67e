"""The controls switch every text-using method shares (`text/targets.py`): `permuted` keeps the
geometry exactly and moves every class, `uniform` is correlated, `orthogonal` orthonormal,
`centred` has no common direction. On MiniLM's real class features of Fashion-MNIST."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.core.errors import ConfigError
from fl_lightning.data.datasets import FMNIST_CLASSES
from fl_lightning.text import class_text_features
from fl_lightning.text.targets import TARGETS, class_targets, derangement, mean_cosine


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
        assert torch.equal(out, text[perm])  # the same vectors, only reassigned
        gram, new = text @ text.T, out @ out.T
        assert torch.equal(new, gram[perm][:, perm])  # the Gram matrix, relabelled: bit for bit
        assert torch.equal(new.flatten().sort().values, gram.flatten().sort().values)
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
