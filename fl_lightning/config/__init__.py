"""Configuration, in five parts:

- `composition`: `conf/` and the command line into one tree (groups, presets, a method's own
  defaults, overrides), every key checked against the schema; one-line errors. No torch.
- `schema`: the typed `RootConfig`, one dataclass per section, each with its own `check()`,
  and the checks across sections in one place (`cross_check`); defined in
  `core/run_config.py`, below the methods and datasets that read it, and re-exported here.
- `typed`: the tree turned into the typed `RootConfig` (`compose` does both), the only form of
  a config that leaves this package, and its plain forms (`tree`, `to_yaml`).
- `registered`: the typed config's checks against the registries (the method's own checks,
  models, datasets, text encoders) and the config as a run records it (`resolved_config`).
- `saved`: a run's config.yaml read back, typed (resume, `run --from`), and the consent rule.

OmegaConf stays inside: the rest of the package reads and passes `RootConfig`.
Everything below is importable from `fl_lightning.config`.
"""

from ..core.run_config import (
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    FLConfig,
    LoggerConfig,
    RootConfig,
    RuntimeConfig,
    client_tests,
    clients_per_round,
    cross_check,
    participation,
    variant_of,
)
from .composition import (
    GROUPS,
    METHOD_DEFAULT_BLOCKS,
    SAFE_NAME,
    VARIANT,
    _group_file,
    check_bools,
    check_names,
    choices,
    conf_dir,
    method_defaults,
    method_group_defaults,
    method_modules,
)
from .registered import (
    check_kwargs,
    check_method,
    check_weights_file,
    resolved_config,
    validate_registered,
)
from .saved import (
    MACHINE_CHOICES,
    RESUMABLE,
    load_run_config,
    require_consent,
    rerun_config,
    resumable_keys,
)
from .typed import compose, to_yaml, tree

__all__ = [
    "GROUPS",
    "MACHINE_CHOICES",
    "METHOD_DEFAULT_BLOCKS",
    "RESUMABLE",
    "SAFE_NAME",
    "VARIANT",
    "CheckpointConfig",
    "DataConfig",
    "EvalConfig",
    "FLConfig",
    "LoggerConfig",
    "RootConfig",
    "RuntimeConfig",
    "_group_file",
    "check_bools",
    "check_kwargs",
    "check_method",
    "check_names",
    "check_weights_file",
    "choices",
    "client_tests",
    "clients_per_round",
    "compose",
    "conf_dir",
    "cross_check",
    "load_run_config",
    "method_defaults",
    "method_group_defaults",
    "method_modules",
    "participation",
    "require_consent",
    "rerun_config",
    "resolved_config",
    "resumable_keys",
    "to_yaml",
    "tree",
    "validate_registered",
    "variant_of",
]
