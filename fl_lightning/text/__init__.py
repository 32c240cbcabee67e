"""Text encoders, prompt templates and class-text features (`TEXT_ENCODERS` registry).

    enc = build_text_encoder(cfg.text)              # {"name": "minilm", ...}: a frozen TextEncoder
    feats = class_text_features(cfg.text, class_names, templates="imagenet80")   # [C, d], cached

Modules: `encoders` (TextEncoder, the registered encoders), `prompts` (templates, descriptions,
class-name cleaning; the text itself lives in `data/`), `feature_bank` (cached class features),
`soft_prompt` (CoOp-style class-specific prompt vectors). `fl-lightning text` is `cli/text.py`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigError
from ..core.registry import Registry

if TYPE_CHECKING:
    from .encoders import TextEncoder

TEXT_ENCODERS: Registry[type[TextEncoder]] = Registry("text encoder")


def _split_cfg(cfg: Mapping) -> tuple[str, dict]:
    if not isinstance(cfg, Mapping):
        raise TypeError(f"text encoder config must be a mapping with a 'name', got {type(cfg).__name__}")
    kwargs = {str(k): v for k, v in cfg.items()}
    name = kwargs.pop("name", None)
    if not name or name == "none":
        raise ConfigError("no text encoder configured (text=none); pick one, e.g. text=minilm")
    return str(name), kwargs


def build_text_encoder(cfg: Mapping, **overrides: Any) -> Any:
    """A frozen `TextEncoder` from a config mapping (`cfg.text`): `name` plus builder arguments."""
    name, kwargs = _split_cfg(cfg)
    kwargs.update(overrides)
    builder = TEXT_ENCODERS.get(name)
    params = inspect.signature(builder).parameters
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ConfigError(
            f"unknown config key text.{unknown[0]!r} for text encoder {name!r}; valid: {', '.join(params)}"
        )
    return builder(**kwargs)


def text_feature_identity(cfg: Mapping) -> str:
    """Everything that determines an encoder's features (name, weights identity, options),
    computed without loading any weights."""
    name, kwargs = _split_cfg(cfg)
    return TEXT_ENCODERS.get(name).feature_identity(**kwargs)


from . import encoders  # noqa: E402,F401  (registers minilm, clip, hf)
from .feature_bank import class_text_features  # noqa: E402,F401
