"""Errors a user can cause. The CLI prints their message as one line and exits non-zero."""


class ConfigError(ValueError):
    """A configuration that cannot run: unknown key or name, impossible value, missing data."""


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt, or from another run."""


class ClientFailure(RuntimeError):
    """More clients failed in a round than `fl.max_client_failures` allows."""
