"""Backbones with one contract: `forward_features(x) -> [B, D]`, `forward_head(f) -> logits`,
`head` (the classifier on top of the features), `feature_dim`. Registered by name in `MODELS`.

A `ModelFamily` is registered in `MODELS` too: it gives client i the architecture
`members[i mod X]` (heterogeneous clients, the HtFE settings of FedTGP/FedTSP). Hosts build
a client's model with `build_client_model(name, client_id, ...)` and cache objectives by
`architecture(name, client_id)`; for a single model both ignore the client id.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..core.errors import ConfigError
from ..core.registry import Registry

MODELS: Registry[Callable[..., nn.Module]] = Registry("model")


@dataclass(frozen=True)
class ModelTraits:
    """What the generic runtime asks of a registered model beyond building it: the model's own
    knowledge, registered beside it in `MODEL_TRAITS` (by name), so the engine names no model."""

    #: its `model.*` keyword arguments as config.yaml records what was built (C-Tran:
    #: `pretrained` true only where its trunk loads ImageNet weights); None: as given
    recorded_kwargs: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    #: the model's name in an announcement, where its training step is slow enough on a CPU
    #: (C-Tran: 3.5-14 s at batch 64 on 2 cores) that a run on the CPU times one and says how
    #: long its clients' training will take (`runtime/plan.py`); "": never announced
    slow_on_cpu: str = ""
    #: what it classifies, matched against the dataset's `DatasetEntry.inputs` before any data
    #: is read: "images" (pixels or feature vectors), or "sentences" (`hf_lora`: text encoded
    #: as bytes, which an image model would take for 1-pixel images and train on)
    inputs: str = "images"

    def recorded(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return self.recorded_kwargs(kwargs) if self.recorded_kwargs is not None else kwargs


#: name -> the model's traits (`ModelTraits`); a model without an entry has the defaults
MODEL_TRAITS: dict[str, ModelTraits] = {}


def traits(name: str) -> ModelTraits:
    """Model `name`'s traits (the defaults where it registered none)."""
    return MODEL_TRAITS.get(name, ModelTraits())


class ModelFamily:
    """Heterogeneous architectures: client i gets `members[i mod len(members)]`.

    Every `model.*` key goes to every member, so members share their keyword arguments
    (e.g. `feature_dim`); the family's signature is its first member's (config validation).
    """

    def __init__(self, members: Sequence[str]) -> None:
        if not members:
            raise ValueError("a model family needs at least one member")
        self.members = tuple(members)

    def member(self, client_id: int) -> str:
        return self.members[int(client_id) % len(self.members)]

    @property
    def __signature__(self) -> inspect.Signature:  # what `config.validate_registered` checks
        return inspect.signature(MODELS.get(self.members[0]))

    def __call__(
        self, num_classes: int, in_channels: int, image_size: int, client_id: int = 0, **kwargs: Any
    ) -> nn.Module:
        return MODELS.get(self.member(client_id))(
            num_classes=num_classes, in_channels=in_channels, image_size=image_size, **kwargs
        )

    def __repr__(self) -> str:
        return f"ModelFamily({', '.join(self.members)})"


def register_family(name: str, members: Sequence[str]) -> ModelFamily:
    family = ModelFamily(members)
    MODELS.register(name)(family)
    return family


def family(name: str) -> ModelFamily | None:
    """The family registered as `name`, or None for a single architecture."""
    entry = MODELS.get(name)
    return entry if isinstance(entry, ModelFamily) else None


def architecture(name: str, client_id: int) -> str:
    """The registered architecture client `client_id` gets (`name` itself unless a family)."""
    fam = family(name)
    return fam.member(client_id) if fam is not None else name


def architectures(name: str) -> tuple[str, ...]:
    """Every architecture a model name stands for, in member order."""
    fam = family(name)
    return fam.members if fam is not None else (name,)


def build_model(name: str, num_classes: int, in_channels: int, image_size: int, **kwargs: Any) -> nn.Module:
    return MODELS.get(name)(num_classes=num_classes, in_channels=in_channels, image_size=image_size, **kwargs)


def build_client_model(
    name: str, client_id: int, num_classes: int, in_channels: int, image_size: int, **kwargs: Any
) -> nn.Module:
    """Client `client_id`'s model: its family member's, or the one model for everyone."""
    return build_model(architecture(name, client_id), num_classes, in_channels, image_size, **kwargs)


def check_image_size(name: str, num_classes: int, in_channels: int, image_size: int, **kwargs: Any) -> None:
    """ConfigError when model `name` (every member of a family) cannot take `image_size` images
    (AlexNet-BN's pooling needs at least 63 px). Cheap: built and run on the meta device, which
    checks shapes without computing; a model that cannot be built there is left to the run."""
    for arch in architectures(name):
        try:
            with torch.device("meta"), warnings.catch_warnings():  # a pretrained load into meta: a no-op
                warnings.simplefilter("ignore")
                model = build_model(arch, num_classes, in_channels, image_size, **kwargs).eval()
        except ConfigError:
            raise
        except Exception:  # e.g. weights read from a file: the real build says what is wrong
            continue
        try:
            with torch.no_grad():
                model(torch.zeros(2, in_channels, image_size, image_size, device="meta"))
        except NotImplementedError:  # an operator without a meta kernel: nothing learned
            continue
        except (RuntimeError, ValueError) as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(
                f"model {arch} cannot take {image_size}x{image_size} images ({why}); "
                "set data.image_size to a size it takes"
            ) from None


def feature_dim_key(name: str) -> str | None:
    """The keyword that sets a model's feature dimension (`feature_dim`, or `hidden` for the
    backbones whose neck width is their feature dimension), None if it has none."""
    params = inspect.signature(MODELS.get(architectures(name)[0])).parameters
    return next((k for k in ("feature_dim", "hidden") if k in params), None)


from . import backbones, clip_lora, clip_prompt, cnn, ctran, efficientnet, hf_lora, htfe, mlp, resnet8, tiles  # noqa: E402,F401  (register the models)
