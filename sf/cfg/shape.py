"""The run's shape: the sizes every process derives from the configuration and the env, computed once (`RunShape.of`,
called by the runner's pre-flight checks once the env's agents per env are known) and handed down.

    envs               num_workers x num_envs_per_worker
    agents_per_env     the env's agents (1 but for multi-agent envs)
    agents             envs x agents_per_env: one trajectory stream each
    agents_per_worker  num_envs_per_worker x agents_per_env: a rollout worker's rows of the env-slot table
    envs_per_group     num_envs_per_worker / worker_num_splits: the envs a rollout worker steps at once (one group of
                       its double-buffered sampling)
    agents_per_group   envs_per_group x agents_per_env: the rows of one inference request
    groups             num_workers x worker_num_splits: the groups that ask the policy workers for actions (a policy
                       worker's request streams)
    trajs_per_batch    trajectories of one training batch: async, batch_size x num_batches_per_epoch / rollout;
                       hts/ppo, one rollout of every agent (HTS-RL)
    samples_per_batch  trajs_per_batch x rollout
    slots              trajectory slots allocated: async, --num_traj_buffers or agents + two batches of every policy
                       (each learner holds up to two); hts/ppo, two storages of one slot per agent; sf.eval, one per
                       agent that plays
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from sf.utils.errors import ConfigError

if TYPE_CHECKING:
    from sf.cfg.config import Config


def num_envs(cfg: Config) -> int:
    """num_workers x num_envs_per_worker: the envs of the run (also before the env is known, for the checks of
    sf/cfg/validate.py)."""
    return cfg.num_workers * cfg.num_envs_per_worker


@dataclasses.dataclass(frozen=True)
class RunShape:
    envs: int
    agents_per_env: int
    agents: int
    agents_per_worker: int
    envs_per_group: int
    agents_per_group: int
    groups: int
    trajs_per_batch: int
    samples_per_batch: int
    slots: int

    @classmethod
    def of(cls, cfg: Config, agents_per_env: int) -> "RunShape":
        """The shape of a run of `cfg` on an env of `agents_per_env` agents. Refuses (ConfigError, one line) a layout
        where a policy would never play or the slots cannot hold what is in flight."""
        envs = num_envs(cfg)
        agents = envs * agents_per_env
        if cfg.policy_mapping == "fixed" and cfg.num_policies > agents:
            raise ConfigError(f"--policy_mapping fixed: {cfg.num_policies} policies but {agents} agents "
                              f"(num_workers x num_envs_per_worker x {agents_per_env} agents per env): policies "
                              f"{agents}-{cfg.num_policies - 1} would never play; use more envs or --policy_mapping "
                              "random")
        if cfg.mode.intervals:  # two storages of one slot per agent (HTS-RL); --num_traj_buffers does not apply
            trajs_per_batch, slots = agents, 2 * agents
        else:
            trajs_per_batch = cfg.batch_size * cfg.num_batches_per_epoch // cfg.rollout
            batches = cfg.num_policies * trajs_per_batch
            slots = cfg.num_traj_buffers or agents + 2 * batches
            if slots < agents + batches:
                raise ConfigError(f"--num_traj_buffers {slots} is too small: need at least num_workers*"
                                  f"num_envs_per_worker*agents_per_env + num_policies*batch_size*num_batches_per_epoch"
                                  f"/rollout = {agents + batches}")
        return cls(**_layout(cfg, agents_per_env), trajs_per_batch=trajs_per_batch,
                   samples_per_batch=trajs_per_batch * cfg.rollout, slots=slots)

    @classmethod
    def of_evaluation(cls, cfg: Config, agents_per_env: int, slots: int) -> "RunShape":
        """The shape of an evaluation (sf.eval): no learner, so no training batch; `slots`, one per agent that plays
        (sf/sampling/evaluation.py)."""
        return cls(**_layout(cfg, agents_per_env), trajs_per_batch=0, samples_per_batch=0, slots=slots)


def _layout(cfg: Config, agents_per_env: int) -> dict[str, int]:
    """The sizes of the workers' layout (every field of RunShape but the training batch's and the slots)."""
    envs_per_group = cfg.num_envs_per_worker // cfg.worker_num_splits
    return dict(envs=num_envs(cfg), agents_per_env=agents_per_env, agents=num_envs(cfg) * agents_per_env,
                agents_per_worker=cfg.num_envs_per_worker * agents_per_env, envs_per_group=envs_per_group,
                agents_per_group=envs_per_group * agents_per_env, groups=cfg.num_workers * cfg.worker_num_splits)
