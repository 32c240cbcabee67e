"""`clip_prompt`: CoOp's prompt learner on frozen open_clip towers (Zhou et al., "Learning to
Prompt for Vision-Language Models", IJCV 2022, arXiv:2109.01134), the model of the federated
prompt methods (`method=promptfl`, `zeroshot`, ...; other methods refuse it).

    logits = scale · cos(image_tower(x), text_tower(prompt_c)),   prompt_c = [ctx] {class c}.

Only the context vectors `prompt.ctx` are parameters (`n_ctx` of them, shared by all classes
or one set per class, started from the token embeddings of a phrase `ctx_init` or from
N(0, 0.02²)); both towers are submodules, frozen (no gradient, eval mode) and frozen by role
(`frozen_prefixes`), so the optimiser, every upload and every checkpoint hold the prompt alone.
`scale` is the model's own `exp(logit_scale)` (100 for OpenAI's CLIP).

The towers are any open_clip architecture (`arch`, a name or an architecture .json) with
weights from `pretrained`: a local file (as `text=clip` loads them), a tag where the network is
open, or null (random: tests). Images arrive in the dataset's normalisation and are turned into
CLIP's input here (`clip_view`: [0, 1], grey to RGB, bicubic to the tower's size, CLIP's mean
and std). A 2-d input is taken as image features already computed by this model's frozen image
tower (`encode_images`): hosts keep them with the client's shard (`cache_features`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import MODELS

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # open_clip's OPENAI_DATASET_MEAN / STD
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def tower_size(visual: nn.Module) -> int:
    size = getattr(visual, "image_size", 224)
    return int(size[0] if isinstance(size, (tuple, list)) else size)


def clip_view(x: Tensor, data_mean: Tensor, data_std: Tensor, size: int) -> Tensor:
    """Images in a dataset's normalisation as CLIP's `preprocess` gives them: [0, 1], 3
    channels, resized (bicubic) to `size`, CLIP-normalised. `data_mean`/`data_std`: [1, C, 1, 1]."""
    img = (x * data_std.to(x.device) + data_mean.to(x.device)).clamp(0, 1)
    if img.shape[1] == 1:
        img = img.expand(-1, 3, -1, -1)
    if img.shape[-1] != size or img.shape[-2] != size:
        img = F.interpolate(img, size=(size, size), mode="bicubic", align_corners=False)
    mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(CLIP_STD, device=x.device).view(1, 3, 1, 1)
    return (img - mean) / std


def _at_least_32(t: Tensor) -> Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t  # float64 stays (references)


def _channels(v: float | Sequence[float]) -> Tensor:
    return torch.tensor([float(v)] if isinstance(v, (int, float)) else [float(t) for t in v]).view(
        1, -1, 1, 1
    )


def frozen_clip(
    what: str,
    trainers: str,
    num_classes: int,
    class_names: Sequence[str] | None,
    arch: str,
    pretrained: str | None,
    seed: int,
    aligned: str | None,
    align_holdout_from: int | None,
) -> tuple[Any, str]:
    """The open_clip model (and its name) of model `what` (clip_prompt, clip_lora), frozen and
    in eval mode: `pretrained`'s weights, then `aligned`'s (the mini scale's stand-in) over
    them. ValueError, naming the methods that train it (`trainers`), without class names."""
    if torch.empty(()).is_meta:  # `check_image_size`'s probe: any size is resized to the tower's
        raise NotImplementedError(f"{what} is not built on the meta device")
    from ..text.encoders import load_open_clip

    if not class_names or len(class_names) != num_classes:
        raise ValueError(f"model={what} needs the dataset's class names: train it with {trainers}")
    if align_holdout_from is not None and aligned is None:
        raise ValueError("model.align_holdout_from is set but no aligned weights were built")
    clip, name = load_open_clip(arch, pretrained, seed, "model.pretrained")
    if aligned is not None:
        blob = torch.load(aligned, map_location="cpu", weights_only=True)
        clip.load_state_dict(blob.get("state", blob))
    clip.eval()
    for p in clip.parameters():
        p.requires_grad_(False)
    return clip, name


class CLIPPrompt(nn.Module):
    """CoOp's prompt learner on frozen open_clip towers (only the context trains; the prompt
    methods set `class_names` from the dataset)."""

    #: state entries under these prefixes are frozen by role (`ClientObjective.role`): the image
    #: tower and the text tower inside each set of soft prompts (`ClassSoftPrompts.frozen_prefixes`)
    #: are built from `model.pretrained` wherever the model is built, never uploaded, broadcast
    #: or checkpointed
    frozen_prefixes: tuple[str, ...] = ("visual.", "prompt.encoder.", "local_prompt.encoder.")

    #: only a method whose strategy has this flag trains it (config.validate_registered)
    method_flag = "prompt_learner"

    @staticmethod
    def check_config(kwargs: dict[str, Any]) -> None:
        """ConfigError for values the build would refuse, or that cannot fit CLIP's 77-token
        context, before any work (`n_ctx=0` and `class_token_position=bogus` were tracebacks
        at the model's build; `n_ctx=100000` was taken)."""
        from ..core.errors import ConfigError
        from ..text.soft_prompt import POSITIONS

        position = kwargs.get("class_token_position", "end")
        if position not in POSITIONS:
            raise ConfigError(
                f"model.class_token_position={position!r}: expected one of {', '.join(POSITIONS)}"
            )
        n_ctx = kwargs.get("n_ctx", 16)
        if not kwargs.get("ctx_init") and (
            isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or not 1 <= n_ctx <= 64
        ):
            raise ConfigError(
                f"model.n_ctx must be a whole number in [1, 64] (got {n_ctx!r}): the context vectors, "
                "within CLIP's 77 tokens (or give model.ctx_init, a handcrafted context)"
            )

    visual: nn.Module  # the frozen image tower (role "frozen": never trained, saved or sent)
    data_mean: Tensor
    data_std: Tensor
    name_features: Tensor  # with a generator: the class names' frozen text features [C, d]
    base_classes: int | None = None
    cuts: list[int] | None = None  # with a generator: the class groups scored together, as cut points

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        image_size: int,
        arch: str = "RN50",
        pretrained: str | None = None,
        seed: int = 0,
        class_names: Sequence[str] | None = None,
        n_ctx: int = 16,
        ctx_init: str | None = None,
        class_specific: bool = False,
        class_token_position: str = "end",
        init_std: float = 0.02,
        data_mean: float | Sequence[float] = 0.5,
        data_std: float | Sequence[float] = 0.5,
        cache_features: bool = True,
        local_prompt: bool = False,
        image_tokens: bool = False,
        low_rank: int = 0,
        aligned: str | None = None,
        align_holdout_from: int | None = None,
        align_holdout_size: int | None = None,
        align_epochs: int = 15,
        generator: dict[str, Any] | None = None,
    ) -> None:
        """`aligned`: a file of the whole model's weights loaded over `pretrained`'s (the mini
        scale's towers aligned on held-out images, built by the prompt methods from the
        `align_*` keys on the driver; see methods/prompting.py). `local_prompt`: a second
        context of the same shape (`local_prompt.ctx`, FedOTP's local prompt); `image_tokens`:
        the image side is the tower's projected patch tokens [B, M, d] (a ViT tower), not its
        pooled feature; `low_rank=r`: FedPGP's personal term, `lowrank_u` [n_ctx, r] and
        `lowrank_v` [r, width] from N(0, init_std²), the text tower then reading the context
        ctx + U V. All three are set by the methods that use them. `generator`: FedTPG's
        (`methods/fedtpg.py`): the shared context is no parameter but generated from the class
        names' text features (`models/prompt_generator.py`); keys `depth`, `heads`, `template`
        (the text of a class name) and `base_classes` (base and new classes are scored with
        contexts generated from their own names only), or `cuts` (0 < ... < C: the groups of
        classes scored together, each with the context from its own names: a composite's
        datasets, `data=coop_multi`, each base and new half apart)."""
        super().__init__()
        from ..text.encoders import OpenCLIPTextEncoder
        from ..text.soft_prompt import ClassSoftPrompts

        trainers = "a prompt method (method=promptfl, zeroshot, fedotp, fedpgp, fedtpg, dpfpl)"
        clip, name = frozen_clip(
            "clip_prompt",
            trainers,
            num_classes,
            class_names,
            arch,
            pretrained,
            seed,
            aligned,
            align_holdout_from,
        )
        assert class_names is not None  # (frozen_clip checked them)
        self.visual = clip.visual  # a submodule; frozen by role (`frozen_prefixes`), never sent
        self.image_size = tower_size(clip.visual)
        self.logit_scale = float(clip.logit_scale.detach().exp())
        text = OpenCLIPTextEncoder.of_model(clip, name)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # a random context is the same wherever the model is built
            settings = dict(
                ctx_init=ctx_init.replace("_", " ") if ctx_init else None,  # CoOp reads "_" as " "
                n_ctx=None if ctx_init else n_ctx, class_specific=class_specific,
                init_std=init_std, class_token_position=class_token_position,
            )  # fmt: skip
            self.prompt = ClassSoftPrompts(text, class_names, **settings)  # type: ignore[arg-type]
            self.local_prompt = (
                ClassSoftPrompts(text, class_names, **settings) if local_prompt else None  # type: ignore[arg-type]
            )
            self.lowrank_u: nn.Parameter | None = None
            self.lowrank_v: nn.Parameter | None = None
            if low_rank:
                m, width = self.prompt.n_ctx, self.prompt.ctx.shape[-1]
                self.lowrank_u = nn.Parameter(torch.randn(m, int(low_rank)) * init_std)
                self.lowrank_v = nn.Parameter(torch.randn(int(low_rank), width) * init_std)
            self.generator = None if generator is None else self._generator(text, class_names, generator)
        if image_tokens and not hasattr(clip.visual, "_embeds"):
            raise ValueError(f"model.arch={arch}: patch tokens need a ViT image tower")
        self.image_tokens = image_tokens
        self.register_buffer("data_mean", _channels(data_mean), persistent=False)
        self.register_buffer("data_std", _channels(data_std), persistent=False)
        #: hosts compute each image's features once and train on them (`encode_images`)
        self.frozen_image_features = bool(cache_features)
        self.feature_dim = text.embed_dim

    def _generator(self, text: Any, class_names: Sequence[str], g: dict[str, Any]) -> nn.Module:
        from ..text.prompts import clean_class_name
        from .prompt_generator import PromptGenerator

        del self.prompt.ctx  # generated, not learned: neither trained, saved nor sent
        names = [str(g.get("template", "{}")).format(clean_class_name(c)) for c in class_names]
        self.register_buffer("name_features", text.encode(names), persistent=False)  # [C, d], frozen
        self.base_classes = g.get("base_classes")
        self.cuts = [int(b) for b in g["cuts"]] if g.get("cuts") else None
        width = self.prompt.token_embeds.shape[-1]
        return PromptGenerator(
            self.prompt.n_ctx, width, text.embed_dim, int(g.get("depth", 0)), int(g.get("heads", 4))
        )

    def train(self, mode: bool = True) -> CLIPPrompt:
        """The frozen image tower stays in eval mode (a ResNet tower's batch norm must not move
        its statistics, nor a ViT's dropout draw) whatever mode the trainer sets."""
        super().train(mode)
        self.visual.eval()
        return self

    @torch.no_grad()
    def encode_images(self, x: Tensor, batch_size: int = 256) -> Tensor:
        """L2-normalised image features [N, d] of images in the dataset's normalisation."""
        out = [self._image_features(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
        return torch.cat(out) if out else torch.zeros(0, self.feature_dim, device=x.device)  # (pooled)

    def _image_features(self, x: Tensor) -> Tensor:
        v = clip_view(x, self.data_mean, self.data_std, self.image_size)
        if self.image_tokens:  # open_clip's VisionTransformer.forward, all tokens projected
            visual: Any = self.visual
            _, tokens = visual._pool(visual.transformer(visual._embeds(v)))
            return F.normalize(_at_least_32(tokens @ visual.proj), dim=-1)
        return F.normalize(_at_least_32(self.visual(v)), dim=-1)

    def forward_features(self, x: Tensor) -> Tensor:
        """The normalised image feature [B, d] (patch tokens [B, M, d] with `image_tokens`); an
        `x` of that shape is one already (`encode_images`)."""
        if x.dim() == (3 if self.image_tokens else 2):
            return x
        with torch.no_grad():  # the tower is frozen: no graph through it
            return self._image_features(x)

    def text_features(self, classes: Tensor | None = None, low_rank: bool = True) -> Tensor:
        """The prompted classes' normalised text features [C, d] (`classes`: those, sorted).
        With a low-rank term (FedPGP), of the context ctx + U V (`low_rank=False`: ctx alone).
        With a generator, the classes scored together get the context generated from their
        names: `classes`, else all of them (base and new apart under `base_classes`, in the
        groups of `cuts`)."""
        if self.generator is None:
            ctx = None
            if low_rank and self.lowrank_u is not None and self.lowrank_v is not None:
                ctx = self.prompt.ctx + self.lowrank_u @ self.lowrank_v
            return self.prompt(classes=classes, ctx=ctx)[:, 0]
        c, dev = len(self.prompt.class_names), self.name_features.device
        cuts = self.cuts or ([0, self.base_classes, c] if self.base_classes else [0, c])
        groups = (
            [classes] if classes is not None else [torch.arange(a, b, device=dev) for a, b in pairwise(cuts)]
        )
        return torch.cat(
            [self.prompt(classes=g, ctx=self.generator(self.name_features[g]))[:, 0] for g in groups]
        )

    @torch.no_grad()
    def written_text_features(self) -> Tensor:
        """Features [C, d] of the prompts as tokenised, the context's own words in place ("X X
        ... X {class}." for a random context, `ctx_init`'s words otherwise): nothing learnt."""
        p = self.prompt
        return _at_least_32(p.encoder.forward_embeddings(p.token_embeds, p.attention_mask))

    def forward_head(self, z: Tensor) -> Tensor:
        return self.logit_scale * z @ self.text_features().T

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


MODELS.register("clip_prompt")(CLIPPrompt)
