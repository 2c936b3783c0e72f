"""MuJoCo on EnvPool (--env_engine envpool, sf_envs/envpool/mujoco.py) against the native engine (gymnasium's envs):
the same task under a seeded random policy, the multi-agent contract, seeds, the time limit's final observation,
rendering refused in one line; and, end to end, a run trained on EnvPool evaluated on both engines."""
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("mujoco", reason="mujoco is not installed (pip install -e .[mujoco])")
pytest.importorskip("envpool", reason="EnvPool is not installed (pip install -e .[envpool])")

from env_test_helpers import episode_reports, pool_trace  # noqa: E402
from sf_envs.envpool.mujoco import EnvPoolMujoco  # noqa: E402
from sf_envs.errors import EnvUnavailableError  # noqa: E402
from sf_envs.mujoco.envs import MUJOCO_ENVS  # noqa: E402
from sf_envs.params import env_cfg  # noqa: E402
from sf_envs.registry import env_spec, make_env  # noqa: E402


def pool_cfg(name="mujoco_hopper", agents=4, seed=1):
    return env_cfg(name, seed=seed, env_engine="envpool", env_agents=agents)


def random_actions(rng, space, n):
    """A seeded random policy that samples up to 3x past the bounds, as a Gaussian policy may (the actuators clamp, the
    control cost is charged for the sample on both engines)."""
    return rng.uniform(3 * space.low, 3 * space.high, size=(n, space.shape[0])).astype(np.float32)


@pytest.mark.parametrize("name,episodes", [("mujoco_hopper", 200), ("mujoco_halfcheetah", 24)])
def test_the_same_task_on_both_engines_under_a_random_policy(name, episodes):
    """Hopper (falls end its episodes: termination) and HalfCheetah (1,000 steps: the time limit, the control cost of
    samples past the bounds): the mean return and length agree within 4 standard errors."""
    pool_env, native_env = make_env(pool_cfg(name, agents=8)), make_env(env_cfg(name, seed=1))
    pool = episode_reports(pool_env, episodes, lambda rng: list(random_actions(rng, pool_env.action_space, 8)))
    native = episode_reports(native_env, episodes, lambda rng: random_actions(rng, native_env.action_space, 1)[0])
    for key in ("reward", "length"):
        a, b = np.array([e[key] for e in pool]), np.array([e[key] for e in native])
        se = np.sqrt(a.var(ddof=1) / episodes + b.var(ddof=1) / episodes) + 1e-9
        assert abs(a.mean() - b.mean()) <= 4 * se, (key, a.mean(), b.mean(), se)
    if name == "mujoco_halfcheetah":
        assert {e["length"] for e in pool} == {1000}


def test_spaces_and_the_multiagent_contract():
    cfg = pool_cfg("mujoco_hopper", agents=3)
    spec = env_spec("mujoco_hopper", cfg)
    assert spec.num_agents == 3 and "3 envs per pool" in spec.description
    env, native = make_env(cfg), make_env(env_cfg("mujoco_hopper", seed=1))
    assert env.observation_space == native.observation_space and env.action_space == native.action_space
    assert env.num_agents == 3 and env.is_multiagent
    obs, infos = env.reset()
    assert len(obs) == 3 and len(infos) == 3 and all(o["obs"].dtype == np.float32 for o in obs)
    falls = 0
    for _ in range(200):
        obs, rewards, terminated, truncated, infos = env.step([np.ones(3, np.float32)] * 3)
        assert len(obs) == len(rewards) == len(terminated) == len(truncated) == len(infos) == 3
        assert all(isinstance(r, float) for r in rewards)
        for o, t, i in zip(obs, terminated, infos):
            if t:  # a fall: reported, and the next episode's first observation (a standing hopper) returned with it
                falls += 1
                assert "episode" in i and "final_obs" not in i and abs(float(o["obs"][0]) - 1.25) < 0.01
    assert falls >= 3
    env.close()
    native.close()


def test_a_seed_repeats_its_episodes_and_another_env_index_plays_others():
    def trace(index: int) -> np.ndarray:
        env = EnvPoolMujoco("mujoco_hopper", pool_cfg(agents=2, seed=7), env_index=index)
        return pool_trace(env, 300, lambda rng: list(random_actions(rng, env.action_space, 2)))

    a = trace(0)
    assert np.array_equal(a, trace(0))
    assert not np.array_equal(a, trace(1))


def test_the_time_limit_keeps_the_final_observation():
    env = make_env(pool_cfg("mujoco_halfcheetah", agents=2))
    env.reset()
    for step in range(1, 1002):
        obs, _, terminated, truncated, infos = env.step([np.zeros(6, np.float32)] * 2)
        if any(truncated):
            break
    assert step == 1000 and truncated == [True, True] and terminated == [False, False]
    for o, info in zip(obs, infos):
        assert info["episode"]["length"] == 1000 and info["final_obs"]["obs"].shape == (17,)
        assert not np.array_equal(o["obs"], info["final_obs"]["obs"])  # the next episode has begun
    env.close()


def test_every_mujoco_env_has_its_envpool_task_and_rendering_is_refused_in_one_line():
    import envpool
    assert set(MUJOCO_ENVS.values()) <= set(envpool.list_all_envs())
    with pytest.raises(EnvUnavailableError, match=r"cannot be rendered .* --env_engine native"):
        make_env(pool_cfg(), render_mode="rgb_array")


@pytest.mark.e2e
def test_trained_on_envpool_evaluates_on_both_engines(tmp_path):
    from e2e_helpers import ROOT

    def run(*args, timeout=300):
        r = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r.stdout + r.stderr

    out = run(str(ROOT / "train.py"), "--env", "mujoco_hopper", "--env_engine", "envpool", "--env_agents", "8",
              "--num_workers", "2", "--num_envs_per_worker", "2", "--train_for_env_steps", "20000", "--experiment",
              "e2e", "--train_dir", str(tmp_path), "--seed", "3", "--device", "cpu")
    assert "8 agents per env (32 agents in all)" in out, out[-3000:]
    # ppo: every agent's rollout of 64 (2,048 samples) in minibatches of the preset's 128, 10 epochs
    assert "collect 2048 samples, one rollout of every env, then 160 SGD steps" in out, out[-3000:]
    exp = tmp_path / "e2e"
    for engine in ("envpool", "native"):
        assert "Policy 0: 3 episodes" in run("-m", "sf.eval", str(exp), "--episodes", "3", "--env_engine", engine)
    assert sorted(p.name for p in exp.glob("eval_*.csv")) == ["eval_latest_seed0_3ep.csv",
                                                               "eval_latest_seed0_3ep_envpool.csv"]
