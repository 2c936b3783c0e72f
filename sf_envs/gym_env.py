"""Any gymnasium env (gym:<id>, gym:<module>:<id>) or user factory, adapted to the env contract.

Observations: a Dict with "obs" is kept; a uint8 image Box becomes uint8 [C, H, W] (HWC and 2-D frames are
converted); any other space becomes a float32 vector [D] (Discrete one-hot, others flattened).
Actions: Discrete and MultiDiscrete (shifted to start at 0), MultiBinary and Tuple-of-Discrete as
MultiDiscrete, Box flattened to 1-D float32. Episodes: info["episode"] = {"reward", "length"} is added at
the end of every episode (sum of rewards, steps x frameskip) unless the env reports its own, by gymnasium's
RecordEpisodeStatistics (sf_envs.episode_stats.EpisodeStatistics) around the adapter.
"""
from __future__ import annotations

from typing import Optional

import gymnasium as gym
import numpy as np

from sf_envs.episode_stats import EpisodeStatistics
from sf_envs.utils import cfg_seed, derive_seed, single_threaded


def _is_image(space) -> bool:
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) in (2, 3)


def _obs_converter(space):
    """(new space, convert(obs) -> dict) for one observation space."""
    if isinstance(space, gym.spaces.Dict) and "obs" in space.spaces:
        return space, lambda o: o
    if _is_image(space):
        shape = space.shape
        if len(shape) == 2:
            new = gym.spaces.Box(0, 255, (1, *shape), np.uint8)
            return gym.spaces.Dict(obs=new), lambda o: {"obs": np.asarray(o, np.uint8)[None]}
        if shape[-1] in (1, 3, 4) and shape[0] not in (1, 3, 4):  # HWC -> CHW
            new = gym.spaces.Box(0, 255, (shape[2], shape[0], shape[1]), np.uint8)
            return (gym.spaces.Dict(obs=new),
                    lambda o: {"obs": np.ascontiguousarray(np.asarray(o, np.uint8).transpose(2, 0, 1))})
        return gym.spaces.Dict(obs=space), lambda o: {"obs": np.asarray(o, np.uint8)}
    if isinstance(space, gym.spaces.Discrete):
        n, start = int(space.n), int(space.start)
        eye = np.eye(n, dtype=np.float32)
        return (gym.spaces.Dict(obs=gym.spaces.Box(0.0, 1.0, (n,), np.float32)),
                lambda o: {"obs": eye[int(o) - start].copy()})
    if isinstance(space, gym.spaces.Box):
        low = np.asarray(space.low, np.float32).reshape(-1)
        high = np.asarray(space.high, np.float32).reshape(-1)
        new = gym.spaces.Box(low, high, dtype=np.float32)
        return gym.spaces.Dict(obs=new), lambda o: {"obs": np.asarray(o, np.float32).reshape(-1)}
    try:
        flat = gym.spaces.flatten_space(space)
    except NotImplementedError:
        raise ValueError(f"cannot adapt observation space {space} to the env contract") from None
    new = gym.spaces.Box(np.asarray(flat.low, np.float32), np.asarray(flat.high, np.float32), dtype=np.float32)
    return gym.spaces.Dict(obs=new), lambda o: {"obs": np.asarray(gym.spaces.flatten(space, o), np.float32)}


def _action_converter(space):
    """(new space, convert(action) -> the inner env's action) for one action space."""
    if isinstance(space, gym.spaces.Discrete):
        start = int(space.start)
        return gym.spaces.Discrete(int(space.n)), lambda a: int(np.asarray(a).reshape(-1)[0]) + start
    if isinstance(space, gym.spaces.MultiDiscrete):
        if len(space.nvec.shape) != 1:
            raise ValueError(f"cannot adapt multi-dimensional MultiDiscrete {space}")
        start = np.asarray(space.start, np.int64)
        return (gym.spaces.MultiDiscrete(space.nvec),
                lambda a: (np.asarray(a, np.int64).reshape(-1) + start).astype(space.dtype))
    if isinstance(space, gym.spaces.MultiBinary):
        shape = space.shape
        n = int(np.prod(shape))
        return gym.spaces.MultiDiscrete([2] * n), lambda a: np.asarray(a, np.int8).reshape(shape)
    if isinstance(space, gym.spaces.Tuple) and all(isinstance(s, gym.spaces.Discrete) for s in space.spaces):
        starts = [int(s.start) for s in space.spaces]
        new = gym.spaces.MultiDiscrete([int(s.n) for s in space.spaces])
        return new, lambda a: tuple(int(x) + s for x, s in zip(np.asarray(a).reshape(-1), starts))
    if isinstance(space, gym.spaces.Box):
        shape = space.shape
        new = gym.spaces.Box(np.asarray(space.low, np.float32).reshape(-1),
                             np.asarray(space.high, np.float32).reshape(-1), dtype=np.float32)
        return new, lambda a: np.asarray(a, space.dtype).reshape(shape)
    raise ValueError(f"cannot adapt action space {space} to the env contract (Discrete, MultiDiscrete, Box)")


class ContractAdapter(gym.Wrapper):
    """Adapts a gymnasium env's spaces, actions, observations and first seed to the env contract (see the module
    docstring); adapt_env() adds the episode report around it."""

    def __init__(self, env: gym.Env, seed: Optional[int] = None):
        super().__init__(env)
        self.observation_space, self._obs = _obs_converter(env.observation_space)
        self.action_space, self._act = _action_converter(env.action_space)
        self.num_agents = 1
        self.is_multiagent = False
        self._first_seed = seed

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        if seed is None and self._first_seed is not None:
            seed = self._first_seed
        self._first_seed = None
        obs, info = self.env.reset(seed=seed, options=options)
        return self._obs(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(self._act(action))
        if (terminated or truncated) and not isinstance(info, dict):
            info = dict(info or {})
        return self._obs(obs), float(reward), bool(terminated), bool(truncated), info


def adapt_env(env: gym.Env, cfg=None, env_index: int = 0, frameskip: int = 1) -> gym.Env:
    return EpisodeStatistics(ContractAdapter(env, derive_seed(cfg_seed(cfg), env_index)), frameskip)


def make_gym_env(env_id: str, cfg=None, env_index: int = 0, render_mode: Optional[str] = None) -> gym.Env:
    single_threaded()
    if render_mode:
        try:
            env = gym.make(env_id, disable_env_checker=True, render_mode=render_mode)
        except TypeError as e:  # an env that takes no render_mode: run it without rendering
            if "render_mode" not in str(e):
                raise
            env = gym.make(env_id, disable_env_checker=True)
    else:
        env = gym.make(env_id, disable_env_checker=True)
    return adapt_env(env, cfg, env_index)
