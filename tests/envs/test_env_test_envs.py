"""Built-in test envs: contract, determinism, and their documented optimal/random returns."""
import numpy as np
import pytest

from sf_envs.params import env_cfg
from sf_envs.registry import make_env
from sf_envs.test_envs import TEST_ENVS

from env_test_helpers import check_contract, random_action

SINGLE = [n for n, cls in TEST_ENVS.items() if getattr(cls, "NUM_AGENTS", 1) == 1]


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
    if name == "test_masked":
        return lambda env, obs: int(np.argmax(obs["obs"]))


@pytest.mark.parametrize("name", SINGLE)
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
                                            ("test_memory", 0.5), ("test_masked", 9.78)])
def test_random_policy_is_far_from_optimal(name, expected):
    env = make_env(env_cfg(name, seed=0))
    returns, _ = rollout(env, random_action, 300, seed=2)
    env.action_space.seed(0)
    if expected is not None:
        assert abs(returns.mean() - expected) < 0.15 * max(1.0, expected), returns.mean()
    assert returns.mean() < TEST_ENVS[name].OPTIMAL_RETURN - 0.3


@pytest.mark.parametrize("name", SINGLE)
def test_deterministic_given_seed(name):
    def trace(seed, env_index=0, use_cfg_seed=False):
        env = make_env(env_cfg(name, seed=seed if use_cfg_seed else None), env_index=env_index)
        env.action_space.seed(123)
        obs, _ = env.reset(seed=None if use_cfg_seed else seed)
        out = [obs["obs"].copy()]
        for _ in range(40):
            obs, r, term, trunc, _ = env.step(random_action(env, obs))
            out += [obs["obs"].copy(), np.array([r])]
            if term or trunc:
                obs, _ = env.reset()
        return np.concatenate([x.ravel().astype(np.float64) for x in out])

    assert np.array_equal(trace(5), trace(5))
    assert np.array_equal(trace(5, 3, True), trace(5, 3, True))  # cfg.seed + env_index seed the first reset
    if name != "test_corridor":  # the corridor has no randomness
        assert not np.array_equal(trace(5), trace(6))
        assert not np.array_equal(trace(5, 3, True), trace(5, 4, True))


# --- test_race: the multi-agent contract (docs/architecture.md) ---
def race_steps(env, policy, steps):
    """Step the 2-agent race; returns per step (obs, rewards, terminated, truncated, infos)."""
    out = []
    for _ in range(steps):
        out.append(env.step([policy(i) for i in range(2)]))
    return out


def test_race_multiagent_contract_and_optimal_return():
    env = make_env(env_cfg("test_race", seed=0))
    assert env.num_agents == 2 and env.is_multiagent
    obs, infos = env.reset(seed=1)
    assert len(obs) == len(infos) == 2 and all(env.observation_space.contains(o) for o in obs)
    steps = race_steps(env, lambda i: 2, 27)  # both run right: 3 episodes each, 9 steps
    for t, (obs, rewards, term, trunc, infos) in enumerate(steps):
        assert len(obs) == len(rewards) == len(term) == len(trunc) == len(infos) == 2
        for i in range(2):
            done = (t + 1) % 9 == 0
            assert term[i] == done and not trunc[i]
            if done:  # auto-reset: the next episode's first observation (cell 0 for both, they finish together)
                assert infos[i]["episode"] == {"reward": pytest.approx(TEST_ENVS["test_race"].OPTIMAL_RETURN),
                                               # faster than the other agent's last (none: 50), then a tie
                                               "length": 9, "win": float(t == 8)}
                assert obs[i]["obs"][0] == 1 and obs[i]["obs"][10] == 1
    assert env.render().ndim == 3


def test_race_agents_finish_apart_and_truncated_agents_keep_their_final_observation():
    """Agent 0 runs to the goal (episodes of 9 steps), agent 1 stays (cut by the 50-step limit): their episodes end
    apart; the cut one reports its final observation (cell 0 of its own corridor, agent 0's cell beside it)."""
    env = make_env(env_cfg("test_race", seed=0))
    env.reset(seed=1)
    steps = race_steps(env, lambda i: 2 if i == 0 else 1, 50)
    ends = [[t for t, s in enumerate(steps) if s[2][i] or s[3][i]] for i in range(2)]
    assert ends[0] == [8, 17, 26, 35, 44] and ends[1] == [49]
    obs, _, term, trunc, infos = steps[49]
    assert trunc[1] and not term[1] and infos[1]["episode"]["length"] == 50 and infos[1]["episode"]["win"] == 0.0
    final = infos[1]["final_obs"]["obs"]
    assert final[0] == 1 and final[10 + 5] == 1  # agent 1 at cell 0, agent 0 at cell 5 (5 steps into its 6th episode)


def test_race_deterministic_given_seed_and_naive_counts():
    def trace(seed):
        env = make_env(env_cfg("test_race", seed=None))
        env.action_space.seed(123)
        obs, _ = env.reset(seed=seed)
        out, episodes, sums = [], [[], []], [0.0, 0.0]
        for _ in range(300):
            obs, r, term, trunc, infos = env.step([env.action_space.sample() for _ in range(2)])
            out += [o["obs"] for o in obs] + [np.array(r)]
            for i in range(2):
                sums[i] += r[i]
                if term[i] or trunc[i]:
                    assert infos[i]["episode"]["reward"] == pytest.approx(sums[i])  # naive count agrees
                    episodes[i].append(infos[i]["episode"]["length"])
                    sums[i] = 0.0
        return np.concatenate([x.ravel().astype(np.float64) for x in out]), episodes

    (a, ep_a), (b, _) = trace(5), trace(5)
    assert np.array_equal(a, b) and all(len(e) >= 2 for e in ep_a)
