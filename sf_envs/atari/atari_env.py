"""Atari env of the contract, on the ALE directly (no wrapper stack): the standard DQN/Sample Factory
preprocessing in one class.

- up to 30 random no-op frames after a game reset;
- action repeat 4 with the max over the last two frames (flicker), reward summed;
- episodic life for training: a lost life ends the training episode (terminated) but not the game; the
  next reset() goes on with the same game;
- FIRE pressed after every reset in games that need it;
- 84x84 grayscale (ALE luminance, area interpolation), 4 frames stacked -> obs uint8 [4, 84, 84];
- training reward clipped to its sign; info["episode"] at game over (or the 108k-frame truncation) holds
  the unclipped full-game return ("reward" and "score") and the game's frame count ("length").

Defaults follow Sample Factory's Atari setup (gym NoFrameskip-v4: sticky actions off, minimal action set,
108k frames max); sf_envs/params.py has the switches.
"""
from __future__ import annotations

from typing import Optional

import cv2
import gymnasium as gym
import numpy as np

from sf_envs.episode_stats import episode_report
from sf_envs.params import get_param
from sf_envs.utils import cfg_seed, derive_seed, single_threaded

OBS_SIZE = 84


class AtariEnv(gym.Env):
    metadata = {"render_modes": ["human", "rgb_array"], "render_fps": 60}

    def __init__(self, game: str, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        single_threaded()
        import ale_py
        from ale_py import roms

        self.game = game
        self.render_mode = render_mode
        self.num_agents = 1
        self.is_multiagent = False
        fs = get_param(cfg, "env_frameskip")
        self.frameskip = int(fs) if fs else 4
        self.noop_max = int(get_param(cfg, "atari_noop_max"))
        self.episodic_life = bool(get_param(cfg, "atari_episodic_life"))
        self.clip_rewards = bool(get_param(cfg, "atari_clip_rewards"))
        self.stack = int(get_param(cfg, "atari_framestack"))

        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # before the constructor: no banner on stderr
        ale = ale_py.ALEInterface()
        ale.setFloat("repeat_action_probability", float(get_param(cfg, "atari_repeat_action_probability")))
        ale.setInt("max_num_frames_per_episode", int(get_param(cfg, "atari_max_episode_frames")))
        if render_mode == "human":
            ale.setBool("display_screen", True)
        self.ale = ale
        self._rom = roms.get_rom_path(game)
        self._seed_and_load(derive_seed(cfg_seed(cfg), env_index))
        self.actions = (ale.getLegalActionSet() if get_param(cfg, "atari_full_action_space")
                        else ale.getMinimalActionSet())
        self.action_meanings = [a.name for a in self.actions]
        self.action_space = gym.spaces.Discrete(len(self.actions))
        self.observation_space = gym.spaces.Dict(obs=gym.spaces.Box(0, 255, (self.stack, OBS_SIZE, OBS_SIZE), np.uint8))
        self._fire = bool(get_param(cfg, "atari_fire_reset")) and ale_py.Action.FIRE in self.actions \
            and len(self.actions) >= 3
        self._noop = ale_py.Action.NOOP
        self._fire_action = ale_py.Action.FIRE

        h, w = ale.getScreenDims()
        self._buf = np.zeros((2, h, w), np.uint8)
        self._frames = np.zeros((self.stack, OBS_SIZE, OBS_SIZE), np.uint8)
        self._game_over = True  # the next reset() starts a new game
        self._lives = 0
        self._ep_raw = 0.0

    def _seed_and_load(self, seed: Optional[int]) -> None:
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0] & 0x7FFFFFFF)
        ss = np.random.SeedSequence(int(seed))
        np_seed, ale_seed = ss.generate_state(2)
        self.ale.setInt("random_seed", int(ale_seed & 0x7FFFFFFF))
        self.ale.loadROM(self._rom)  # the seed takes effect when the ROM is loaded
        self._np_random, _ = gym.utils.seeding.np_random(int(np_seed))

    # --- frames ---
    def _grab(self, slot: int) -> None:
        self.ale.getScreenGrayscale(self._buf[slot])

    def _push_frame(self, maxed: np.ndarray, fill: bool = False) -> dict:
        small = cv2.resize(maxed, (OBS_SIZE, OBS_SIZE), interpolation=cv2.INTER_AREA)
        if fill:
            self._frames[:] = small
        else:
            self._frames[:-1] = self._frames[1:]
            self._frames[-1] = small
        return {"obs": self._frames.copy()}

    def _act(self, action, n: int) -> float:
        """n frames of one action; the last two screens go to self._buf. Returns the raw reward."""
        ale, reward = self.ale, 0.0
        for i in range(n):
            reward += ale.act(action)
            over = ale.game_over()
            if i == n - 2 and not over:
                self._grab(0)
            if i == n - 1 or over:
                self._grab(1)
                if i < n - 1 or n == 1:  # no second-to-last screen of this step: max over the last one only
                    self._buf[0] = self._buf[1]
                break
        return reward

    # --- gym API ---
    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        if seed is not None:
            self._seed_and_load(seed)
            self._game_over = True
        info = {}
        if self._game_over or not self.episodic_life:
            self._new_game()
        else:  # a life was lost: the game goes on with a no-op step
            self._ep_raw += self._act(self._noop, self.frameskip)
            if self.ale.game_over():
                self._new_game()
        if self._fire:  # FIRE, then the game's action 2, as in the usual FireResetEnv
            for a in (self._fire_action, self.actions[2]):
                self._ep_raw += self._act(a, self.frameskip)
                if self.ale.game_over():
                    self._new_game()
        self._lives = self.ale.lives()
        self._grab(0)
        return self._push_frame(self._buf[0], fill=True), info

    def _new_game(self) -> None:
        ale = self.ale
        ale.reset_game()
        self._ep_raw = 0.0
        noops = int(self._np_random.integers(1, self.noop_max + 1)) if self.noop_max > 0 else 0
        for _ in range(noops):
            ale.act(self._noop)
            if ale.game_over():
                ale.reset_game()
        self._game_over = False

    def step(self, action):
        a = self.actions[int(np.asarray(action).reshape(-1)[0]) if np.ndim(action) else int(action)]
        raw = self._act(a, self.frameskip)
        self._ep_raw += raw
        ale = self.ale
        game_over = ale.game_over(with_truncation=False)
        truncated = ale.game_truncated() and not game_over
        lives = ale.lives()
        life_lost = self.episodic_life and 0 < lives < self._lives
        self._lives = lives
        obs = self._push_frame(np.maximum(self._buf[0], self._buf[1]))
        reward = float(np.sign(raw)) if self.clip_rewards else float(raw)
        info = {"lives": lives}
        # the report is the game's, not a life's: counted here, not by RecordEpisodeStatistics, which would report
        # every life with the clipped sum (sf_envs/episode_stats.py)
        if game_over or truncated:
            self._game_over = True
            info["episode"] = episode_report(self._ep_raw, ale.getEpisodeFrameNumber(), self._ep_raw)
        return obs, reward, bool(game_over or life_lost), bool(truncated), info

    def render(self):
        if self.render_mode == "rgb_array":
            return self.ale.getScreenRGB()
        return None

    def close(self):
        pass  # the ALE frees itself with the object
