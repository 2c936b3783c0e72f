"""The run's console lines, written by the runner (`runner`: a Runner, sf/runner/runner.py, whose state they read):
the layout and mode at the start (log_layout), the report line every --report_interval_sec (log_progress), the Done
line at the end (log_done)."""
from __future__ import annotations

import logging
import time

from sf.processes.shared_state import VERSION
from sf.runner.health.stopping import checkpoint_note
from sf.runner.stats import format_duration, progress_bar

log = logging.getLogger("sf")


def log_layout(runner) -> None:
    """The run's first lines: the notes of the configuration, the experiment, the population, the mode."""
    cfg, P = runner.cfg, runner.num_policies
    for note in cfg._notes:
        log.info("%s", note)
    log.info("Experiment %s: env %s, device %s, %d rollout workers x %d envs, %d trajectory slots (%.0f MiB), "
             "seed %d", runner.exp_dir, cfg.env, runner.device, cfg.num_workers, cfg.num_envs_per_worker,
             runner.shape.slots, runner.buffer_bytes / 2**20, cfg.seed)
    playing = runner.shape.agents  # agents in all, playing at once
    if P > 1 or runner.shape.agents_per_env > 1:
        log.info("Population: %d policies (%s), %d agents per env (%d agents in all), policy mapping %s%s", P,
                 "population-based training" + (", resumed" if runner.population and runner.population.resumed else "")
                 if cfg.with_pbt else "independent", runner.shape.agents_per_env, playing, cfg.policy_mapping,
                 f" (new draw every {cfg.policy_resample_episodes} episodes of an env)"
                 if cfg.policy_mapping != "fixed" and P > 1 else "")
    here = len(runner.policies)  # (a population under torchrun: this rank's; its agents play only them)
    if here > playing:  # (--policy_mapping fixed is refused in preflight then)
        log.warning("Population: %d policies but %d agent(s) play at once: the others wait for a draw (each "
                    "rollout worker draws every policy once per %d draws, a draw every %d episodes of an env), "
                    "and the run ends when every policy has trained --train_for_env_steps", here, playing, here,
                    cfg.policy_resample_episodes)
    mode = cfg.mode.line.format(batch=runner.shape.samples_per_batch,
                                steps=cfg.mode.minibatches(cfg, runner.shape) * cfg.num_epochs)
    log.info("Mode: %s", mode)
    if runner.stats.enabled:
        runner.stats.writer.add_text("config/mode", mode)


def log_progress(runner, start: float) -> None:
    """The report line, with a progress bar and ETA toward whichever budget is closer to its end."""
    first = runner.stats.start_frames // runner.num_policies  # a resumed run counts from where it started
    log.info("%s%s", runner.stats.report_line(), progress_bar(runner.trained_frames() - first,
                                                            runner.cfg.train_for_env_steps - first,
                                                            time.time() - start, runner.cfg.train_for_seconds))
    if runner.data_parallel and runner.world.rank == 0:
        now, collected = time.time(), float(runner.state.world_frames[1])
        then, before = runner.world_report
        log.info("All %d ranks: %d env frames collected (%.1f frames/s), %d trained", runner.world.world_size,
                 collected, (collected - before) / max(now - then, 1e-9), runner.trained_frames())
        runner.world_report = (now, collected)


def log_done(runner, start: float) -> None:
    """The last line: the experiment's counters (a learner that never started leaves its checkpoint's), this run's
    time and rate, and the checkpoints on disk as they are (checkpoint_note: final, or the last one kept, or
    none)."""
    frames = sum(max(now, before) for now, (_, before) in zip(runner.state.policy_env_steps(), runner.resumed))
    versions = [max(p.version, int(runner.state.learner[i, VERSION])) for i, p in enumerate(runner.stats.policies)]
    wall = time.time() - start
    rate = (frames - runner.stats.start_frames) / max(wall, 1e-9)
    board = f"TensorBoard: tensorboard --logdir {runner.exp_dir.parent}"
    skipped = runner.stats.skipped_note()
    saved = (f"{checkpoint_note(runner.exp_dir, runner.policies, runner.reports.final_checkpoints)}; {board}"
             if runner.world.rank == 0 or not runner.data_parallel else "(rank 0 writes the checkpoints)")
    if runner.data_parallel:
        log.info("Done (rank %d of %d): %d env frames in %s (%.0f frames/s), policy version %d (%s); all ranks: %d "
                 "env frames trained. %s", runner.world.rank, runner.world.world_size, frames, format_duration(wall),
                 rate, versions[0], skipped, max(runner.trained_frames(), runner.world.world_size * frames), saved)
    elif runner.num_policies == 1:
        log.info("Done: %d env frames in %s (%.0f frames/s), policy version %d (%s). %s", frames,
                 format_duration(wall), rate, versions[0], skipped, saved)
    else:  # (a population under torchrun: this rank's policies, in its own experiment directory)
        world = runner.world
        here = (f"rank {world.rank} of {world.world_size}: policies {', '.join(map(str, runner.policies))}"
                if world.distributed else "all policies")
        log.info("Done: %d env frames (%s) in %s (%.0f frames/s), policy versions %s (%s). %s", frames, here,
                 format_duration(wall), rate, ", ".join(str(versions[p]) for p in runner.policies), skipped, saved)
