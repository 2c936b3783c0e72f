"""DeepMind Lab env of the contract: 96x72 RGB -> obs uint8 [3, 72, 96], the discretized action set of the
paper (appendix A.2: Hessel et al. 2019, 15 actions; IMPALA's 9 with --dmlab_extended_action_set False),
action repeat 4, IMPALA's optimistic asymmetric reward clipping for training, raw score reported, and a
level cache on disk (generated maps are reused across runs and processes).

Written against deepmind_lab's documented Python API (`Lab(level, observations, config, renderer,
level_cache)`, `reset(seed=)`, `step(action, num_steps=)`, `is_running()`, `observations()`, `close()`);
unit-tested with a stand-in module, not run against a real DeepMind Lab build (none installs here).
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import gymnasium as gym
import numpy as np

from sf_envs.dmlab.levels import levels_of
from sf_envs.episode_stats import episode_report
from sf_envs.errors import EnvUnavailableError
from sf_envs.params import get_param
from sf_envs.utils import cfg_seed, data_dir, derive_seed, single_threaded

RES_W, RES_H = 96, 72
OBS_NAME = "RGB_INTERLEAVED"  # [H, W, 3] uint8
INSTALL_HINT = ("DeepMind Lab is not installed (module deepmind_lab; no pip wheel exists): build it from "
                "https://github.com/deepmind/lab with bazel (//python/pip_package:build_pip_package) and pip install "
                "the wheel it makes")

# action: [look left/right (pixels), look down/up, strafe left/right, move back/forward, fire, jump, crouch]
IMPALA_ACTION_SET = (
    (0, 0, 0, 1, 0, 0, 0),  # forward
    (0, 0, 0, -1, 0, 0, 0),  # backward
    (0, 0, -1, 0, 0, 0, 0),  # strafe left
    (0, 0, 1, 0, 0, 0, 0),  # strafe right
    (-20, 0, 0, 0, 0, 0, 0),  # look left
    (20, 0, 0, 0, 0, 0, 0),  # look right
    (-20, 0, 0, 1, 0, 0, 0),  # look left + forward
    (20, 0, 0, 1, 0, 0, 0),  # look right + forward
    (0, 0, 0, 0, 1, 0, 0),  # fire
)
EXTENDED_ACTION_SET = (  # Hessel et al. 2019 (PopArt), used by the paper (A.2)
    (0, 0, 0, 1, 0, 0, 0),  # forward
    (0, 0, 0, -1, 0, 0, 0),  # backward
    (0, 0, -1, 0, 0, 0, 0),  # strafe left
    (0, 0, 1, 0, 0, 0, 0),  # strafe right
    (-10, 0, 0, 0, 0, 0, 0),  # small look left
    (10, 0, 0, 0, 0, 0, 0),  # small look right
    (-60, 0, 0, 0, 0, 0, 0),  # large look left
    (60, 0, 0, 0, 0, 0, 0),  # large look right
    (0, 10, 0, 0, 0, 0, 0),  # look down
    (0, -10, 0, 0, 0, 0, 0),  # look up
    (-10, 0, 0, 1, 0, 0, 0),  # forward + small look left
    (10, 0, 0, 1, 0, 0, 0),  # forward + small look right
    (-60, 0, 0, 1, 0, 0, 0),  # forward + large look left
    (60, 0, 0, 1, 0, 0, 0),  # forward + large look right
    (0, 0, 0, 0, 1, 0, 0),  # fire
)


def check_dmlab():
    """Import deepmind_lab or raise EnvUnavailableError with how to install it (one line)."""
    try:
        import deepmind_lab
    except ImportError:
        raise EnvUnavailableError(INSTALL_HINT) from None
    return deepmind_lab


def level_cache_dir(cfg=None) -> Path:
    d = get_param(cfg, "dmlab_level_cache_dir") or os.environ.get("SF_DMLAB_LEVEL_CACHE")
    if d:
        return Path(os.path.expanduser(d))
    return data_dir("dmlab_level_cache")


class LevelCache:
    """DeepMind Lab's level_cache protocol on a directory: fetch(key, pk3_path) -> bool, write(key, pk3_path).

    DeepMind Lab calls fetch() before compiling a level (a hit copies the cached map to pk3_path and skips
    the compilation) and write() after compiling one. Writes are atomic (temp file + rename), so several
    processes can share one directory.
    """

    def __init__(self, cache_dir):
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.hits = self.misses = 0

    def _path(self, key: str) -> Path:
        return self.cache_dir / os.path.basename(str(key))

    def fetch(self, key, pk3_path) -> bool:
        path = self._path(key)
        if path.is_file():
            shutil.copyfile(path, pk3_path)
            self.hits += 1
            return True
        self.misses += 1
        return False

    def write(self, key, pk3_path) -> None:
        path = self._path(key)
        if path.is_file():
            return
        fd, tmp = tempfile.mkstemp(prefix=".tmp_", dir=self.cache_dir)
        os.close(fd)
        try:
            shutil.copyfile(pk3_path, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def optimistic_asymmetric_clip(r: float) -> float:
    """IMPALA's DMLab reward clipping: 5 tanh(r / 5), with negative rewards scaled by 0.3."""
    squeezed = math.tanh(r / 5.0)
    return 5.0 * (0.3 * squeezed if r < 0 else squeezed)


class DmlabEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(self, level: str, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        single_threaded()
        deepmind_lab = check_dmlab()
        self.level = level
        self.level_name = level.split("/")[-1]
        self.render_mode = render_mode
        self.num_agents = 1
        self.is_multiagent = False
        fs = get_param(cfg, "env_frameskip")
        self.frameskip = int(fs) if fs else 4
        self.clip = bool(get_param(cfg, "dmlab_reward_clipping"))
        self.action_set = EXTENDED_ACTION_SET if get_param(cfg, "dmlab_extended_action_set") else IMPALA_ACTION_SET
        self._actions = np.array(self.action_set, dtype=np.intc)
        self.action_space = gym.spaces.Discrete(len(self.action_set))
        self.observation_space = gym.spaces.Dict(obs=gym.spaces.Box(0, 255, (3, RES_H, RES_W), np.uint8))

        config = {"width": str(RES_W), "height": str(RES_H)}
        dataset = get_param(cfg, "dmlab_dataset_path")
        if dataset:
            config["datasetPath"] = os.path.expanduser(str(dataset))
        self.level_cache = LevelCache(level_cache_dir(cfg)) if get_param(cfg, "dmlab_use_level_cache") else None
        kwargs = {"config": config, "renderer": str(get_param(cfg, "dmlab_renderer"))}
        if self.level_cache is not None:
            kwargs["level_cache"] = self.level_cache
        try:
            self.lab = deepmind_lab.Lab(level, [OBS_NAME], **kwargs)
        except Exception as e:
            raise RuntimeError(f"DeepMind Lab could not load level {level}: {e}") from e
        seed = derive_seed(cfg_seed(cfg), env_index)
        self._rng = np.random.default_rng(seed)
        self._frame = np.zeros((RES_H, RES_W, 3), np.uint8)
        self._obs = {"obs": np.zeros((3, RES_H, RES_W), np.uint8)}
        self._ep_raw = 0.0
        self._ep_steps = 0

    def _read_obs(self) -> dict:
        frame = np.asarray(self.lab.observations()[OBS_NAME], dtype=np.uint8)
        self._frame = frame
        self._obs = {"obs": np.ascontiguousarray(frame.transpose(2, 0, 1))}
        return self._obs

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.lab.reset(seed=int(self._rng.integers(0, 2**31 - 1)))  # one map per seed: cached maps are reused
        self._ep_raw, self._ep_steps = 0.0, 0
        return self._read_obs(), {}

    def step(self, action):
        a = int(np.asarray(action).reshape(-1)[0]) if np.ndim(action) else int(action)
        raw = float(self.lab.step(self._actions[a], num_steps=self.frameskip))
        self._ep_raw += raw
        self._ep_steps += 1
        terminated = not self.lab.is_running()
        if not terminated:
            self._read_obs()
        reward = optimistic_asymmetric_clip(raw) if self.clip else raw
        info = {}
        if terminated:  # the raw return, not the clipped sum RecordEpisodeStatistics would count
            info["episode"] = episode_report(self._ep_raw, self._ep_steps * self.frameskip, self._ep_raw)
            info["level_name"] = self.level_name
        return self._obs, reward, terminated, False, info

    def render(self):
        return np.array(self._frame, copy=True) if self.render_mode == "rgb_array" else None

    def close(self):
        lab, self.lab = getattr(self, "lab", None), None
        if lab is not None:
            lab.close()


def make_dmlab_env(env_name: str, cfg=None, env_index: int = 0, render_mode: Optional[str] = None) -> DmlabEnv:
    levels = levels_of(env_name)
    return DmlabEnv(levels[env_index % len(levels)], cfg, env_index, render_mode)
