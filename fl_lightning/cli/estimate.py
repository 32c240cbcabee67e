"""`fl-lightning reproduce <paper> --scale paper --estimate`: what a reproduction would cost here.

For each row it times a few real training steps of the row's backbone (the model its config
builds, at its batch size, SGD, on this machine's GPU if there is one, else the CPU) on
synthetic tensors of the dataset's shape (the paper's data need not be here), then projects:

    steps a round = clients a round x ceil(images a client / batch size) x local epochs
    (or the local steps), images a client = training images / clients;
    wall time of a run = steps a round x rounds x seconds a step;
    device-hours = wall time x seeds (each run on one device).

A prompt learner (`model=clip_prompt`: PromptFL, FedOTP, FedPGP, FedTPG) trains no backbone:
its step is the text tower over the prompts of the classes the step scores (all, the base half
under `data.base_new`, or a client's own block under `method.own_classes`) on a batch of
cached image features, and each training image passes the frozen image tower once; both are
timed on the architecture built with random weights (the weights file need not be here), with
placeholder class names, and the run is steps x seconds a step + images x seconds an image.
A row whose clients fit nothing (zero-shot) counts no step: evaluation only, not timed.

What it does not time, so the projection is a lower bound: the method's own terms beyond the
backbone's (text encoders, prototypes, distillation, FedTPG's prompt generator, FedOTP's
transport), server steps (CLIP2FL's federated features, FedTSP's prompt tuning), evaluation,
data loading and communication. Every number it prints is a projection and says so.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from ..config import RootConfig, compose
from ..core.errors import ConfigError

#: (channels, image size, training images) of the datasets the paper scales name, as their
#: loaders give them (sizes: the published training splits); `data.image_size`,
#: `data.train_subset` and a long-tailed `data.imbalance_factor` change them
SHAPES: dict[str, tuple[int, int, int]] = {
    "fmnist": (1, 28, 60000), "mnist": (1, 28, 60000), "digits": (1, 8, 1437),
    "cifar10": (3, 32, 50000), "cifar100": (3, 32, 50000), "cifar10_lt": (3, 32, 50000),
    "cifar100_lt": (3, 32, 50000), "flair": (3, 256, 345000),  # FLAIR: ~345k (docs/data.md)
    "tiny_imagenet": (3, 64, 100000), "fmnist_multilabel": (1, 56, 60000),
    "sst2": (1, 1, 67349),  # GLUE's SST-2 training sentences (as bytes: data/glue.py)
    "voc2007": (3, 128, 5011), "coco": (3, 128, 82081),  # VOC 2007 trainval; COCO train2014 (annotated)
    "office_caltech": (3, 256, 2533),  # all four domains (958 + 1,123 + 157 + 295): the split trains on part
    # DomainNet's 10-class subset, six domains (FedGLCL's Table 7: 2,103 + 2,626 + 2,472 + 4,000 +
    # 4,867 + 2,213 training images), at its config's 128 px
    "domainnet": (3, 128, 18281),
    # issue 37's 20 classes: the 8,000 client images (the held-out part is not trained on), and
    # as frozen EfficientNet-Lite0 features, [1280, 1, 1] a sample
    "fmnist_digits20": (1, 28, 8000), "fmnist_digits20_eff": (1280, 1, 8000),
    "fmnist_digits20_mosaic": (1, 56, 3000),  # its themed mosaics (E4)
    # CoOp's few-shot suite (data/coop.py) at CLIP's 224 px: the training lists of its splits
    # (CoOp's DATASETS.md); `data.shots` draws k a class from them
    "caltech101": (3, 224, 4128), "oxford_pets": (3, 224, 2944), "oxford_flowers": (3, 224, 4093),
    "food101": (3, 224, 50500), "dtd": (3, 224, 2820), "eurosat": (3, 224, 13500),
    "stanford_cars": (3, 224, 6509), "sun397": (3, 224, 15880), "ucf101": (3, 224, 7639),
    "fgvc_aircraft": (3, 224, 3334), "imagenet": (3, 224, 1281167),
}  # fmt: skip
#: class counts of the datasets whose names are known only once loaded
CLASSES = {
    "cifar100": 100,
    "cifar100_lt": 100,
    "flair": 17,
    "voc2007": 20,
    "coco": 80,
    "fmnist_digits20_mosaic": 20,
    "caltech101": 100, "oxford_pets": 37, "oxford_flowers": 102, "food101": 101, "dtd": 47,
    "eurosat": 10, "stanford_cars": 196, "sun397": 397, "ucf101": 101, "fgvc_aircraft": 100,
    "imagenet": 1000,
}  # fmt: skip
STEPS_TIMED = 3
REPEATS = 3
SLOW_STEP_S = 2.0  # a warm-up step slower than this is timed once more, not REPEATS x STEPS_TIMED
#: a prompt learner's image tower: seconds an image from a batch of this many (a GPU's; the
#: CPU's cost grows with the batch, so a small one says as much sooner)
IMAGES_TIMED = {"cuda": 64, "cpu": 4}


def _members(cfg: RootConfig) -> list[str]:
    """The datasets of the run: a composite's members (`data=coop_multi`), else the one."""
    from ..data.registry import DATASETS

    members = DATASETS.get(str(cfg.data.name)).members
    return [str(cfg.data.name)] if members is None else list(members(cfg.data.datasets))


def train_images(cfg: RootConfig) -> int | None:
    names = _members(cfg)
    if any(m not in SHAPES for m in names):
        return None
    name, n = names[0], sum(SHAPES[m][2] for m in names)
    factor = float(cfg.data.imbalance_factor or 1.0)
    if factor > 1 and name.startswith("cifar"):  # the long-tailed profile n_c = n_max * IF^(-c/(K-1))
        k = 100 if name.startswith("cifar100") else 10
        n = sum(int(n // k * factor ** (-c / (k - 1))) for c in range(k))
    subset = cfg.data.train_subset
    n = min(n, int(subset)) if subset else n
    if cfg.data.shots:  # k a class, of the classes trained on (the base half under base_new)
        n = min(n, int(cfg.data.shots) * trained_classes(cfg))
    return n


def _classes(name: str) -> int:
    from ..data.registry import DATASETS

    entry = DATASETS.get(name)
    return len(entry.class_names) if entry.class_names else CLASSES.get(name, 10)


def num_classes(cfg: RootConfig) -> int:
    return sum(_classes(m) for m in _members(cfg))


def trained_classes(cfg: RootConfig) -> int:
    """The classes the clients train on: the base half under `data.base_new` (each member's,
    of a composite), else all."""
    from ..core.metrics import base_class_count

    return sum(base_class_count(_classes(m)) if cfg.data.base_new else _classes(m) for m in _members(cfg))


def scored_classes(cfg: RootConfig) -> int:
    """How many classes' prompts a prompt learner's step runs through the text tower: a
    client's own block (`method.own_classes` with a class partition), else every trained one."""
    c = trained_classes(cfg)
    if getattr(cfg.method, "own_classes", False) and str(cfg.data.partition) in ("class_blocks", "shards"):
        return min(c, int(cfg.data.classes_per_client))
    return c


def fits_nothing(cfg: RootConfig) -> bool:
    """The row's clients train nothing (zero-shot): no step to project."""
    from ..core.method import METHODS

    return bool(getattr(METHODS.get(str(cfg.method.name)).objective_cls, "fits_nothing", False))


def steps_per_round(cfg: RootConfig, n: int) -> int:
    fl = cfg.fl
    clients = int(fl.num_clients)
    per_round = int(fl.clients_per_round) if fl.clients_per_round else math.ceil(float(fl.fraction) * clients)
    each = math.ceil(n / clients)
    local = (
        int(fl.local_steps) if fl.local_steps else int(fl.local_epochs) * math.ceil(each / int(fl.batch_size))
    )
    return per_round * local


def seconds_per_step(
    cfg: RootConfig, device: str, cache: dict[Any, tuple[float, float]] | None = None
) -> tuple[float, float]:
    """(wall time of one SGD step of the row's backbone (client 0's, in a family of models) on
    a synthetic batch, the median of REPEATS timings of STEPS_TIMED steps (a shared machine's
    noise); seconds an image through a prompt learner's frozen image tower, else 0); rows with
    the same backbone, shape and batch share one timing (`cache`)."""
    import torch

    from ..models import build_client_model
    from .pretrain import model_kwargs

    name = _members(cfg)[0]  # a composite's members share the shape (CLIP's 224 px)
    if name not in SHAPES:
        raise ConfigError(f"no shape known for dataset {name!r} (estimate knows {', '.join(SHAPES)})")
    channels, size, _ = SHAPES[name]
    size = int(cfg.data.image_size or size)
    kwargs = {k: v for k, v in model_kwargs(cfg).items() if k != "weights"}
    model_name = str(cfg.model["name"])
    classes = scored_classes(cfg) if model_name == "clip_prompt" else num_classes(cfg)
    key = (model_name, repr(sorted(kwargs.items())), channels, size, classes, int(cfg.fl.batch_size))
    if cache is not None and key in cache:
        return cache[key]
    if model_name == "clip_prompt":
        step, per_image = _prompt_step(cfg, device, kwargs, classes, channels, size)
    else:
        model = build_client_model(model_name, 0, classes, channels, size, **kwargs).to(device)
        batch = int(cfg.fl.batch_size)
        gen = torch.Generator().manual_seed(0)
        x = torch.rand((batch, channels, size, size), generator=gen).to(device)
        y = torch.randint(0, classes, (batch,), generator=gen).to(device)
        step, per_image = _sgd_step(model, lambda: model(x), y), 0.0
    seconds = _time(step, device), per_image
    if cache is not None:
        cache[key] = seconds
    return seconds


def _sgd_step(model: Any, forward: Any, y: Any) -> Any:
    """One SGD step of cross-entropy on `forward()`'s logits, over the trainable parameters."""
    import torch

    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        out = forward()
        logits = out[0] if isinstance(out, tuple) else out
        torch.nn.functional.cross_entropy(logits, y).backward()
        opt.step()

    return step


def _time(step: Any, device: str) -> float:
    """Seconds a call of `step`: the median of REPEATS timings of STEPS_TIMED calls after a
    warm-up (allocation, cudnn's choice of kernels); one timed call where the warm-up took over
    SLOW_STEP_S (a CLIP text tower on a CPU: minutes otherwise)."""
    import torch

    def timed(n: int) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / n

    if timed(1) > SLOW_STEP_S:
        return timed(1)
    return sorted(timed(STEPS_TIMED) for _ in range(REPEATS))[REPEATS // 2]


def _prompt_step(
    cfg: RootConfig, device: str, kwargs: dict[str, Any], classes: int, channels: int, size: int
) -> tuple[Any, float]:
    """A prompt learner's step (the text tower over `classes` prompts, on a batch of cached
    image features) and the seconds an image takes through its frozen image tower."""
    import torch

    from ..models import build_client_model

    keep = {k: v for k, v in kwargs.items() if not k.startswith("align") and k != "pretrained"}
    names = [f"class {i}" for i in range(classes)]  # the real names are the dataset's: ~ as long
    logging.disable(logging.WARNING)  # "random weights": meant, here
    try:
        built = build_client_model("clip_prompt", 0, classes, channels, size, class_names=names, **keep)
    finally:
        logging.disable(logging.NOTSET)
    model: Any = built.to(device)  # CLIPPrompt: encode_images, feature_dim, forward_head
    batch = int(cfg.fl.batch_size)
    gen = torch.Generator().manual_seed(0)
    images = torch.rand((IMAGES_TIMED[device], channels, size, size), generator=gen).to(device)
    per_image = _time(lambda: model.encode_images(images), device) / IMAGES_TIMED[device]
    z = torch.nn.functional.normalize(torch.randn((batch, model.feature_dim), generator=gen), dim=-1)
    y = torch.randint(0, classes, (batch,), generator=gen).to(device)
    z = z.to(device)
    return _sgd_step(model, lambda: model.forward_head(z), y), per_image


def estimate_lines(rows: Sequence[tuple[str, list[str]]], seeds: int) -> list[str]:
    """One line per row (`(label, overrides)`) and the total, every number labelled."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    lines = [
        f"estimate on this machine ({where}): backbone SGD steps timed on synthetic tensors of each "
        f"dataset's shape (median of {REPEATS} x {STEPS_TIMED} steps after a warm-up, one step where it "
        f"takes over {SLOW_STEP_S:g} s; client 0's model of a family; a prompt learner's step is its text "
        "tower's, plus each training image once through its image tower); projected = steps a round x "
        "rounds x seconds a step, a lower bound (method terms, server steps, evaluation, data loading "
        "not timed)",
        f"{'row':28s} {'s/step':>8s} {'steps/round':>11s} {'rounds':>7s} {'projected h/run':>15s} "
        f"{'seeds':>5s} {'projected device-h':>18s}",
    ]
    total, projected = 0.0, 0
    cache: dict[Any, tuple[float, float]] = {}
    for label, args in rows:
        cfg = compose(args)  # a bad value (`fl.rounds=-1`) is one line, exit 2: not a row "not timed", exit 0
        try:
            if fits_nothing(cfg):
                nothing = "(its clients fit nothing: evaluation only)"
                lines.append(f"{label[:28]:28s} {'-':>8s} {0:11d}  {nothing}")
                projected += 1
                continue
            n = train_images(cfg)
            t, per_image = seconds_per_step(cfg, device, cache)
        except (ConfigError, RuntimeError, TypeError, ValueError) as e:
            lines.append(f"{label[:28]:28s} not timed: {str(e).splitlines()[0][:120]}")
            continue
        if n is None:
            lines.append(f"{label[:28]:28s} {t:8.4f}  (training set size unknown: no projection)")
            continue
        steps = steps_per_round(cfg, n)
        hours = (steps * int(cfg.fl.rounds) * t + n * per_image) / 3600
        total += hours * seeds
        projected += 1
        once = f"  (with {n} images once, {per_image:.4f} s each)" if per_image else ""
        lines.append(
            f"{label[:28]:28s} {t:8.4f} {steps:11d} {int(cfg.fl.rounds):7d} {hours:15.2f} {seeds:5d} "
            f"{hours * seeds:18.2f}{once}"
        )
    if projected == 0:  # a 0.00 total would read as free
        lines.append(f"{'total':28s} none: no row could be projected (above, why)")
        return lines
    lines.append(f"{'total (projected)':28s} {'':8s} {'':11s} {'':7s} {'':15s} {'':5s} {total:18.2f}")
    if projected < len(rows):
        lines.append(f"{'':28s} ({projected} of {len(rows)} rows projected; the rest are not in the total)")
    return lines
