"""The command that runs a Python tool (`pip` for `fetch fmnist_digits20`, `wandb sync`) in a
child process: `python -I -m <tool>`, isolated, so neither the working directory nor
`PYTHONPATH` nor the user's site folder is on its `sys.path` (a `pip/` or `wandb/` folder lying
where the user runs the command ran in its place). Here, below `data/` and `cli/`, so both can
use it (`cli/spawn.py` starts our own children)."""

from __future__ import annotations

import sys


def tool_command(module: str) -> list[str]:
    """`[python, -I, -m, module]`: append the tool's arguments."""
    return [sys.executable, "-I", "-m", module]
