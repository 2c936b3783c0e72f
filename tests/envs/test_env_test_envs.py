"""Built-in test envs: contract, determinism, and their documented optimal/random returns."""
import numpy as np
import pytest

from sf_envs.params import env_cfg
from sf_envs.registry import make_env
from sf_envs.test_envs import TEST_ENVS

from env_test_helpers import check_contract


def rollout(env, policy, episodes, seed=None):
    returns, lengths = [], []
    obs, _ = env.reset(seed=seed)
    while len(returns) < episodes:
        obs, r, term, trunc, info = env.step(policy(env, obs))
        if term or trunc:
            returns.append(info["episode"]["reward"])
            lengths.append(info["episode"]["length"])
            obs, _ = env.reset()
    return np.array(returns), np.array(lengths)


def optimal(name):
    if name == "test_corridor":
        return lambda env, obs: 2
    if name == "test_image":
        return lambda env, obs: np.array([int(np.argmax(obs["obs"].sum(axis=(1, 2)))),
                                          int(obs["obs"][:, 18:].sum() > obs["obs"][:, :18].sum())])
    if name == "test_box":
        return lambda env, obs: np.array([obs["obs"][0]], np.float32)
    if name == "test_memory":
        mem = {}

        def policy(env, obs):
            o = obs["obs"]
            if o[3] == 0:
                mem["cue"] = int(np.argmax(o[:2]))
            return mem["cue"]
        return policy


@pytest.mark.parametrize("name", list(TEST_ENVS))
def test_contract_and_optimal_return(name):
    env = make_env(env_cfg(name, seed=0))
    check_contract(env)
    cls = TEST_ENVS[name]
    returns, lengths = rollout(env, optimal(name), 5, seed=1)
    assert np.allclose(returns, cls.OPTIMAL_RETURN), returns
    if name == "test_corridor":
        assert (lengths == 9).all()
    assert env.render().ndim == 3


@pytest.mark.parametrize("name, expected", [("test_corridor", -0.26), ("test_image", 6.67), ("test_box", 5.33),
                                            ("test_memory", 0.5)])
def test_random_policy_is_far_from_optimal(name, expected):
    env = make_env(env_cfg(name, seed=0))
    returns, _ = rollout(env, lambda env, obs: env.action_space.sample(), 300, seed=2)
    env.action_space.seed(0)
    if expected is not None:
        assert abs(returns.mean() - expected) < 0.15 * max(1.0, expected), returns.mean()
    assert returns.mean() < TEST_ENVS[name].OPTIMAL_RETURN - 0.3


@pytest.mark.parametrize("name", list(TEST_ENVS))
def test_deterministic_given_seed(name):
    def trace(seed, env_index=0, use_cfg_seed=False):
        env = make_env(env_cfg(name, seed=seed if use_cfg_seed else None), env_index=env_index)
        env.action_space.seed(123)
        obs, _ = env.reset(seed=None if use_cfg_seed else seed)
        out = [obs["obs"].copy()]
        for _ in range(40):
            obs, r, term, trunc, _ = env.step(env.action_space.sample())
            out += [obs["obs"].copy(), np.array([r])]
            if term or trunc:
                obs, _ = env.reset()
        return np.concatenate([x.ravel().astype(np.float64) for x in out])

    assert np.array_equal(trace(5), trace(5))
    assert np.array_equal(trace(5, 3, True), trace(5, 3, True))  # cfg.seed + env_index seed the first reset
    if name != "test_corridor":  # the corridor has no randomness
        assert not np.array_equal(trace(5), trace(6))
        assert not np.array_equal(trace(5, 3, True), trace(5, 4, True))
