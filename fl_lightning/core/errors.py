"""Errors a user can cause. The CLI prints their message as one line and exits non-zero."""


class ConfigError(ValueError):
    """A configuration that cannot run: unknown key or name, impossible value, missing data."""


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt, or from another run."""


class ClientFailure(RuntimeError):
    """More clients failed in a round than `fl.max_client_failures` allows."""


class StartupError(RuntimeError):
    """Ray could not be started or joined (an overloaded machine, an unreachable cluster)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, `ray job stop`, a scheduler's pre-emption) or SIGHUP (its terminal
    closed): the run stops as on Ctrl-C, marked `interrupted` and resumable; the CLI exits
    128 + the signal (SIGTERM: 143, SIGHUP: 129)."""


class DivergedError(RuntimeError):
    """A non-finite training loss or global model: the run stops, marked `diverged`.

    Attributes:
        record: what is known of the round that diverged (logged to metrics.jsonl).
    """

    def __init__(self, message: str, record: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.record = {**(record or {}), "diverged": True}
