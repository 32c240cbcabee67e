"""`fl-lightning text data=fmnist text=minilm`: how similar are the classes' text features?

Prints the cosine-similarity matrix of the class-text features (class names as row and column
labels; for more than 20 classes, each class's nearest classes instead) and saves a heatmap PNG
to `<output_dir>/text/<dataset>_<encoder>_similarity.png` (`..._descriptions_similarity.png`
with `--descriptions`; or `--out`), and prints its path. Templates: `--templates simple|small|
imagenet80|"a sketch of a {}."`; features come from (and go to) the on-disk feature cache.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ..core.errors import ConfigError
from ..runtime.paths import resolve_output_dir

FULL_MATRIX_MAX = 20  # above this many classes, print nearest neighbours instead of the matrix


def dataset_class_names(cfg) -> list[str]:
    """Class names of `cfg.data.name`, without loading the data where possible."""
    from ..data.datasets import FMNIST_CLASSES
    from ..data.registry import DATASETS
    from ..text.prompts import description_class_names, description_datasets

    name = cfg.data.name
    entry = DATASETS.get(name)  # ConfigError listing valid datasets
    names = getattr(entry, "class_names", None)
    if callable(names):
        names = names()
    if names:
        return [str(c) for c in names]
    if name == "fmnist":
        return list(FMNIST_CLASSES)
    if name in description_datasets():
        return description_class_names(name)
    if entry.present(cfg.data.root):  # small or embedded datasets: load and read the names
        from ..data.registry import load_dataset

        return list(load_dataset(name, cfg.data.root, False).class_names)
    raise ConfigError(
        f"class names of dataset {name!r} are unknown without its data: {entry.where(cfg.data.root)}"
    )


def format_matrix(sim, names: Sequence[str]) -> str:
    w = max(len(n) for n in names)
    cw = max(6, min(12, w) + 1)
    head = " " * (w + 1) + "".join(n[: cw - 1].rjust(cw) for n in names)
    rows = [
        n.ljust(w + 1) + "".join(f"{v:{cw}.2f}" for v in row)
        for n, row in zip(names, sim.tolist(), strict=True)
    ]
    return "\n".join([head, *rows])


def format_neighbours(sim, names: Sequence[str], k: int = 3) -> str:
    import torch

    s = sim.clone()
    s.fill_diagonal_(-float("inf"))
    vals, idx = torch.topk(s, min(k, len(names) - 1), dim=1)
    w = max(len(n) for n in names)
    return "\n".join(
        n.ljust(w + 1)
        + "  ".join(f"{names[j]} {v:.2f}" for v, j in zip(vr.tolist(), ir.tolist(), strict=True))
        for n, vr, ir in zip(names, vals, idx, strict=True)
    )


def save_heatmap(sim, names: Sequence[str], path: Path, title: str) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(names)
    size = max(5.0, min(30.0, 0.35 * n + 2.5))
    fig = Figure(figsize=(size, size * 0.9))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(sim.numpy(), cmap="viridis")
    ax.set_xticks(range(n), labels=list(names), rotation=90, fontsize=8 if n <= 30 else 5)
    ax.set_yticks(range(n), labels=list(names), fontsize=8 if n <= 30 else 5)
    if n <= FULL_MATRIX_MAX:
        mid = (float(sim.min()) + float(sim.max())) / 2
        for i in range(n):
            for j in range(n):
                v = float(sim[i, j])
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="k" if v > mid else "w")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def text_command(
    overrides: list[str],
    templates: str | None = None,
    descriptions: bool = False,
    out: str | None = None,
    cache_dir: str | None = None,
    rsa: bool = False,
) -> int:
    """Body of `fl-lightning text`: compose the config, compute (or load) class-text features,
    print the similarity matrix and save the heatmap. Returns the exit code."""
    from ..config import compose

    cfg = compose(overrides)
    text_cfg = cfg.text
    if text_cfg["name"] == "none":
        print("fl-lightning text: text=none, using the default encoder text=minilm", file=sys.stderr)
        text_cfg = compose([*overrides, "text=minilm"]).text
    from ..config import check_kwargs
    from ..text import TEXT_ENCODERS, class_text_features
    from ..text import prompts as P

    encoder = str(text_cfg["name"])
    builder = TEXT_ENCODERS.get(encoder)
    check_kwargs("text", encoder, builder, {k: v for k, v in text_cfg.items() if k != "name"})
    names = dataset_class_names(cfg)
    descs = P.descriptions(cfg.data.name, names) if descriptions else None
    tmpl = None if descriptions else (templates or "simple")
    feats, info = class_text_features(
        text_cfg, names, templates=tmpl, descriptions=descs, cache_dir=cache_dir, return_info=True
    )
    sim = (feats @ feats.T).clamp(-1, 1)
    label = [P.clean_class_name(n) for n in names]
    what = "descriptions" if descriptions else f"templates={tmpl}"
    print(
        f"class-text cosine similarity: data={cfg.data.name} text={encoder} {what} "
        f"({len(names)} classes, {feats.shape[1]}-d, cache {'hit' if info['cache_hit'] else 'miss'})"
    )
    if len(names) <= FULL_MATRIX_MAX:
        print(format_matrix(sim, label))
    else:
        print("nearest classes:")
        print(format_neighbours(sim, label))
    stem = f"{cfg.data.name}_{encoder}" + ("_descriptions" if descriptions else "")
    path = (
        resolve_output_dir(out)
        if out
        else resolve_output_dir(cfg.output_dir) / "text" / f"{stem}_similarity.png"
    )
    save_heatmap(sim, label, path, f"{cfg.data.name}: {encoder} class-text cosine ({what})")
    print(f"heatmap: {path}")
    if rsa:
        print_rsa(cfg, feats, label)
    return 0


def print_rsa(cfg, text, names: Sequence[str]) -> None:
    """`--rsa`: the rank correlation between the classes' text similarity and the similarity
    of their mean training features (a frozen-feature dataset's features, else pixels), over
    all class pairs and within each coarse group; with groups, where each class's nearest text
    neighbour lies. Run before an experiment: about 0 predicts text = permuted."""
    import torch

    from ..data.registry import DATASETS, load_from_config
    from ..text.targets import class_similarity_rsa

    ds = load_from_config(cfg.data)
    x, y = ds.tensors(ds.train_x, ds.train_y)
    feats = x.flatten(1)
    rho, n = class_similarity_rsa(text, feats, y)
    print(f"rank correlation (Spearman) text vs mean {ds.name} features: {rho:+.3f} over {n} class pairs")
    groups = DATASETS.get(cfg.data.name).coarse_groups
    if not groups:
        return
    for group in sorted(set(groups)):
        members = [c for c, cg in enumerate(groups) if cg == group]
        if len(members) > 2:
            rho, n = class_similarity_rsa(text, feats, y, members)
            print(f"  within group {group} ({names[members[0]]}, ...): {rho:+.3f} over {n} pairs")
    sim = text.double() @ text.double().T
    sim.fill_diagonal_(-float("inf"))
    near = sim.argmax(1).tolist()
    same = sum(groups[c] == groups[j] for c, j in enumerate(near))
    g = torch.tensor(groups)
    mask = (g[:, None] == g[None, :]) & ~torch.eye(len(g), dtype=torch.bool)
    t = text.double() @ text.double().T
    between = ~mask & ~torch.eye(len(g), dtype=torch.bool)
    print(
        f"  nearest text neighbour in the same group: {same}/{len(groups)}; mean text cosine within "
        f"groups {float(t[mask].mean()):.3f}, between {float(t[between].mean()):.3f}"
    )
