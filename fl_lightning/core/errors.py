"""Errors a user can cause. The CLI prints their message as one line and exits non-zero."""


class ConfigError(ValueError):
    """A configuration that cannot run: unknown key or name, impossible value, missing data.

    Attributes:
        needs: the settings that would let it run, as data (`("data.server_subset=N",)`), for
            what shows them without parsing the message (`fl-lightning list`); empty when the
            refusal names no setting.
    """

    def __init__(self, message: str, needs: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.needs = tuple(needs)  # pickled with the instance's __dict__ (BaseException.__reduce__)


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


class StoppedAfterCompletion(KeyboardInterrupt):
    """A Ctrl-C, SIGTERM or SIGHUP that came once the run had completed (its last round
    written, summary.json `completed`, curves.png drawn): the CLI still exits 128 + the
    signal (130 for Ctrl-C), but says the run is whole and there is nothing to resume."""

    def __init__(self, run_dir: object) -> None:
        super().__init__(str(run_dir))
        self.run_dir = run_dir


class DivergedError(RuntimeError):
    """A non-finite training loss or global model: the run stops, marked `diverged`.

    Attributes:
        record: what is known of the round that diverged (logged to metrics.jsonl).
    """

    def __init__(self, message: str, record: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.record = {**(record or {}), "diverged": True}


def load_refusal(e: BaseException) -> str:
    """Why `torch.load(weights_only=True)` did not load a file, in one line. A file holding
    Python objects is refused with no hint to load it with `weights_only=False`, as torch's
    own message advises: loading it so would run what it holds."""
    import pickle

    text = str(e).strip()
    if isinstance(e, pickle.UnpicklingError) or "weights_only" in text:
        return "refused: it is not a plain weights file (it holds Python objects, which loading would run)"
    first = text.splitlines()[0][:200] if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__
