"""The run's mode: what --sync_mode (and sf.eval, and --serial_mode) mean for every stage, resolved once from the
configuration (`cfg.mode`, a RunMode) and read as named properties; no other module compares --sync_mode's string.

    MODES            --sync_mode's choices: the table below, the one place a mode is defined
    RunMode.of(cfg)  the mode of a configuration: MODES[cfg.sync_mode], or EVALUATION for sf.eval (cfg._eval_plan),
                     with the run's own switches (--serial_mode, --max_restarts_per_hour) applied

What each stage reads (the stage's own strategy is picked by these, in its own module):
    learner         schedule (sf/learning/batch_schedule.py SCHEDULES), intervals, minibatches(), lag_bounded
    rollout worker  intervals: HTS-RL's fixed slots (SyncTrainingSink) or the free list (TrainingSink)
    policy worker   deterministic: fixed-size chunks, each agent's own action noise, float32; paced
    runner          frees_slots (the free list filled, audited at the end), heals, serial, distributable, line

Adding a mode: one entry in MODES (its name becomes a --sync_mode choice), and, if no schedule there fits it, a
schedule class in SCHEDULES (docs/architecture.md, "Adding a mode").
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from sf.utils.errors import ConfigError

Config = Any  # (a Config: sf/cfg/config.py imports this module, so this one names it only in words)


@dataclasses.dataclass(frozen=True)
class RunMode:
    name: str  # --sync_mode's value, or "eval" (sf.eval)
    # the learner's batch schedule (a key of sf/learning/batch_schedule.py's SCHEDULES); None: no learner (sf.eval)
    schedule: Optional[str]
    # HTS-RL's intervals: a training batch is one --rollout of every agent, held in two fixed storages of one slot per
    # agent (no free list); the policy lag is fixed by the schedule, so --max_policy_lag does not apply. False: any free
    # slot, batches of --batch_size x --num_batches_per_epoch samples as trajectories come
    intervals: bool
    # bit for bit: the policy workers run the model on fixed-size chunks (--sync_inference_chunk), draw each agent's
    # action noise from its own stream, in float32, with deterministic kernels, and wait for no fuller batch
    deterministic: bool
    # the policy workers pause while the learner holds --num_batches_to_accumulate batches (collection paced by it)
    paced: bool
    # runs under torchrun (several ranks)
    distributable: bool
    # the console's and TensorBoard's line ({batch}: samples per training batch, {steps}: SGD steps per batch)
    line: str
    serial: bool = False  # --serial_mode: every component in the runner's own process
    # a dead process is replaced (--max_restarts_per_hour > 0; never in HTS-RL's intervals, whose runs repeat bit for
    # bit, nor in serial mode, one process)
    heals: bool = False

    @classmethod
    def of(cls, cfg: Config) -> "RunMode":
        if cfg._eval_plan is None and cfg.sync_mode not in MODES:
            raise ConfigError(f"--sync_mode {cfg.sync_mode!r}: choose among {', '.join(MODES)}")
        base = EVALUATION if cfg._eval_plan is not None else MODES[cfg.sync_mode]
        heals = not base.intervals and cfg.max_restarts_per_hour > 0 and not cfg.serial_mode
        return dataclasses.replace(base, serial=bool(cfg.serial_mode), heals=heals)

    @property
    def frees_slots(self) -> bool:
        """Slots go back to a free list once the learner copied them out (and are audited at the end)."""
        return not self.intervals

    @property
    def lag_bounded(self) -> bool:
        """Samples older than --max_policy_lag SGD steps are masked out of the loss."""
        return not self.intervals

    def minibatches(self, cfg: Config, shape: Any = None) -> int:
        """SGD steps per epoch. Intervals: one per --batch_size samples of the training batch (one --rollout of every
        agent of every env: a RunShape's samples_per_batch, not imported here: sf/cfg/shape.py reads Config; None: a
        single-agent env's); a --batch_size at least that large makes it one step on the whole batch. Else
        --num_batches_per_epoch."""
        if not self.intervals:
            return int(cfg.num_batches_per_epoch)
        envs = cfg.num_workers * cfg.num_envs_per_worker
        samples = shape.samples_per_batch if shape is not None else envs * cfg.rollout
        return max(1, samples // cfg.batch_size)


MODES = {m.name: m for m in [
    RunMode("async", schedule="async", intervals=False, deterministic=False, paced=True, distributable=True,
            line="async (asynchronous APPO: policy lag varies, samples older than --max_policy_lag are masked)"),
    RunMode("hts", schedule="hts", intervals=True, deterministic=True, paced=False, distributable=False,
            line="hts (HTS-RL batch-synchronous: training batches of {batch} samples, one rollout of every env, "
                 "{steps} SGD steps each; policy lag exactly 1 batch after the first; same seed and config => same "
                 "weights)"),
    RunMode("ppo", schedule="ppo", intervals=True, deterministic=True, paced=False, distributable=False,
            line="ppo (synchronous PPO: collect {batch} samples, one rollout of every env, then {steps} SGD steps; "
                 "policy lag 0 batches; same seed and config => same weights)"),
]}

# sf.eval: no learner; the policy workers act as in the deterministic modes (each env's own noise, fixed chunks), so
# that an episode does not depend on which others share its batch; any free slot (the evaluation sink's)
EVALUATION = RunMode("eval", schedule=None, intervals=False, deterministic=True, paced=False, distributable=False,
                     line="eval (sf.eval: the plan's episodes, no training)")
