"""Configuration, in four parts:

- `composition`: `conf/` and the command line into one tree (groups, presets, a method's own
  defaults, overrides), every key checked against the schema; one-line errors. No torch.
- `schema`: the typed `RootConfig`, one dataclass per section, each with its own `check()`,
  and the checks across sections in one place (`cross_check`).
- `registered`: the checks against the registries (the method's config and its own checks,
  models, datasets, text encoders) and the typed config the rest of the package reads.
- `saved`: a run's config.yaml read back (resume, `run --from`) and the consent rule.

Everything below is importable from `fl_lightning.config`.
"""

from .composition import (
    GROUPS,
    METHOD_DEFAULT_BLOCKS,
    SAFE_NAME,
    VARIANT,
    Composed,
    _group_file,
    check_bools,
    check_names,
    choices,
    compose,
    conf_dir,
    method_defaults,
    method_group_defaults,
    method_modules,
    sections,
    validate,
)
from .registered import (
    check_kwargs,
    check_method,
    check_weights_file,
    method_config,
    resolved_config,
    to_yaml,
    tree,
    typed,
    validate_registered,
    with_method_defaults,
)
from .saved import (
    MACHINE_CHOICES,
    RESUMABLE,
    load_run_config,
    require_consent,
    rerun_config,
    resumable_keys,
)
from .schema import (
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

__all__ = [
    "GROUPS",
    "MACHINE_CHOICES",
    "METHOD_DEFAULT_BLOCKS",
    "RESUMABLE",
    "SAFE_NAME",
    "VARIANT",
    "CheckpointConfig",
    "Composed",
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
    "method_config",
    "method_defaults",
    "method_group_defaults",
    "method_modules",
    "participation",
    "require_consent",
    "rerun_config",
    "resolved_config",
    "resumable_keys",
    "sections",
    "to_yaml",
    "tree",
    "typed",
    "validate",
    "validate_registered",
    "variant_of",
    "with_method_defaults",
]
