"""A trained policy and its env, as the commands that use one after training load them (enjoy, eval, export,
import_sf): the experiment's checkpoint of a policy into a model on a device, checked against the experiment's
configuration and the env's spaces, and the env itself (env_index 0). Every user-side problem is a one-line
ConfigError.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from sf.cfg import ConfigError, RunError, experiment_dir
from sf_envs.registry import make_env

if TYPE_CHECKING:
    from sf.cfg.config import Config

# the model and the checkpoint code (torch: 2 s) are imported on the first load: the commands that import this module
# answer --help and bad flags at once.


def check_experiment_dir(cfg: Config) -> Path:
    """The experiment directory of cfg (--train_dir/--experiment); a one-line ConfigError when it is not a directory,
    a RunError when it cannot be read."""
    exp_dir = experiment_dir(cfg)
    try:
        if exp_dir.is_dir():
            return exp_dir
        what = "is not a directory" if os.path.lexists(exp_dir) else "does not exist"  # a file, a dangling link
    except OSError as e:
        raise RunError(f"cannot read {exp_dir}: {e.strerror or e}") from None
    raise ConfigError(f"experiment directory {exp_dir} {what} (check --experiment and --train_dir)")


def load_policy(cfg: Config, obs_space, action_space, device, policy_id: int = 0):
    """(model, checkpoint state): the model of cfg with policy `policy_id`'s requested checkpoint's weights
    (cfg.load_checkpoint_kind), in eval mode on `device`; one-line ConfigError for every user-side problem."""
    from sf.learning.checkpoint import CheckpointError, check_compatible, load_into
    from sf.learning.checkpoint_store import CheckpointManager
    from sf.learning.learner import checkpoint_meta
    from sf.model.actor_critic import create_actor_critic
    exp_dir = check_experiment_dir(cfg)
    model = create_actor_critic(cfg, obs_space, action_space).to(device).eval()
    try:
        ckpt_dir = exp_dir / f"checkpoint_p{policy_id}"
        state = CheckpointManager(exp_dir, policy_id=policy_id, read_only=True).load(  # a live run's files: read only
            cfg.load_checkpoint_kind, map_location=device)
        if state is None:
            raise ConfigError(f"no {cfg.load_checkpoint_kind} checkpoint in {ckpt_dir}; train first")
        check_compatible(state["meta"], checkpoint_meta(cfg, obs_space, action_space, model),
                         state.get("path", ckpt_dir))
        load_into(model, None, state)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    return model, state


def open_env(cfg: Config, render_mode: str | None = None):
    """The experiment's env (env_index 0); a missing package or scenario file is a one-line ConfigError."""
    try:
        return make_env(cfg, env_index=0, render_mode=render_mode)
    except (ImportError, FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
