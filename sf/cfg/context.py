"""RunContext: what every process of a run is told about the run when it starts, decided once by the runner.

    run = RunContext(cfg, shape, world, policies, obs_space, action_space, device, exp_dir, frameskip)
    run.cfg.mode      # the mode, resolved once (sf/cfg/mode.py)
    run.shape         # the derived sizes (sf/cfg/shape.py)
    run.world         # torchrun's ranks, read once by the runner (sf/processes/ranks.py)

The learners, the policy workers and the rollout workers each get one (their process entries: run_learner,
run_policy_worker, run_rollout_worker) and work out none of it again. The shared memory (trajectory buffers, queues,
weights, SharedState) travels beside it: handles to what the processes share, not facts about the run.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sf.processes.ranks import World

if TYPE_CHECKING:
    from sf.cfg.config import Config
    from sf.cfg.shape import RunShape


@dataclass(frozen=True)
class RunContext:
    """cfg: the run's configuration (with its mode); shape: its sizes; world: this rank's place; policies: those that
    play here (this rank's; sf.eval: the plan's players); obs_space, action_space: the env's (probed once by the
    runner); device: where the learners and policy workers compute; exp_dir: the experiment directory; frameskip: env
    frames per agent step."""
    cfg: Config
    shape: RunShape
    world: World
    policies: tuple[int, ...]
    obs_space: Any
    action_space: Any
    device: Any  # a torch.device, or its name
    exp_dir: Path
    frameskip: int
