"""What a method is, read from the docstring of its file, which by the project's rule opens
with its paper:

    \"\"\"FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks from
    Decentralized Data", AISTATS 2017, https://arxiv.org/abs/1602.05629.

`about(strategy_cls)` gives the name before the colon, the quoted title, the venue and the
arXiv id, for `fl-lightning list` and the W&B `paper:` tag. A class with a docstring of its
own (a variant in its paper's file, e.g. FedC-Tran in FedLGT's) is described by that.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

_ARXIV = re.compile(r"arxiv\.org/abs/(\d{4}\.\d{4,5})|arXiv:\s*(\d{4}\.\d{4,5})")
_TITLE = re.compile(r"[\"“]([^\"”]{8,})[\"”]")
_VENUE = re.compile(r"[\"”]\s*,\s*([^,()\"]*?\d{4})\b")


@dataclass(frozen=True)
class About:
    name: str  # what the docstring calls the method ("FedAvg"); the registry name if none
    title: str = ""  # its paper's title; "" for a method without one
    venue: str = ""  # "AISTATS 2017", or a year
    arxiv: str = ""  # "1602.05629"
    variant: str = ""  # the class's own one-line description (a variant of the file's method)

    def line(self) -> str:
        """`FedAvg: "Communication-Efficient ..." (AISTATS 2017, arXiv:1602.05629)`."""
        where = ", ".join(p for p in (self.venue, f"arXiv:{self.arxiv}" if self.arxiv else "") if p)
        paper = f'"{self.title}"' + (f" ({where})" if where else "") if self.title else ""
        if self.variant:
            return self.variant + (f"; from {paper}" if paper else "")
        return f"{self.name}: {paper}" if paper else self.name

    def tag(self) -> str | None:
        """The W&B tag naming the paper: `paper:arXiv:<id>`, else `paper:<name> <venue>`."""
        if self.arxiv:
            return f"paper:arXiv:{self.arxiv}"
        if self.title:
            return f"paper:{self.name} {self.venue}".strip()[:64]
        return None


def about(cls: type, registry_name: str = "") -> About:
    """The `About` of a registered strategy class (see the module docstring)."""
    module = sys.modules.get(cls.__module__)
    doc = (getattr(module, "__doc__", None) or "").strip()
    first = " ".join(doc.split("\n\n", 1)[0].split())
    own = cls.__dict__.get("__doc__")
    variant = " ".join((own or "").strip().split("\n\n", 1)[0].split()).rstrip(".")
    head, sep, _ = first.partition(":")
    name = head.strip() if sep and len(head) <= 40 and '"' not in head else ""
    title = _TITLE.search(first)
    venue = _VENUE.search(first)
    arxiv = _ARXIV.search(first)
    if not title:  # no paper: the docstring's first clause says what it is
        name = name or first.split(". ", 1)[0].split(" (", 1)[0]
    return About(
        name=name or registry_name or cls.__name__,
        title=title.group(1).strip() if title else "",
        venue=venue.group(1).strip() if venue else "",
        arxiv=next((g for g in arxiv.groups() if g), "") if arxiv else "",
        variant=variant,
    )
