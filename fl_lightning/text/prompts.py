"""Prompts as data: templates, template ensembles, per-class descriptions, class-name cleaning.

    templates("simple")        -> ["a photo of a {}."]
    templates("imagenet80")    -> the 80 CLIP ImageNet templates (`small`: CLIP's 7 best)
    templates("a sketch of a {}.")  -> that one template
    class_prompts(["aquarium_fish"], templates("simple"))  -> [["a photo of a aquarium fish."]]
    descriptions("cifar100", class_names)                   -> [[d1, d2, d3], ...] per class
    description_prompts(names, descs)  -> [["a photo of a apple: a round red or green fruit ...", ...]]

The text lives in `data/templates.json` and `data/descriptions/<dataset>.json`. Descriptions
can be regenerated from any OpenAI-compatible chat endpoint (`generate_descriptions`, or
`python -m fl_lightning.text.prompts generate --dataset cifar10 --base-url URL --model NAME`);
nothing else depends on that.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.request
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from ..core.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parent / "data"
DESCRIPTION_TEMPLATE = "a photo of a {}: {}."  # FedTSP: "A photo of {class}: {description}"


def clean_class_name(name: str) -> str:
    """Dataset label -> text: `aquarium_fish` -> `aquarium fish`, `MapleTree` stays as written."""
    return re.sub(r"\s+", " ", str(name).replace("_", " ")).strip()


@cache
def _template_sets() -> dict[str, tuple[str, ...]]:
    data = json.loads((DATA_DIR / "templates.json").read_text())
    return {k: tuple(v) for k, v in data.items() if not k.startswith("_")}


def template_names() -> list[str]:
    return sorted(_template_sets())


def templates(spec: str | Sequence[str]) -> list[str]:
    """A named template set, a single template containing `{}`, or a list of templates."""
    if isinstance(spec, str):
        if "{}" in spec:
            out = [spec]
        elif spec in _template_sets():
            out = list(_template_sets()[spec])
        else:
            raise ConfigError(
                f"unknown template set {spec!r}; valid: {', '.join(template_names())}, "
                "or one template with '{}'"
            )
    else:
        out = [str(t) for t in spec]
    if not out or any("{}" not in t for t in out):
        raise ConfigError(f"every template needs a '{{}}' for the class name (got {out!r})")
    return out


def class_prompts(class_names: Sequence[str], template_list: Sequence[str]) -> list[list[str]]:
    """Per class, one prompt per template (class names cleaned for text)."""
    return [[t.format(clean_class_name(c)) for t in template_list] for c in class_names]


# --- per-class descriptions -------------------------------------------------------------
def description_datasets() -> list[str]:
    return sorted(p.stem for p in (DATA_DIR / "descriptions").glob("*.json"))


@cache
def _description_file(dataset: str) -> dict[str, tuple[str, ...]]:
    path = DATA_DIR / "descriptions" / f"{dataset}.json"
    if not path.is_file():
        raise ConfigError(
            f"no class descriptions for dataset {dataset!r}; available: {', '.join(description_datasets())}"
        )
    data = json.loads(path.read_text())["descriptions"]
    return {k: tuple(v) for k, v in data.items()}


def description_class_names(dataset: str) -> list[str]:
    """The class names of a dataset that has a description file, in label order."""
    return list(_description_file(dataset))


def _table(dataset: str) -> dict[str, list[str]]:
    return {clean_class_name(k).lower(): list(v) for k, v in _description_file(dataset).items()}


def descriptions(dataset: str, class_names: Sequence[str] | None = None) -> list[list[str]]:
    """The k descriptions of each class (of `class_names`, matched after cleaning; default: all).

    A dataset without its own file (e.g. `cifar100_lt`, `fmnist_domains`) uses the first file
    that describes all of `class_names`."""
    if dataset not in description_datasets() and class_names is not None:
        keys = [clean_class_name(c).lower() for c in class_names]
        for other in description_datasets():
            if all(k in _table(other) for k in keys):
                dataset = other
                break
    table = _table(dataset)
    names = list(class_names) if class_names is not None else list(_description_file(dataset))
    missing = [c for c in names if clean_class_name(c).lower() not in table]
    if missing:
        raise ConfigError(f"data/descriptions/{dataset}.json has no descriptions for: {', '.join(missing)}")
    return [table[clean_class_name(c).lower()] for c in names]


def description_prompts(
    class_names: Sequence[str], descs: Sequence[Sequence[str]], template: str = DESCRIPTION_TEMPLATE
) -> list[list[str]]:
    """FedTSP prompts: per class, `template.format(class, description)` for each description."""
    if len(descs) != len(class_names):
        raise ValueError(f"{len(class_names)} classes but {len(descs)} description lists")
    return [
        [template.format(clean_class_name(c), d.rstrip(".")) for d in ds]
        for c, ds in zip(class_names, descs, strict=True)
    ]


# --- optional: regenerate descriptions from an OpenAI-compatible endpoint --------------
PROMPT = (
    "Give {k} short, visual, factual descriptions of what a photo of a {name} looks like{hint}. "
    "Each at most 15 words, lower case, no trailing period, no class name repeated at the start. "
    "Answer with a JSON list of {k} strings only."
)


def generate_descriptions(
    class_names: Sequence[str],
    base_url: str,
    model: str,
    k: int = 3,
    api_key_env: str = "OPENAI_API_KEY",
    hint: str = "",
    timeout: float = 60.0,
) -> dict[str, list[str]]:
    """Ask `<base_url>/chat/completions` (any OpenAI-compatible server) for k descriptions per
    class. The key is read from the environment variable `api_key_env` (may be unset for local
    servers). Returns {class name: [k descriptions]}."""
    key = os.environ.get(api_key_env, "")
    url = base_url.rstrip("/") + "/chat/completions"
    out: dict[str, list[str]] = {}
    for name in class_names:
        body = {
            "model": model,
            "temperature": 0.2,
            "messages": [
                {
                    "role": "user",
                    "content": PROMPT.format(k=k, name=clean_class_name(name), hint=hint and f" ({hint})"),
                }
            ],
        }
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            reply = json.loads(resp.read().decode())["choices"][0]["message"]["content"]
        match = re.search(r"\[.*\]", reply, re.S)
        items = (
            json.loads(match.group(0)) if match else [ln.strip("-*• ").strip() for ln in reply.splitlines()]
        )
        items = [str(s).strip().rstrip(".") for s in items if str(s).strip()][:k]
        if len(items) < k:
            raise RuntimeError(f"{url}: expected {k} descriptions for {name!r}, got {reply!r}")
        out[name] = items
    return out


def write_descriptions(path: Path, dataset: str, table: dict[str, list[str]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    k = min(len(v) for v in table.values())
    doc = {
        "_comment": "generated by fl_lightning.text.prompts.generate_descriptions",
        "dataset": dataset,
        "k": k,
        "descriptions": table,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fl_lightning.text.prompts")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="regenerate class descriptions from an OpenAI-compatible endpoint")
    g.add_argument(
        "--dataset", required=True, help="a dataset with a description file (its class names are reused)"
    )
    g.add_argument(
        "--base-url", required=True, help="e.g. https://api.openai.com/v1 or http://localhost:8000/v1"
    )
    g.add_argument("--model", required=True)
    g.add_argument("--k", type=int, default=3)
    g.add_argument("--api-key-env", default="OPENAI_API_KEY")
    g.add_argument("--out", type=Path, default=None, help="default: print the JSON")
    args = p.parse_args(argv)
    names = description_class_names(args.dataset)
    table = generate_descriptions(names, args.base_url, args.model, k=args.k, api_key_env=args.api_key_env)
    if args.out:
        print(write_descriptions(args.out, args.dataset, table))
    else:
        json.dump(table, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
