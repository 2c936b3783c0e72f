"""train.py's body (`run_training`): the checks, the experiment's lock, the experiment directory, the run."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sf.cfg import RunError, save_cfg
from sf.processes import ranks
from sf.runner import tracking
from sf.runner.runner import Runner
from sf.runner.startup.experiment_lock import ExperimentLock
from sf.runner.startup.preflight import (already_trained, data_parallel_world, follow_rank0, nothing_to_train,
                                         prepare_experiment_dir, remove_leftovers, report_background_errors,
                                         setup_logging, telling_other_ranks)

if TYPE_CHECKING:
    from sf.cfg.config import Config


def run_training(cfg: Config) -> int:
    """train.py's body. Every check runs first (the env, the model, the checkpoint to resume, memory); then the
    experiment's lock is taken (another run of it: refused); only then is anything on disk touched: the experiment
    directory, config.json (atomically), the log, the run. A resumed experiment whose budget is reached already
    touches nothing at all."""
    early = setup_logging()  # the checks' warnings reach the console now and the log file once it exists
    report_background_errors()
    cfg, world = data_parallel_world(cfg)
    tracking.check(cfg)  # --with_wandb: wandb imports
    remove_leftovers()  # what killed runs left in /dev/shm (before the runner's memory check)
    if world.rank > 0:  # the experiment directory is rank 0's (a population: this rank's checkpoints; no log file)
        runner = Runner(cfg, world)
        logging.getLogger().removeHandler(early)
        code = follow_rank0(cfg, world, runner.resumed, runner.exp_dir)  # (its own files, else rank 0's verdict)
        return runner.run() if code is None else code
    with telling_other_ranks(world, cfg.distributed_timeout_sec):  # (whether the run starts; why not, if it fails)
        runner = Runner(cfg, world)
        # One run per experiment (sf/runner/startup/experiment_lock.py): taken before anything of it is moved, deleted
        # or written, held until the run and its learners end; a second runner is refused in one line (exit code 2)
        runner.lock = ExperimentLock.acquire(cfg.train_dir, cfg.experiment)
        try:
            # (the checkpoints were read before the lock: a run that ended since only trained more)
            if already_trained(cfg, runner.resumed, world):
                return nothing_to_train(cfg, runner.resumed, world, runner.exp_dir)
            exp_dir = prepare_experiment_dir(cfg)
            save_cfg(cfg, exp_dir)
            try:
                setup_logging(exp_dir, early)
            except OSError as e:
                raise RunError(f"cannot write the log {exp_dir / 'sf_log.txt'}: {e.strerror or e}") from None
            ranks.publish_start(world, timeout_sec=cfg.distributed_timeout_sec)
            return runner.run()
        finally:  # (a process of the run that could not be killed still holds it: its file stays, locked)
            runner.lock.release(remove=not any(p.is_alive() for p in getattr(runner, "procs", {}).values()))
