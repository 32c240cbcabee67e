"""The commands: `fl-lightning` (`main.py`) and the bodies of `sweep`, `partition` and `text`.

The top layer: commands may import anything below them (runtime, config, methods, data,
text, tracking, core); nothing in the package imports `cli`.
"""
