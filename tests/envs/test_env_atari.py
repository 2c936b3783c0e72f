"""Atari envs for real (ale-py): preprocessing, clipped training reward vs the unclipped full-game return."""
import numpy as np
import pytest

pytest.importorskip("ale_py", reason="ale-py is not installed (pip install ale-py)")

from sf_envs.atari.games import atari_games  # noqa: E402
from sf_envs.params import env_cfg  # noqa: E402
from sf_envs.registry import env_names, make_env  # noqa: E402

from env_test_helpers import check_contract, observation_trace  # noqa: E402

pytestmark = pytest.mark.atari


def test_game_list_from_ale_roms():
    from ale_py import roms
    games = set(atari_games())
    assert {"breakout", "pong", "space_invaders", "montezuma_revenge"} <= games
    assert games == set(roms.get_all_rom_ids()) - {"combat", "joust", "maze_craze", "warlords"}
    assert all(f"atari_{g}" in env_names() for g in games)


@pytest.mark.parametrize("name", ["atari_breakout", "atari_pong"])
def test_contract_and_preprocessing(name):
    env = make_env(env_cfg(name, seed=0), render_mode="rgb_array")
    assert env.observation_space["obs"].shape == (4, 84, 84) and env.observation_space["obs"].dtype == np.uint8
    assert env.action_space.n == {"atari_breakout": 4, "atari_pong": 6}[name]  # minimal action set
    check_contract(env, steps=50)
    assert env.render().shape == (210, 160, 3)  # the full ALE screen, for videos
    obs, _ = env.reset(seed=1)
    assert np.array_equal(obs["obs"][0], obs["obs"][3])  # a new game: the stack is filled with the first frame
    for _ in range(10):
        prev = obs["obs"]
        obs, *_ = env.step(env.action_space.sample())
        assert np.array_equal(obs["obs"][:3], prev[1:])  # frames shift through the stack
    env.close()


def play_game(env, max_steps=20_000):
    """Random play until the game is over: (training rewards, life-loss dones, the final info)."""
    rewards, life_dones = [], 0
    env.reset()
    for _ in range(max_steps):
        _, r, term, trunc, info = env.step(env.action_space.sample())
        rewards.append(r)
        if term or trunc:
            if "episode" in info:
                return rewards, life_dones, info
            life_dones += 1
            env.reset()
    raise AssertionError("game did not end")


def test_clipped_training_reward_and_full_game_return():
    env = make_env(env_cfg("atari_space_invaders", seed=0))  # 5 to 200 points per invader, 3 lives
    env.action_space.seed(0)
    rewards, life_dones, info = play_game(env)
    ep = info["episode"]
    assert set(np.unique(rewards)) <= {-1.0, 0.0, 1.0}  # training rewards are clipped
    assert life_dones >= 1  # lives end training episodes, not the reported game
    assert ep["reward"] == ep["score"] > sum(rewards) > 0  # the reported return is unclipped, over all lives
    assert ep["length"] > 4 * len(rewards) * 0.9  # env frames of the whole game

    raw = make_env(env_cfg("atari_space_invaders", seed=0, atari_clip_rewards=False, atari_episodic_life=False))
    raw.action_space.seed(0)
    rewards, life_dones, info = play_game(raw)
    assert life_dones == 0 and sum(rewards) == pytest.approx(info["episode"]["reward"])


def test_seeded_games_are_deterministic():
    def trace(seed):
        return observation_trace(make_env(env_cfg("atari_breakout", seed=seed)), 100, stop_at_episode_end=False)
    assert np.array_equal(trace(1), trace(1))
    assert not np.array_equal(trace(1), trace(2))


def test_options():
    env = make_env(env_cfg("atari_pong", atari_framestack=2, env_frameskip=2, atari_full_action_space=True))
    assert env.observation_space["obs"].shape == (2, 84, 84) and env.action_space.n == 18 and env.frameskip == 2
    env.reset()
    env.step(0)
