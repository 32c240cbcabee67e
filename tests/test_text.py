"""Text layer: encoders (real MiniLM weights, a tiny random open_clip), prompts as data, the
cached class-text feature bank, class-specific soft prompts, `fl-lightning text`. No mocks."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from fl_lightning.cli.main import main
from fl_lightning.config import compose, validate_registered
from fl_lightning.core.errors import ConfigError
from fl_lightning.data.datasets import FMNIST_CLASSES
from fl_lightning.text import TEXT_ENCODERS, build_text_encoder, class_text_features, text_feature_identity
from fl_lightning.text import prompts as P
from fl_lightning.text.encoders import TextEncoder, minilm_path
from fl_lightning.text.soft_prompt import ClassSoftPrompts

MINILM = {"name": "minilm", "device": "cpu"}
TINY_CLIP = {"name": "clip", "arch": "clip-tiny-random", "device": "cpu"}
TEXTS = [
    "a photo of a sneaker.",
    "ankle boot",
    "a photo of a t-shirt: a short-sleeved top with a round neckline.",
]


@pytest.fixture(scope="module")
def minilm():
    return build_text_encoder(MINILM)


@pytest.fixture(scope="module")
def tiny_clip():
    return build_text_encoder(TINY_CLIP)


def _frozen(enc: TextEncoder) -> None:
    assert all(not p.requires_grad for p in enc.parameters())
    enc.train()  # a parent calling .train() must not switch dropout on
    assert not enc.training and not any(m.training for m in enc.modules())


# --- encoders ------------------------------------------------------------------------------
def test_minilm_matches_sentence_transformers(minilm):
    from sentence_transformers import SentenceTransformer

    assert os.environ.get("HF_HUB_OFFLINE")  # set by the encoder when it was unset
    feats = minilm.encode(TEXTS)
    assert feats.shape == (3, 384) and minilm.embed_dim == 384
    assert torch.allclose(feats.norm(dim=1), torch.ones(3), atol=1e-5)
    st = SentenceTransformer(str(minilm_path()), device="cpu")
    ref = st.encode(TEXTS, convert_to_tensor=True).cpu()
    assert torch.allclose(feats, ref, atol=1e-5)
    _frozen(minilm)


def test_forward_embeddings_reproduces_encode(minilm, tiny_clip):
    for enc in (minilm, tiny_clip):
        ids, mask = enc.tokenize(TEXTS)
        with torch.no_grad():
            feats = enc.forward_embeddings(enc.embed_tokens(ids), mask)
        assert torch.allclose(feats, enc.encode(TEXTS), atol=1e-5)


def test_hf_encoder_on_local_minilm_folder(minilm):
    enc = build_text_encoder({"name": "hf", "model": str(minilm_path()), "pooling": "mean", "device": "cpu"})
    assert enc.embed_dim == 384
    assert torch.allclose(enc.encode(TEXTS), minilm.encode(TEXTS), atol=1e-6)
    enc.pooling = "cls"  # first-token pooling: different, still unit vectors
    cls = enc.encode(TEXTS)
    assert not torch.allclose(cls, minilm.encode(TEXTS), atol=1e-2)
    assert torch.allclose(cls.norm(dim=1), torch.ones(3), atol=1e-5)
    _frozen(enc)


def test_open_clip_tiny_end_to_end_and_weights_file(tiny_clip, tmp_path):
    import open_clip

    assert tiny_clip.embed_dim == 32
    feats = tiny_clip.encode(TEXTS)
    assert feats.shape == (3, 32) and torch.allclose(feats.norm(dim=1), torch.ones(3), atol=1e-5)
    _frozen(tiny_clip)
    # random init is seeded: the same architecture given as a .json path gives the same weights
    cfg = {"embed_dim": 32, "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "head_width": 32,
           "patch_size": 16}, "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2,
           "layers": 2}}  # fmt: skip
    arch = tmp_path / "tiny-from-test.json"
    arch.write_text(json.dumps(cfg))
    same = build_text_encoder({**TINY_CLIP, "arch": str(arch)})
    assert torch.equal(same.encode(TEXTS), feats)
    # weights saved to a file and reloaded through text.pretrained=<file>
    torch.manual_seed(123)
    model = open_clip.create_model("tiny-from-test").eval()
    weights = tmp_path / "tiny_clip.pt"
    torch.save(model.state_dict(), weights)
    tok = open_clip.get_tokenizer("tiny-from-test")
    with torch.no_grad():
        ref = F.normalize(model.encode_text(tok(TEXTS)), dim=-1)
    a = build_text_encoder({**TINY_CLIP, "pretrained": str(weights)})
    b = build_text_encoder({**TINY_CLIP, "pretrained": str(weights)})
    assert torch.allclose(a.encode(TEXTS), ref, atol=1e-5)  # open_clip's own encode_text
    assert torch.equal(a.encode(TEXTS), b.encode(TEXTS))
    assert not torch.allclose(a.encode(TEXTS), feats, atol=1e-3)  # really other weights
    # the feature cache keys on the weights file: same file = hit, rewritten file = miss
    names = ["sneaker", "bag"]
    cfg_w = {**TINY_CLIP, "pretrained": str(weights)}
    f1, i1 = class_text_features(cfg_w, names, "small", cache_dir=tmp_path, encoder=a, return_info=True)
    f2, i2 = class_text_features(cfg_w, names, "small", cache_dir=tmp_path, return_info=True)
    assert not i1["cache_hit"] and i2["cache_hit"] and torch.equal(f1, f2) and f1.shape == (2, 32)
    torch.save({k: v + 1e-3 for k, v in model.state_dict().items()}, weights)
    _, i3 = class_text_features(cfg_w, names, "small", cache_dir=tmp_path, return_info=True)
    assert not i3["cache_hit"]


# --- prompts as data -------------------------------------------------------------------------
def test_prompts_templates_and_descriptions():
    assert P.clean_class_name("aquarium_fish") == "aquarium fish"
    assert P.class_prompts(["maple_tree"], P.templates("simple")) == [["a photo of a maple tree."]]
    assert len(P.templates("imagenet80")) == 80 and len(P.templates("small")) == 7
    assert all("{}" in t for t in P.templates("imagenet80"))
    assert P.templates("a sketch of a {}.") == ["a sketch of a {}."]
    with pytest.raises(ConfigError, match="imagenet80"):
        P.templates("imagenet81")
    for dataset, n in (("fmnist", 10), ("cifar10", 10), ("cifar100", 100)):
        names = P.description_class_names(dataset)
        descs = P.descriptions(dataset)
        assert len(names) == n and all(len(d) == 3 and all(s.strip() for s in d) for d in descs)
    assert P.description_class_names("fmnist") == FMNIST_CLASSES
    c100 = P.description_class_names("cifar100")
    assert c100 == sorted(c100) and {"aquarium_fish", "willow_tree", "sweet_pepper"} <= set(c100)
    # lookup works on cleaned names too; FedTSP prompt form
    assert P.descriptions("cifar100", ["aquarium fish"]) == P.descriptions("cifar100", ["aquarium_fish"])
    prompt = P.description_prompts(["aquarium_fish"], [["a small colourful fish"]])[0][0]
    assert prompt == "a photo of a aquarium fish: a small colourful fish."
    with pytest.raises(ConfigError, match="unicorn"):
        P.descriptions("cifar10", ["unicorn"])
    # a dataset without its own file borrows the file that describes all its classes
    assert P.descriptions("my_cifar_subset", ["apple", "aquarium fish"]) == P.descriptions(
        "cifar100", ["apple", "aquarium_fish"]
    )


# --- class-text feature bank --------------------------------------------------------------------
def test_class_features_semantic_structure_and_cache(minilm, tmp_path):
    feats, info = class_text_features(
        MINILM, FMNIST_CLASSES, templates="simple", cache_dir=tmp_path, encoder=minilm, return_info=True
    )
    assert not info["cache_hit"] and info["path"].is_file()
    assert feats.shape == (10, 384) and feats.dtype == torch.float32 and feats.device.type == "cpu"
    assert torch.allclose(feats.norm(dim=1), torch.ones(10), atol=1e-5)
    i = {c: k for k, c in enumerate(FMNIST_CLASSES)}
    cos = feats @ feats.T
    assert cos[i["sneaker"], i["ankle boot"]] > cos[i["sneaker"], i["trouser"]]
    assert cos[i["t-shirt"], i["shirt"]] > cos[i["t-shirt"], i["sandal"]]
    off = cos - 2 * torch.eye(10)
    assert off[i["t-shirt"]].argmax() == i["shirt"] and off[i["shirt"]].argmax() == i["t-shirt"]

    # second call: a hit, identical tensor, no encoder needed
    again, info2 = class_text_features(MINILM, FMNIST_CLASSES, "simple", cache_dir=tmp_path, return_info=True)
    assert info2["cache_hit"] and info2["path"] == info["path"] and torch.equal(again, feats)
    # another template set (or other classes) invalidates
    ens, info3 = class_text_features(
        MINILM, FMNIST_CLASSES, "small", cache_dir=tmp_path, encoder=minilm, return_info=True
    )
    assert not info3["cache_hit"] and info3["path"] != info["path"] and not torch.equal(ens, feats)
    _, info4 = class_text_features(
        MINILM, FMNIST_CLASSES[:5], "simple", cache_dir=tmp_path, encoder=minilm, return_info=True
    )
    assert not info4["cache_hit"]
    assert text_feature_identity(MINILM) != text_feature_identity({**MINILM, "max_length": 32})

    # FedTSP descriptions: footwear classes cluster, apart from tops
    desc = class_text_features(
        MINILM,
        FMNIST_CLASSES,
        descriptions=P.descriptions("fmnist", FMNIST_CLASSES),
        cache_dir=tmp_path,
        encoder=minilm,
    )
    c = desc @ desc.T
    shoes, tops = [i["sandal"], i["sneaker"], i["ankle boot"]], [i["t-shirt"], i["pullover"], i["shirt"]]
    within = c[shoes][:, shoes][~torch.eye(3, dtype=torch.bool)].mean()
    assert within > c[shoes][:, tops].mean() + 0.2


# --- soft prompts -----------------------------------------------------------------------------
def test_soft_prompts_init_reproduces_handcrafted(minilm, tmp_path):
    names = ["t-shirt", "sneaker", "bag", "ankle boot"]
    descs = P.descriptions("fmnist", names)
    sp = ClassSoftPrompts(minilm, names, descs, ctx_init="a photo of a")
    assert sp.n_ctx == 4 and sp.k == 3 and sp.ctx.shape == (4, 4, 384)
    # the encoder is a submodule frozen by role (`frozen_prefixes`): ctx is all that trains or is kept
    assert [n for n, p in sp.named_parameters() if p.requires_grad] == ["ctx"]
    assert sp.frozen_prefixes == ("encoder.",)
    assert [k for k in sp.state_dict() if not k.startswith(sp.frozen_prefixes)] == ["ctx"]
    feats = sp()
    handcrafted = minilm.encode([t for ts in sp.prompts for t in ts]).view(4, 3, -1)
    assert feats.shape == (4, 3, 384) and torch.allclose(feats, handcrafted, atol=1e-5)
    # averaged over the k descriptions = the feature bank's description features
    bank = class_text_features(MINILM, names, descriptions=descs, cache_dir=tmp_path, encoder=minilm)
    assert torch.allclose(sp(reduce="mean"), bank, atol=1e-5)
    assert torch.allclose(sp(classes=[1, 3]), feats[[1, 3]], atol=1e-6)


@pytest.mark.parametrize("which", ["minilm", "tiny_clip"])
def test_soft_prompt_step_changes_only_prompt_vectors(which, request):
    enc = request.getfixturevalue(which)
    names = ["sneaker", "bag", "coat"]
    sp = ClassSoftPrompts(enc, names, P.descriptions("fmnist", names))
    if which == "tiny_clip":  # the init reproduces the handcrafted prompts on CLIP too
        ref = enc.encode([t for ts in sp.prompts for t in ts]).view(3, 3, -1)
        assert torch.allclose(sp(), ref, atol=1e-5)
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    ctx0 = sp.ctx.detach().clone()
    opt = torch.optim.SGD(list(sp.parameters()) + list(enc.parameters()), lr=1.0)
    target = F.normalize(torch.randn(3, enc.embed_dim, generator=torch.Generator().manual_seed(0)), dim=-1)
    loss = -(sp(reduce="mean") * target).sum()
    loss.backward()
    opt.step()
    assert sp.ctx.grad is not None and all(p.grad is None for p in enc.parameters())
    assert all(not torch.equal(sp.ctx[c], ctx0[c]) for c in range(3))  # every class's vectors moved
    after = enc.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


# --- config and CLI -----------------------------------------------------------------------------
def test_text_configs_match_builders_and_unknown_names():
    for name in ("minilm", "clip", "hf"):
        cfg = compose([f"text={name}", "logger=none"])
        validate_registered(cfg)  # every yaml key is an argument of the registered builder
        assert cfg.text["name"] == name and name in TEXT_ENCODERS
    with pytest.raises(ConfigError, match="valid: clip, hf, minilm"):
        validate_registered(compose(["text=minilm", "text.name=bogus"]))
    with pytest.raises(ConfigError, match="valid: clip, hf, minilm"):
        build_text_encoder({"name": "bogus"})
    with pytest.raises(ConfigError, match="max_length"):
        build_text_encoder({"name": "minilm", "max_len": 3})


def test_cli_text_prints_matrix_and_writes_png(tmp_path, capsys):
    rc = main(
        ["text", "data=fmnist", "text=minilm", f"output_dir={tmp_path}", "--cache-dir", str(tmp_path / "c")]
    )
    out = capsys.readouterr().out
    assert rc == 0
    png = tmp_path / "text" / "fmnist_minilm_similarity.png"
    assert f"heatmap: {png}" in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = out.splitlines()
    header = next(k for k, ln in enumerate(lines) if ln.split() and ln.split()[0] == "t-shirt")
    rows = lines[header + 1 : header + 11]
    assert [r.split()[0] for r in rows][:9] == FMNIST_CLASSES[:9] and rows[-1].startswith("ankle boot")
    assert all(len(r.split()) >= 11 for r in rows) and "1.00" in rows[0]

    rc = main(["text", "data=fmnist", "text=bogus"])
    err = capsys.readouterr().err
    assert (
        rc == 2 and "unknown text 'bogus'" in err and "minilm" in err and len(err.strip().splitlines()) == 1
    )


def test_cli_text_many_classes_with_descriptions(tmp_path, capsys):
    from fl_lightning.data.registry import DATASETS

    if "cifar100" not in DATASETS:
        pytest.skip("cifar100 is not registered")
    args = ["text", "data=cifar100", "text=minilm", f"output_dir={tmp_path}", "--descriptions"]
    assert main([*args, "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "nearest classes:" in out and "cache miss" in out  # 100 classes: neighbours, not the matrix
    assert (tmp_path / "text" / "cifar100_minilm_descriptions_similarity.png").is_file()
    oak = next(ln for ln in out.splitlines() if ln.startswith("oak tree "))
    shark = next(ln for ln in out.splitlines() if ln.startswith("shark "))
    assert "maple tree" in oak.removeprefix("oak tree") and "dolphin" in shark  # 3 nearest classes


def test_a_text_model_folder_that_cannot_load_is_one_line(tmp_path):
    """`text.path=<folder>` whose tokenizer files are not one (a hostile or broken download):
    transformers' KeyError / ValueError traceback before; now one ConfigError naming it."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizerFast"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match="cannot load Hugging Face text model") as e:
        build_text_encoder({"name": "minilm", "path": str(tmp_path), "device": "cpu"})
    assert "\n" not in str(e.value)
