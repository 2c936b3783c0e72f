"""info["episode"], the end-of-episode report of the env contract (docs/architecture.md "Env contract"), in one place.

At the end of a real episode an env puts {"reward": float, "length": int env frames, "score": float (optional)} in
info["episode"]; rollout workers forward every key, so no other key goes in.

- `EpisodeStatistics`: gymnasium's `RecordEpisodeStatistics` (it counts the rewards step() returns and the steps,
  and reports them at terminated or truncated) reporting in the contract's keys, with length = steps x frameskip.
  For envs whose step() reward is the reported reward and whose every terminated/truncated ends a real episode:
  gym:<id> and users' envs (sf_envs/gym_env.py) and the built-in test envs (sf_envs/registry.py).
- `episode_report(reward, length, score)`: the dict itself, for the envs that count on their own because
  RecordEpisodeStatistics cannot see what they report:
  - Doom: `score` is the unshaped game objective (the engine's kill/frag counter or the unscaled game reward),
    known only inside the env, so the env counts reward and frames beside it (no wrapper layer on the hot path);
  - Atari: a training episode ends at every life loss but the report is for the whole game, with the unclipped
    return (step() returns the clipped reward), rewards of the no-op/FIRE frames played inside reset()
    included, and the ALE's frame count;
  - DMLab: the report is the raw return, step() returns the clipped reward.
"""
from __future__ import annotations

from typing import Optional

import gymnasium as gym
from gymnasium.wrappers import RecordEpisodeStatistics

_RES_KEY = "_sf_episode_statistics"  # RecordEpisodeStatistics' own report, translated to info["episode"] below


def episode_report(reward: float, length: int, score: Optional[float] = None) -> dict:
    """The contract's info["episode"]: reward in Sample Factory's units, length in env frames, optional score."""
    ep = {"reward": float(reward), "length": int(length)}
    if score is not None:
        ep["score"] = float(score)
    return ep


class EpisodeStatistics(RecordEpisodeStatistics):
    """RecordEpisodeStatistics reporting info["episode"] = {"reward": sum of step() rewards, "length": steps x
    frameskip} at every terminated or truncated step; an env's own contract report (one with "reward") is kept.

    The wrapped env's info dict is not modified (a report goes into a copy). `num_agents` and `is_multiagent` are
    the env's (1 and False when it has none): gymnasium wrappers do not forward attributes.
    """

    def __init__(self, env: gym.Env, frameskip: int = 1):
        gym.utils.RecordConstructorArgs.__init__(self, frameskip=frameskip)  # the first call's kwargs are kept
        super().__init__(env, stats_key=_RES_KEY)
        self.frameskip = int(frameskip)
        self.num_agents = getattr(env, "num_agents", 1)
        self.is_multiagent = getattr(env, "is_multiagent", False)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        stats = info.pop(_RES_KEY, None)  # present exactly when terminated or truncated
        if stats is not None:
            own = info.get("episode")
            if not (isinstance(own, dict) and "reward" in own):
                info = dict(info)
                info["episode"] = episode_report(stats["r"], stats["l"] * self.frameskip)
        return obs, reward, terminated, truncated, info
