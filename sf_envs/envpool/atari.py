"""Atari on EnvPool (--env_engine envpool): one pool of --env_agents games, stepped in EnvPool's C++ thread, which the
rollout worker sees as one env of that many agents (the multi-agent contract of docs/architecture.md: lists in and
out, per-agent dones, each agent's next episode started at once).

Our Atari settings (sf_envs/params.py) map to EnvPool's options one for one where EnvPool has the option; where the two
engines differ, docs/envs.md ("Atari on EnvPool") has the table. Observations are the ALE engine's: uint8 [4, 84, 84],
grey, area-resized, the last two frames max-pooled; rewards clipped to their sign for training, and info["episode"] at
a game's end holds the unclipped return of the whole game (not of a life).

EnvPool restarts an env on the step after its episode ended. At a game's end the env is reset at once
(`reset(env_ids)`), so the observation returned with that done is the next game's first, as the contract asks. A lost
life (--atari_episodic_life) cannot be handled so: EnvPool's explicit reset always starts a new game. There the done
comes with the last frame of the life, and the next step's action is not played: EnvPool restarts the life (no-ops,
FIRE) and returns its first frame with reward 0, as the ALE engine's no-op step after a lost life does inside reset.
"""
from __future__ import annotations

from typing import Optional

import gymnasium as gym
import numpy as np

from sf_envs.envpool.pool import check_envpool, pool_seed
from sf_envs.episode_stats import episode_report
from sf_envs.params import get_param

OBS_SIZE = 84


def envpool_task(game: str) -> str:
    """EnvPool's id of an ALE game: breakout -> Breakout-v5, beam_rider -> BeamRider-v5."""
    return "".join(part.capitalize() for part in game.split("_")) + "-v5"


def check_envpool_atari(game: str) -> None:
    """EnvUnavailableError (one line) when EnvPool is missing or has no such game."""
    check_envpool(envpool_task(game), f"atari_{game}")


class EnvPoolAtari(gym.Env):
    """--env_agents games of one ALE ROM in one EnvPool pool: agent i is game i."""
    metadata = {"render_modes": ["rgb_array"], "render_fps": 60}

    def __init__(self, game: str, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        check_envpool_atari(game)
        import envpool

        self.game, self.render_mode = game, render_mode
        self.num_agents = n = int(get_param(cfg, "env_agents"))
        self.is_multiagent = True
        fs = get_param(cfg, "env_frameskip")
        self.frameskip = int(fs) if fs else 4
        stack = int(get_param(cfg, "atari_framestack"))
        self.pool = envpool.make(
            envpool_task(game), env_type="gymnasium", num_envs=n, batch_size=n,
            num_threads=1,  # a rollout worker is one core; its pool steps its games one after the other
            seed=pool_seed(cfg, env_index),  # (game i: seed + i)
            frame_skip=self.frameskip, stack_num=stack, img_height=OBS_SIZE, img_width=OBS_SIZE, gray_scale=True,
            use_inter_area_resize=True,
            noop_max=max(1, int(get_param(cfg, "atari_noop_max"))),  # (EnvPool's noop range needs one at least)
            episodic_life=bool(get_param(cfg, "atari_episodic_life")),
            reward_clip=bool(get_param(cfg, "atari_clip_rewards")),
            use_fire_reset=bool(get_param(cfg, "atari_fire_reset")),
            repeat_action_probability=float(get_param(cfg, "atari_repeat_action_probability")),
            full_action_space=bool(get_param(cfg, "atari_full_action_space")),
            max_episode_steps=max(1, int(get_param(cfg, "atari_max_episode_frames")) // self.frameskip),
            render_mode=render_mode)
        self.action_space = gym.spaces.Discrete(int(self.pool.action_space.n))
        self.observation_space = gym.spaces.Dict(obs=gym.spaces.Box(0, 255, (stack, OBS_SIZE, OBS_SIZE), np.uint8))
        self._game_return = np.zeros(n, np.float64)  # each game's unclipped return so far (all its lives)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        obs, _ = self.pool.reset()
        self._game_return[:] = 0.0
        return [{"obs": o} for o in obs], [{} for _ in range(self.num_agents)]

    def step(self, actions):
        obs, rewards, terminated, truncated, info = self.pool.step(np.asarray(actions, np.int32).reshape(-1))
        self._game_return += info["reward"]  # (unclipped)
        done = terminated | truncated
        infos: list[dict] = [{} for _ in range(self.num_agents)]
        if done.any():
            ids = np.flatnonzero(done)
            game_over = (info["terminated"] != 0) | truncated  # (terminated alone: a life lost, the game goes on)
            for i in ids:
                if truncated[i] and not terminated[i]:
                    infos[i]["final_obs"] = {"obs": obs[i].copy()}  # the learner bootstraps from it
                if game_over[i]:
                    length = int(info["elapsed_step"][i]) * self.frameskip
                    infos[i]["episode"] = episode_report(self._game_return[i], length, self._game_return[i])
                    self._game_return[i] = 0.0
            over = ids[game_over[ids]]
            if over.size:  # a new game at once; a lost life restarts on the next step (module docstring)
                obs[over] = self.pool.reset(over)[0]
        return ([{"obs": o} for o in obs], rewards.astype(np.float64).tolist(), terminated.tolist(),
                truncated.tolist(), infos)

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        return self.pool.render(env_ids=[0])[0]  # game 0: what a watched pool shows

    def close(self):
        close = getattr(self.pool, "close", None)
        if close is not None:
            close()
