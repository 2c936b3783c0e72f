"""info["episode"] against a naive count: reward = the sum of the rewards step() returned over the episode, length =
steps x frameskip, one report per real episode (sf_envs/episode_stats.py and the envs that count on their own)."""
import gymnasium as gym
import numpy as np
import pytest

from sf_envs.episode_stats import EpisodeStatistics, episode_report
from sf_envs.gym_env import adapt_env
from sf_envs.params import env_cfg
from sf_envs.registry import make_env
from sf_envs.test_envs import TEST_ENVS

from env_test_helpers import random_action


class Toy(gym.Env):
    """Random rewards, episodes of 1-12 steps ending terminated or truncated; `own` reports its own info["episode"];
    step() returns one shared info dict (which must stay untouched)."""
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, own=None):
        self.own = own
        self.shared_info = {"x": 1}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.n = 0, int(self.np_random.integers(1, 13))
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.n
        term, trunc = done and self.n % 2 == 0, done and self.n % 2 == 1
        if done and self.own is not None:
            return np.zeros(2, np.float32), 0.25, term, trunc, {"episode": dict(self.own)}
        return np.zeros(2, np.float32), float(self.np_random.normal()), term, trunc, self.shared_info


def naive_episodes(env, episodes, seed=0, cut_at=None):
    """(naive [(reward sum, steps)], reported [info["episode"]]) over `episodes` episodes of random actions; with
    cut_at, every other episode is also cut by a reset() after that many steps (a cut episode reports nothing)."""
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    naive, reported, total, steps, attempt = [], [], 0.0, 0, 0
    while len(reported) < episodes:
        obs, r, term, trunc, info = env.step(random_action(env, obs))
        total, steps = total + r, steps + 1
        assert ("episode" in info) == (term or trunc)
        if term or trunc:
            naive.append((total, steps))
            reported.append(info["episode"])
        if term or trunc or (cut_at and attempt % 2 == 1 and steps == cut_at):
            obs, _ = env.reset()
            total, steps, attempt = 0.0, 0, attempt + 1
    return naive, reported


@pytest.mark.parametrize("frameskip", [1, 3])
def test_episode_statistics_naive_count(frameskip):
    env = EpisodeStatistics(Toy(), frameskip)
    assert isinstance(env, gym.wrappers.RecordEpisodeStatistics) and env.num_agents == 1 and env.frameskip == frameskip
    naive, reported = naive_episodes(env, 40, cut_at=2)
    for (total, steps), ep in zip(naive, reported):
        assert ep == {"reward": total, "length": steps * frameskip}  # exactly the contract's keys, no "t"
        assert type(ep["reward"]) is float and type(ep["length"]) is int
    assert env.unwrapped.shared_info == {"x": 1}  # the env's own info dict is not written to


def test_episode_statistics_keeps_an_envs_own_report():
    own = episode_report(5.0, 99, score=7)
    assert own == {"reward": 5.0, "length": 99, "score": 7.0}
    _, reported = naive_episodes(EpisodeStatistics(Toy(own=own), 4), 5)
    assert reported == [own] * 5
    # a report in another format (RecordEpisodeStatistics' own r/l/t, say) is replaced by the contract's
    naive, reported = naive_episodes(EpisodeStatistics(Toy(own={"r": 1.0, "l": 1, "t": 0.0}), 4), 5)
    assert reported == [{"reward": total, "length": 4 * steps} for total, steps in naive]


@pytest.mark.parametrize("name", [n for n, cls in TEST_ENVS.items() if getattr(cls, "NUM_AGENTS", 1) == 1])
def test_test_envs_naive_count(name):  # (test_race, multi-agent: tests/envs/test_env_test_envs.py)
    env = make_env(env_cfg(name, seed=0))
    naive, reported = naive_episodes(env, 30, cut_at=3)
    assert reported == [{"reward": total, "length": steps} for total, steps in naive]


def test_gym_adapter_naive_count_with_truncation_and_frameskip():
    env = adapt_env(gym.make("CartPole-v1", max_episode_steps=7), env_cfg("gym:CartPole-v1", seed=0), frameskip=2)
    naive, reported = naive_episodes(env, 20)
    assert reported == [{"reward": total, "length": 2 * steps} for total, steps in naive]
    assert any(steps == 7 for _, steps in naive)  # some episodes were truncated by the time limit


@pytest.mark.atari
def test_atari_one_report_per_game_not_per_life():
    pytest.importorskip("ale_py", reason="ale-py is not installed (pip install ale-py)")
    env = make_env(env_cfg("atari_breakout", seed=0, atari_clip_rewards=False, atari_noop_max=0,
                           atari_fire_reset=False))
    env.action_space.seed(0)
    env.reset()
    for game in range(2):
        rewards, lives_ended, reset_steps = [], 0, 0
        while True:
            _, r, term, trunc, info = env.step(env.action_space.sample())
            rewards.append(r)
            if term or trunc:
                lives_ended += 1
                if "episode" in info:
                    break
                env.reset()
                reset_steps += 1  # after a lost life, reset() plays one no-op step of the same game
        ep = info["episode"]
        assert lives_ended == 5  # Breakout's 5 lives: 5 training episodes, 1 report
        assert ep["reward"] == ep["score"] == sum(rewards)  # the whole game (no reward in the no-op steps here)
        frames = 4 * (len(rewards) + reset_steps)
        assert frames - 3 <= ep["length"] <= frames  # env frames (the last step stops at the game-over frame)
        env.reset()
