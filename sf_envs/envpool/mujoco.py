"""MuJoCo on EnvPool (--env_engine envpool): one pool of --env_agents envs of one task, stepped in EnvPool's C++ thread,
which the rollout worker sees as one env of that many agents (the multi-agent contract of docs/architecture.md).

The same task as the native engine (sf_envs/mujoco: gymnasium's v4 envs; Pusher v5): EnvPool's defaults for these
ids are gymnasium's (time limit 1000 steps, Reacher 50, reset noise, reward weights, healthy ranges), and the policy's
sample is stepped as it is, the actuators clamping it and the control cost charged for it, as on the native engine.
Observations {"obs": float32 [D]} (EnvPool's float64); actions Box float32 [A] with the env's bounds. An episode's end
is reset at once (`reset(env_ids)`), so the observation returned with its done is the next episode's first; a time
limit's last observation goes in info["final_obs"] for the learner's bootstrap. info["episode"] holds the return and
the length (frameskip 1).

Not here: rendering. EnvPool 1.2.5 draws MuJoCo frames only inside an OpenGL context it does not create, and without
one MuJoCo aborts the whole process; a policy trained on either engine plays on the other, so videos are made with
--env_engine native.
"""
from __future__ import annotations

from typing import Optional

import gymnasium as gym
import numpy as np

from sf_envs.envpool.pool import ENVPOOL_VERSION, check_envpool, pool_seed
from sf_envs.episode_stats import episode_report
from sf_envs.errors import EnvUnavailableError
from sf_envs.mujoco.envs import MUJOCO_ENVS
from sf_envs.params import get_param


def check_envpool_mujoco(name: str) -> None:
    """EnvUnavailableError (one line) when EnvPool is missing or has no such task."""
    check_envpool(MUJOCO_ENVS[name], name)


class EnvPoolMujoco(gym.Env):
    """--env_agents envs of one MuJoCo task in one EnvPool pool: agent i is env i."""
    metadata = {"render_modes": []}

    def __init__(self, name: str, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        if render_mode is not None:
            raise EnvUnavailableError(f"{name} on EnvPool cannot be rendered (EnvPool {ENVPOOL_VERSION} draws MuJoCo "
                                      "only in an OpenGL context of its caller's); watch or record with --env_engine "
                                      "native: a policy trained on either engine plays on both")
        check_envpool_mujoco(name)
        import envpool

        self.num_agents = n = int(get_param(cfg, "env_agents"))
        self.is_multiagent = True
        self.pool = envpool.make(MUJOCO_ENVS[name], env_type="gymnasium", num_envs=n, batch_size=n,
                                 num_threads=1,  # a rollout worker is one core: its pool steps its envs in turn
                                 seed=pool_seed(cfg, env_index))  # (env i: seed + i)
        space = self.pool.action_space
        self.action_space = gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32),
                                           dtype=np.float32)
        self.observation_space = gym.spaces.Dict(
            obs=gym.spaces.Box(-np.inf, np.inf, self.pool.observation_space.shape, np.float32))
        self._return = np.zeros(n, np.float64)  # each env's return so far

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        obs, _ = self.pool.reset()
        self._return[:] = 0.0
        return [{"obs": o} for o in obs.astype(np.float32)], [{} for _ in range(self.num_agents)]

    def step(self, actions):
        a = np.asarray(actions, np.float64).reshape(self.num_agents, -1)
        obs, rewards, terminated, truncated, info = self.pool.step(a)
        obs = obs.astype(np.float32)
        self._return += rewards
        done = terminated | truncated
        infos: list[dict] = [{} for _ in range(self.num_agents)]
        if done.any():
            ids = np.flatnonzero(done)
            for i in ids:
                if truncated[i] and not terminated[i]:
                    infos[i]["final_obs"] = {"obs": obs[i].copy()}  # the learner bootstraps from it
                infos[i]["episode"] = episode_report(self._return[i], int(info["elapsed_step"][i]))
                self._return[i] = 0.0
            obs[ids] = self.pool.reset(ids)[0]  # the next episode at once (module docstring)
        return ([{"obs": o} for o in obs], rewards.astype(np.float64).tolist(), terminated.tolist(),
                truncated.tolist(), infos)

    def close(self):
        close = getattr(self.pool, "close", None)
        if close is not None:
            close()
