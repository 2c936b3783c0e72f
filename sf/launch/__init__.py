"""Many train.py runs at once: seed and hyperparameter sweeps (`python -m sf.launch SWEEP`).

    run_description.py  RunDescription / Experiment / ParamGrid / ParamList: Sample Factory 2.1.1's sweep classes
    sweep.py            a sweep file (.py with RUN_DESCRIPTION, or .json) -> its runs, checked by train.py's parser
    state.py            a run's state from its files (checkpoints, events, the backend's launch.json)
    local.py            the local backend: N runs at once, the machine's cores divided between them
    slurm.py            the Slurm backend
    summary.py          --status and --summary tables (final / best reward across seeds)
    __main__.py         the command line

See docs/sweeps.md.
"""
from sf.launch.run_description import Experiment, ParamGrid, ParamList, RunDescription

__all__ = ["Experiment", "ParamGrid", "ParamList", "RunDescription"]
