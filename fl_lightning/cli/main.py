"""`fl-lightning run / resume / sweep / compare / list / fetch / config / text / teacher / pretrain`.

User mistakes end with one line on stderr and exit code 2, before any work starts;
failures during a run end with one line and exit code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from pathlib import Path

from ..core.errors import (
    CheckpointError,
    ClientFailure,
    ConfigError,
    DivergedError,
    StartupError,
    StoppedAfterCompletion,
    Terminated,
)

USAGE_EXAMPLE = (
    "fl-lightning run method=fedavg data=fmnist fl.rounds=5 fl.num_clients=10 "
    "data.partition=dirichlet data.alpha=0.3 seed=1 output_dir=runs"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fl-lightning", description="Language-driven heterogeneous FL on Lightning + Ray."
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run an experiment", epilog=f"example: {USAGE_EXAMPLE}")
    run.add_argument("overrides", nargs="*", help="group=name, +experiment=name, or key=value")
    run.add_argument("--quiet", action="store_true", help="no progress bar or table")
    run.add_argument(
        "--from", dest="from_", type=Path, default=None, metavar="RUN",
        help="a new run with the values of RUN's config.yaml (a run directory or the file); "
        "overrides are key=value on top",
    )  # fmt: skip
    res = sub.add_parser("resume", help="continue a run from its last round checkpoint")
    res.add_argument("run_dir", type=Path)
    res.add_argument("overrides", nargs="*", help="fl.rounds=N, runtime.*, logger.*")
    res.add_argument("--quiet", action="store_true")
    sw = sub.add_parser(
        "sweep",
        help="a grid of runs: comma lists become axes (method=fedavg,fedprox seed=0,1,2)",
        epilog="example: fl-lightning sweep method=fedavg seed=0,1,2 fl.rounds=5 experiment=cmp --parallel 2",
    )
    sw.add_argument("overrides", nargs="*", help="key=v1,v2,... (an axis) or key=value (fixed)")
    sw.add_argument(
        "--parallel", type=int, default=1, help="runs at a time, each in its own process (default 1)"
    )
    sw.add_argument("--dry-run", action="store_true", help="print the runs, run nothing")
    sw.add_argument("--no-plots", action="store_true", help="no accuracy-vs-round PNGs at the end")
    sw.add_argument(
        "--resume", default=None, metavar="FOLDER",
        help="continue the sweep recorded in FOLDER (its sweep.json): finished runs are skipped",
    )  # fmt: skip
    rep = sub.add_parser(
        "reproduce",
        help="run a paper's claims grid (conf/reproduce/<paper>.yaml) and write its report",
        epilog="example: fl-lightning reproduce feddtr --scale mini --parallel 2; --list shows the papers",
    )
    rep.add_argument("paper", nargs="?", help="a file of conf/reproduce/ (see --list)")
    rep.add_argument("overrides", nargs="*", help="key=value for every run (runtime=ray, logger=none)")
    rep.add_argument("--scale", default="mini", help="mini (default) | paper")
    rep.add_argument("--seeds", default=None, help="comma-separated seeds (default: the scale's)")
    rep.add_argument("--parallel", type=int, default=1, help="runs at a time, one process each")
    rep.add_argument("--out", default=None, help="folder (default: runs/reproduce/<paper>_<scale>)")
    rep.add_argument("--list", action="store_true", help="the papers, their claims and scales")
    rep.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    rep.add_argument("--report-only", action="store_true", help="write the report from the runs there")
    rep.add_argument(
        "--restart", action="store_true",
        help="move runs made with other settings aside (<out>/set_aside/<time>/) and run them again",
    )  # fmt: skip
    rep.add_argument(
        "--estimate", action="store_true",
        help="time a few steps of each row here and print the projected hours (runs nothing)",
    )  # fmt: skip
    cmp_ = sub.add_parser("compare", help="tables (mean ± std over seeds) and metric-vs-round plots of runs")
    cmp_.add_argument(
        "paths", nargs="+", help="runs folders (searched for run directories) or run directories"
    )
    cmp_.add_argument("--by", default=None, help="group by these comma-separated keys (default: method)")
    cmp_.add_argument(
        "--metric",
        default=None,
        help="per-round metric to compare (default: each run's primary metric, one table per metric)",
    )
    cmp_.add_argument(
        "--out", default=None, help="folder for the plots and compare.json (default: <first path>/compare)"
    )
    cmp_.add_argument("--no-plots", action="store_true")
    cmp_.add_argument(
        "--x", default="round", choices=["round", "time"],
        help="plot against rounds, or against the virtual clock (virtual_time; docs/async.md)",
    )  # fmt: skip
    cmp_.add_argument(
        "--target", type=float, default=None,
        help="also give each row's virtual time to reach this value of the metric, paired by seed",
    )  # fmt: skip
    cmp_.add_argument(
        "--baseline", default=None,
        help="the row the others are paired against by seed (default: fedavg where present, else the first)",
    )  # fmt: skip
    syn = sub.add_parser("sync", help="upload every offline W&B run under a runs folder (needs a W&B key)")
    syn.add_argument("folder", help="an experiment's folder, or any folder of runs")
    cfg = sub.add_parser("config", help="print the composed config without running")
    cfg.add_argument("overrides", nargs="*")
    sub.add_parser("list", help="list registered methods, datasets, models, ...")
    fetch = sub.add_parser("fetch", help="download a dataset into the data root")
    fetch.add_argument("dataset", choices=["fmnist", "fmnist_digits20", "sst2"])
    fetch.add_argument("--root", default=None, help="data root (default: data.root of the config)")
    part = sub.add_parser(
        "partition", help="print and plot the client split a run would use, without training"
    )
    part.add_argument("overrides", nargs="*", help="data=<name> data.partition=<name> fl.num_clients=N ...")
    tch = sub.add_parser("teacher", help="build the aligned teacher of method=clip2fl (cached)")
    tch.add_argument("action", choices=["build"])
    tch.add_argument("overrides", nargs="*", help="the run's overrides, e.g. +experiment=clip2fl_fmnist_lt")
    tch.add_argument("--rebuild", action="store_true", help="train again even if cached")
    pre = sub.add_parser(
        "pretrain",
        help="train a backbone centrally on held-out training images; write a weights file for model.weights",
        epilog="example: fl-lightning pretrain data=fmnist model=cnn --out weights/fmnist_cnn.pt",
    )
    pre.add_argument("overrides", nargs="*", help="data=<name> model=<name> model.<key>=value ...")
    pre.add_argument("--out", default=None, help="the weights file to write")
    pre.add_argument("--holdout-from", type=int, default=55000, help="first training index (default 55000)")
    pre.add_argument("--holdout-size", type=int, default=None, help="images from there (default: to the end)")
    pre.add_argument("--epochs", type=int, default=10)
    pre.add_argument("--lr", type=float, default=0.05)
    pre.add_argument("--batch-size", type=int, default=64)
    pre.add_argument("--seed", type=int, default=0)
    txt = sub.add_parser("text", help="class-text similarity matrix and heatmap (data=fmnist text=minilm)")
    txt.add_argument("overrides", nargs="*", help="data=<name> text=<encoder> text.<key>=value ...")
    txt.add_argument("--templates", default=None, help="simple | small | imagenet80 | a template with {}")
    txt.add_argument("--descriptions", action="store_true", help="per-class descriptions, not templates")
    txt.add_argument("--out", default=None, help="PNG path (default: <output_dir>/text/...png)")
    txt.add_argument(
        "--rsa", action="store_true",
        help="also the rank correlation of text and mean-feature class similarity (loads the data)",
    )  # fmt: skip
    txt.add_argument(
        "--cache-dir", default=None,
        help="default: $FL_LIGHTNING_TEXT_CACHE, else $FL_LIGHTNING_DATA/.cache/text, "
        "else ~/.cache/fl_lightning/text",
    )  # fmt: skip
    return p


def _cmd_fetch(dataset: str, root: str | None) -> None:
    from ..config import compose
    from ..data.fetch import fetch_fmnist
    from ..data.fmnist_digits20 import fetch as fetch_digits20

    root = root or compose([f"data={dataset}"]).data.root
    if dataset == "sst2":  # GLUE's zip (data/glue.py)
        from ..data.glue import fetch_sst2

        Path(root).expanduser().mkdir(parents=True, exist_ok=True)
        fetch_sst2(str(Path(root).expanduser()))
        print(Path(root).expanduser() / "SST-2")
        return
    get = fetch_digits20 if dataset == "fmnist_digits20" else fetch_fmnist
    print(get(root, log=lambda m: print(m, file=sys.stderr)))


def _seeds(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds takes comma-separated integers (got {text!r})") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds takes distinct non-negative integers (got {text!r})")
    return seeds


def _warn(summary: dict) -> None:
    """A finished run that learned nothing says so (summary.json `warning`)."""
    from ..tracking.chance import chance_line

    line = chance_line(summary)
    if line:
        print(f"fl-lightning: warning: {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from ..lean_imports import install

    install()  # before anything imports Lightning: torchmetrics without its optional backends
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    # Overrides may come after flags (`run --quiet fl.rounds=3`): argparse leaves them over.
    if extra and (not hasattr(args, "overrides") or any(e.startswith("-") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if hasattr(args, "quiet"):
        from ..core.progress import env_enabled, set_enabled

        set_enabled(env_enabled() and not args.quiet)  # --quiet: no progress of long steps either
    if args.cmd in ("run", "resume", "sweep", "teacher", "reproduce", "pretrain"):
        from ..runtime.signals import stop_on_sigterm

        stop_on_sigterm()  # SIGTERM: stop like Ctrl-C, resumable (not a dump and a dead run)
    try:
        if args.cmd == "list":
            from .listing import list_command

            return list_command()
        elif args.cmd == "fetch":
            _cmd_fetch(args.dataset, args.root)
        elif args.cmd == "config":
            from ..config import check_method, compose, to_yaml

            cfg = compose(args.overrides)
            check_method(cfg)  # the values `run` refuses are refused here too (it printed them)
            print(to_yaml(cfg), end="")
        elif args.cmd == "run":
            from ..config import check_method, check_weights_file, compose, rerun_config

            t0 = time.perf_counter()  # the run's start-up is measured from here
            # fast: before torch, Ray or data are touched
            cfg = rerun_config(args.from_, args.overrides) if args.from_ else compose(args.overrides)
            from ..data.registry import check_data
            from ..runtime.early import import_driver
            from ..runtime.lock import new_run_path
            from ..runtime.session import Session

            run_dir = new_run_path(cfg)  # bad paths and missing data: one line before any work
            check_data(cfg.data)
            check_weights_file(cfg)
            check_method(cfg)  # the method's keys, values and own `check`: no torch, before Ray
            # a local Ray and its workers start while the driver imports
            with Session() as session, session.early_start(cfg):
                import_driver()  # done already where the run starts early
                from ..runtime.runner import start_run

                summary, _ = start_run(cfg, not args.quiet, run_dir, started_at=t0, session=session)
            if args.quiet:
                metric = summary.get("primary_metric", "accuracy")  # c_ap for multi-label data
                print(f"final_{metric}={summary.get(f'final_{metric}')}")
            _warn(summary)
        elif args.cmd == "sweep":
            from ..runtime.paths import resolve_run_path
            from .sweep import sweep_command

            folder = resolve_run_path(args.resume) if args.resume else None
            return sweep_command(args.overrides, args.parallel, args.dry_run, not args.no_plots, folder)
        elif args.cmd == "reproduce":
            from .reproduce import reproduce_command

            return reproduce_command(
                args.paper, args.scale, _seeds(args.seeds), args.parallel, args.out, args.overrides,
                args.dry_run, args.report_only, args.list, args.restart, args.estimate,
            )  # fmt: skip
        elif args.cmd == "compare":
            from ..runtime.paths import resolve_output_dir, resolve_run_path
            from ..tracking.compare import compare_command

            paths = [str(resolve_run_path(p)) for p in args.paths]  # inside a Ray job: $FL_LIGHTNING_RUNS
            out = str(resolve_output_dir(args.out)) if args.out else None
            return compare_command(
                paths, args.by, args.metric, out, not args.no_plots, args.baseline, args.x, args.target
            )
        elif args.cmd == "sync":
            from ..runtime.paths import resolve_run_path
            from .sync import sync_command

            return sync_command(str(resolve_run_path(args.folder)))
        elif args.cmd == "partition":
            from .partition import partition_command

            return partition_command(args.overrides)
        elif args.cmd == "teacher":
            from .teacher import teacher_command

            return teacher_command(args.action, args.overrides, args.rebuild)
        elif args.cmd == "pretrain":
            from .pretrain import PretrainConfig, pretrain_command

            pc = PretrainConfig(
                holdout_from=args.holdout_from, holdout_size=args.holdout_size, epochs=args.epochs,
                lr=args.lr, batch_size=args.batch_size, seed=args.seed,
            )  # fmt: skip
            return pretrain_command(args.overrides, args.out, pc)
        elif args.cmd == "text":
            from .text import text_command

            return text_command(
                args.overrides, args.templates, args.descriptions, args.out, args.cache_dir, args.rsa
            )
        elif args.cmd == "resume":
            from ..config import load_run_config
            from ..runtime.paths import resolve_run_path

            run_dir = resolve_run_path(args.run_dir)  # what a Ray job printed resolves the same way
            cfg = load_run_config(run_dir, args.overrides)
            from ..runtime.early import import_driver
            from ..runtime.lock import RunLock
            from ..tracking.loggers import check_wandb_dirs

            check_wandb_dirs(cfg.logger, run_dir)  # a link planted at <experiment>/.wandb: one line now

            RunLock(run_dir).acquire().release()  # busy: one line now, not after the imports below
            import_driver()
            from ..runtime.runner import resume_run

            _warn(resume_run(run_dir, cfg, console=not args.quiet))
    except ConfigError as e:
        print(f"fl-lightning: error: {e}", file=sys.stderr)
        return 2
    except DivergedError as e:
        print(
            f"fl-lightning: error: run diverged: {e} "
            "(summary.json says status: diverged; the last finite checkpoint is kept)",
            file=sys.stderr,
        )
        return 1
    except (CheckpointError, ClientFailure, StartupError) as e:
        print(f"fl-lightning: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the disk, not the user: full, or the run directory removed mid-run
        from ..runtime.outcome import os_error_line

        trains = args.cmd in ("run", "resume", "sweep", "reproduce") and not (
            args.cmd == "reproduce" and (args.report_only or args.estimate or args.dry_run)
        )
        print(f"fl-lightning: error: {os_error_line(e, run=trains)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        import signal

        from ..runtime.signals import stop_signal

        by_term = isinstance(e, Terminated) or isinstance(e.__cause__, Terminated)
        sig = stop_signal() or (signal.SIGTERM if by_term else None)
        what, code = (f"terminated ({sig.name})", 128 + sig) if sig else ("interrupted", 130)
        if isinstance(e, StoppedAfterCompletion):  # the run was whole: nothing to continue
            how = f" after run {e.run_dir} completed (summary.json, curves.png written; nothing to resume)"
        else:
            how = _how_to_continue(args)
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            print(f"fl-lightning: {what}{how}", file=sys.stderr)
        return code
    return 0


def _how_to_continue(args: argparse.Namespace) -> str:
    """How the interrupted command goes on: only the commands that leave runs can."""
    if args.cmd in ("run", "resume"):
        return "; continue with `fl-lightning resume <run dir>`"
    if args.cmd == "sweep":
        return "; continue with `fl-lightning sweep --resume <sweep folder>`"
    if args.cmd == "reproduce" and not (args.estimate or args.dry_run or args.list or args.report_only):
        return "; run the same command again: finished runs are kept, interrupted ones resume"
    return ""


def entrypoint() -> None:
    exit_now(main())


def exit_now(code: int | None) -> None:
    """Exit as Python does, less its teardown of every module, which with torch and
    Lightning imported took ~1.1 s of each command (issue 18): non-daemon threads are joined
    and the atexit handlers (W&B, Ray, logging) run first, then the process ends. Our files
    are closed by then (every writer uses `with`)."""
    import atexit
    import contextlib
    import os
    import threading

    for t in threading.enumerate():
        # the run's evaluation thread is done with by now (summary.json is written): one left
        # waiting for work (its run stopped by a signal on the way out) must not hold the exit
        if t is not threading.current_thread() and not t.daemon and not t.name.startswith("fl-eval"):
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe (`| head`) must not turn 0 into a traceback
            stream.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    entrypoint()
