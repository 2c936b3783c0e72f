"""`python -m sf.launch SWEEP [--backend local|slurm] [--max_parallel N] [--dry_run] [--status] [--summary] [--cancel]
[--train_dir DIR] [Slurm options]`: run a sweep's train.py runs, or show where they stand (docs/sweeps.md).

Bad input (a missing sweep file, a run whose arguments train.py refuses, a bad --max_parallel) is one line on stderr
and exit code 2, before anything starts. Exit codes of a launch: 0 every run done, 1 a run failed, 130 stopped by
Ctrl-C / SIGTERM.
"""
from __future__ import annotations

import argparse
import sys

from sf.cfg import OneLineArgumentParser, run_guarded
from sf.launch import local, slurm, summary
from sf.launch.state import LAUNCH_DIR, record_runs
from sf.launch.sweep import DEFAULT_TRAIN_DIR, SweepError, load_sweep

PROG = "python -m sf.launch"
MAX_PARALLEL_LIMIT = 1024


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog=PROG, allow_abbrev=False,
                                   description="Run a sweep of train.py experiments (seeds, hyperparameter grids): "
                                               "several at once on this machine's cores, or as Slurm jobs.")
    parser.add_argument("sweep", metavar="SWEEP",
                        help="a .py file defining RUN_DESCRIPTION = RunDescription(...) (Sample Factory's format), "
                             "a .json sweep file, or a dotted module name (see docs/sweeps.md)")
    parser.add_argument("--backend", default="local", choices=("local", "slurm"),
                        help="local: processes on this machine; slurm: one job per run (default: local)")
    parser.add_argument("--max_parallel", default=None, metavar="N",
                        help="runs at once (local default: one per two cores of this process's affinity)")
    parser.add_argument("--dry_run", action="store_true", help="print the commands (with their cores); start nothing")
    parser.add_argument("--status", action="store_true",
                        help="a table of each run's state (pending, running with frames and reward, done, failed)")
    parser.add_argument("--summary", action="store_true",
                        help="a table per configuration across seeds: final and best reward (mean, std, 95%% "
                             "t-interval, n), frames, wall time")
    parser.add_argument("--cancel", action="store_true",
                        help="stop the sweep's runs (local: its launcher, which stops them with final checkpoints)")
    parser.add_argument("--train_dir", default=None,
                        help=f"root of the sweep's directory <train_dir>/<sweep name> (default: {DEFAULT_TRAIN_DIR})")
    slurm.add_arguments(parser)
    return parser


def max_parallel_value(text) -> int | None:
    if text is None:
        return None
    try:
        n = int(str(text), 10)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PARALLEL_LIMIT:
        raise SweepError(f"--max_parallel {text!r}: must be an integer from 1 to {MAX_PARALLEL_LIMIT}")
    return n


def run(args: argparse.Namespace) -> int:
    args.max_parallel = max_parallel_value(args.max_parallel)
    if args.cancel and (args.status or args.summary or args.dry_run):
        raise SweepError("--cancel goes alone (not with --status, --summary or --dry_run)")
    sweep = load_sweep(args.sweep, args.train_dir)
    on_slurm = (sweep.train_dir / LAUNCH_DIR / slurm.SLURM_JSON).exists()
    if args.cancel:
        return slurm.cancel(sweep, args) if on_slurm else local.cancel(sweep)
    if args.status or args.summary:
        rc = 0
        if args.status:
            if on_slurm:
                rc = slurm.status(sweep, args)
            else:
                print(summary.status_table(sweep))
        if args.summary:
            print(summary.summary_table(sweep))
        return rc
    if args.backend == "slurm":  # records the runs itself, once its options and Slurm are checked
        return slurm.launch(sweep, args)
    if not args.dry_run:
        record_runs(sweep)
    n = args.max_parallel or local.default_max_parallel(len(local.available_cores()))
    return local.launch(sweep, n, dry_run=args.dry_run)


def main(argv=None) -> int:
    def body() -> int:
        return run(build_parser().parse_args(argv))

    return run_guarded(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
