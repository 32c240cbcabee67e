"""The command that starts `fl-lightning` in a child process (a `--parallel` sweep's runs,
`reproduce`'s runs and prepare steps).

`python -m fl_lightning` puts the working directory first on `sys.path`: a `yaml.py` (or
`torch.py`, ...) lying where the user runs the command would be imported by each child in
place of the real one. The child therefore starts with `-P` (Python 3.11+: no working
directory, no script folder on `sys.path`); before 3.11 it removes that entry itself before
importing anything of ours. The console script and Ray's workers never add it.

A tool that needs none of our code (`pip` for `fetch fmnist_digits20`, `wandb sync`) runs as
`python -I -m <tool>` (`core/tools.py`'s `tool_command`, re-exported here): isolated, so
neither the working directory nor `PYTHONPATH` nor the user's site folder is on its `sys.path`.
"""

from __future__ import annotations

import sys

from ..core.tools import tool_command

__all__ = ["fl_lightning_command", "tool_command"]

# Python 3.10: `-c` puts "" (the working directory) first on sys.path; drop it, then run the
# package as `-m` would
_NO_CWD = "import sys, runpy; del sys.path[0]; runpy.run_module('fl_lightning', run_name='__main__')"


def fl_lightning_command() -> list[str]:
    """`[python, ..., ]`: append the subcommand and its arguments (`run`, overrides...)."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "fl_lightning"]
    return [sys.executable, "-c", _NO_CWD]
