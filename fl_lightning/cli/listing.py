"""`fl-lightning list`: one line per method (its paper, what it needs beyond the defaults),
per dataset (labels, classes, whether its files are there) and per model, then the config
groups and presets.

A method's needs are read off the code, not written twice: a personalised method needs each
client's own test split; a method whose `check` refuses single-label (or multi-label)
data needs the other kind; a method that refuses its own default config shows the settings
its refusal carries (`ConfigError.needs`: data, never parsed out of the message), or the
refusal's first clause where it carries none; the groups its file picks (`defaults: {model:
..., text: ...}`) are shown.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import ConfigError


def method_needs(name: str) -> list[str]:
    """What method `name` needs beyond `fl-lightning run method=<name>`'s defaults."""
    from ..config import check_method, compose, method_group_defaults

    needs: list[str] = []
    try:
        method_cfg = compose([f"method={name}"]).method
    except ConfigError as e:
        return [*needs, f"(its config does not compose: {e})"]
    if method_cfg.keeps_personal_models():  # at its defaults (FedTSP: unless share_weights)
        needs.append("clients' own test splits (data.client_test_fraction > 0)")
    refused: dict[bool, ConfigError] = {}
    split = "data.client_test_fraction=0.25"  # named above: not what the labels probe asks
    for multilabel, data in ((False, "data=fmnist"), (True, "data=fmnist_multilabel")):
        try:
            check_method(compose([f"method={name}", data, split]))
        except ConfigError as e:
            refused[multilabel] = e
    if len(refused) == 1:
        needs.append("single-label data" if True in refused else "multi-label data")
    elif refused:
        why = refused[False]
        needs.append(", ".join(why.needs) if why.needs else str(why).split(";")[0])
    picks = method_group_defaults(name)
    if picks:
        needs.append("defaults " + " ".join(f"{g}={v}" for g, v in picks.items()))
    return needs


def _dataset_line(name: str, entry: Any, root: str) -> str:
    labels = "multi-label" if entry.multilabel else "single-label"
    classes = f", {len(entry.class_names)} classes" if entry.class_names else ""
    domains = f", {len(entry.domains)} domains" if entry.domains else ""
    standin = f", offline stand-in for {entry.standin}" if entry.standin else ""
    try:
        here = "present" if entry.present(root) else ("not fetched" if entry.download else "not found")
    except OSError:
        here = "not found"
    return f"  {name.ljust(18)} {labels}{classes}{domains}{standin}; {here}"


def _model_line(name: str, builder: Any) -> str:
    members = getattr(builder, "members", None)
    if members:
        each = " / ".join(members)
        return f"  {name.ljust(18)} heterogeneous family: client i gets {each} (i mod {len(members)})"
    import inspect
    import sys

    doc = _first_sentence(getattr(builder, "__doc__", None))
    params = inspect.signature(builder).parameters
    if not doc or any(doc.startswith(f"`{p}`") for p in params):  # a note on an argument, not a description
        doc = _first_sentence(getattr(sys.modules.get(builder.__module__), "__doc__", None))
    return f"  {name.ljust(18)} {doc}".rstrip()


def _first_sentence(doc: str | None) -> str:
    text = " ".join((doc or "").strip().split("\n\n", 1)[0].split())
    return text.split(". ", 1)[0].rstrip(".")


def list_command() -> int:
    from ..config import GROUPS, _group_file, choices, compose
    from ..core.about import about
    from ..data.partition import PARTITIONERS
    from ..data.registry import DATASETS
    from ..methods import METHODS
    from ..models import MODELS

    print("methods (method=<name>; its paper; [what it needs beyond the defaults]):")
    for name in METHODS.names():
        needs = method_needs(name)
        print(
            f"  {name.ljust(11)} {about(METHODS.get(name), name).line()}"
            + (f"  [{'; '.join(needs)}]" if needs else "")
        )
    root = str(compose([]).data.root)
    print(f"datasets (data=<name>; files under data.root = {root}):")
    for name in DATASETS.names():
        print(_dataset_line(name, DATASETS.get(name), root))
    print("models (model=<name>):")
    for name in choices("model"):  # a file may preset a registered model (ctran_tiles: ctran, trunk=tiles)
        print(_model_line(name, MODELS.get(str(_group_file("model", name)["name"]))))
    print("partitions:  " + ", ".join(PARTITIONERS.names()))
    for g in GROUPS:
        if g not in ("method", "data", "model"):
            print(f"conf/{g}/".ljust(13) + ", ".join(choices(g)))
    print(
        "experiments: "
        + (", ".join(choices("experiment")) or "(none)")
        + "  (apply one with +experiment=<name>)"
    )
    return 0
