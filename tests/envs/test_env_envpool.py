"""Atari on EnvPool (--env_engine envpool, sf_envs/envpool/atari.py) against our ALE engine: the same game under a
seeded random policy, the multi-agent contract, seeds, truncation, the one-line errors; and, end to end, a run
trained on EnvPool whose rollout worker is killed and replaced, then evaluated and watched on both engines and
exported."""
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("ale_py", reason="ale-py is not installed (pip install ale-py)")
pytest.importorskip("envpool", reason="EnvPool is not installed (pip install -e .[envpool])")

from env_test_helpers import episode_reports, pool_trace  # noqa: E402
from sf_envs.atari.atari_env import AtariEnv  # noqa: E402
from sf_envs.envpool.atari import EnvPoolAtari, check_envpool_atari  # noqa: E402
from sf_envs.errors import EnvUnavailableError  # noqa: E402
from sf_envs.params import env_cfg  # noqa: E402
from sf_envs.registry import env_spec, make_env  # noqa: E402

pytestmark = pytest.mark.atari


def pool_cfg(name="atari_breakout", agents=4, seed=1, **kw):
    return env_cfg(name, seed=seed, env_engine="envpool", env_agents=agents, **kw)


def test_the_same_game_on_both_engines_under_a_random_policy():
    """Breakout, 60 games a side: the mean full-game return and length agree within 4 standard errors (the engines
    differ only where docs/envs.md's table says: no-op starts, the restart after a lost life)."""
    n = 60
    pool = episode_reports(make_env(pool_cfg(agents=8)), n, lambda rng: rng.integers(0, 4, size=8))
    ale = episode_reports(make_env(env_cfg("atari_breakout", seed=1)), n, lambda rng: int(rng.integers(0, 4)))
    for key in ("reward", "length"):
        a, b = np.array([g[key] for g in pool]), np.array([g[key] for g in ale])
        se = np.sqrt(a.var(ddof=1) / n + b.var(ddof=1) / n)
        assert abs(a.mean() - b.mean()) <= 4 * se, (key, a.mean(), b.mean(), se)
    assert all(g["score"] == g["reward"] for g in pool)  # the unclipped return of the whole game (every life)
    assert np.mean([g["reward"] for g in pool]) > 0.5  # a random policy scores in Breakout: real games were played


def test_spaces_and_the_multiagent_contract():
    cfg = pool_cfg(agents=3)
    assert env_spec("atari_breakout", cfg).num_agents == 3 and env_spec("atari_breakout", cfg).frameskip == 4
    env, ale = make_env(cfg), AtariEnv("breakout", env_cfg("atari_breakout", seed=1))
    assert env.observation_space == ale.observation_space and env.action_space == ale.action_space
    assert env.num_agents == 3 and env.is_multiagent
    obs, infos = env.reset()
    assert len(obs) == 3 and len(infos) == 3
    for o in obs:
        assert o["obs"].shape == (4, 84, 84) and o["obs"].dtype == np.uint8
        assert np.array_equal(o["obs"][0], o["obs"][3])  # a new game: the stack holds its first frame
    first = obs[0]["obs"]
    assert 0 < first.mean() < 255
    ale_obs, _ = ale.reset(seed=1)
    assert abs(float(first.mean()) - float(ale_obs["obs"].mean())) < 10  # the same screen, grey, 84x84
    lives_lost = 0
    for _ in range(400):
        obs, rewards, terminated, truncated, infos = env.step([3, 3, 3])  # LEFT: every ball is missed
        assert len(obs) == len(rewards) == len(terminated) == len(truncated) == len(infos) == 3
        assert all(isinstance(r, float) and r in (0.0, 1.0) for r in rewards)  # clipped to their sign
        lives_lost += sum(t and "episode" not in i for t, i in zip(terminated, infos))
    assert lives_lost >= 3  # a lost life is done without a report; the game goes on
    env.close()


def test_a_seed_repeats_its_games_and_another_env_index_plays_others():
    def trace(index: int) -> np.ndarray:
        env = EnvPoolAtari("breakout", pool_cfg(agents=2, seed=7), env_index=index)
        return pool_trace(env, 200, lambda rng: rng.integers(0, 4, size=2))

    a = trace(0)
    assert np.array_equal(a, trace(0))
    assert not np.array_equal(a, trace(1))


def test_a_truncated_game_keeps_its_final_frame_and_reports_the_game():
    env = make_env(pool_cfg(agents=2, atari_max_episode_frames=200, atari_episodic_life=False))
    env.reset()
    for step in range(1, 60):
        obs, _, terminated, truncated, infos = env.step([0, 0])  # NOOP: no life is lost in 50 steps
        if any(truncated):
            break
    assert step == 50 and truncated == [True, True] and terminated == [False, False]
    for o, info in zip(obs, infos):
        assert info["episode"]["length"] == 200
        assert info["final_obs"]["obs"].shape == (4, 84, 84)  # the learner bootstraps from it
        assert np.array_equal(o["obs"][0], o["obs"][3])  # and the next game has begun
    env.close()


def test_one_line_errors(monkeypatch):
    with pytest.raises(EnvUnavailableError, match=r"steps the atari_\* and mujoco_\* envs here, not 'doom_basic'"):
        env_spec("doom_basic", pool_cfg("doom_basic"))
    monkeypatch.setitem(sys.modules, "envpool", None)  # as if it were not installed
    with pytest.raises(EnvUnavailableError, match=r"needs EnvPool: pip install envpool==1\.2\.5"):
        check_envpool_atari("breakout")


@pytest.mark.e2e
def test_train_py_refuses_another_family_in_one_line(tmp_path):
    from e2e_helpers import ROOT
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--env", "doom_basic", "--env_engine", "envpool",
                        "--train_dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--env_engine envpool" in lines[0] and "Traceback" not in r.stderr, r.stderr


@pytest.mark.e2e
def test_trained_on_envpool_survives_a_killed_worker_and_plays_on_both_engines(tmp_path):
    from e2e_helpers import ROOT, child_pids, start_train, wait_for

    log = tmp_path / "log.txt"
    p = start_train(["--env", "atari_breakout", "--env_engine", "envpool", "--env_agents", "4", "--experiment", "e2e",
                     "--train_dir", str(tmp_path), "--num_workers", "2", "--num_envs_per_worker", "2", "--rollout",
                     "16", "--batch_size", "128", "--num_batches_per_epoch", "1", "--hidden_size", "64",
                     "--report_interval_sec", "1", "--train_for_env_steps", "40000", "--device", "cpu"], log)
    try:
        wait_for(lambda: re.search(r"Policy version: [1-9]", log.read_text()), 150, "training to start", log)
        os.kill(child_pids(log)["rollout_worker_1"], signal.SIGKILL)
        assert p.wait(timeout=300) == 0, log.read_text()[-4000:]
    finally:
        p.kill()
    text = log.read_text()
    assert "4 agents per env (16 agents in all)" in text
    assert "Restarted rollout_worker_1" in text and "every slot accounted for exactly once" in text
    exp = tmp_path / "e2e"

    def run(*args, timeout=300):
        r = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r.stdout + r.stderr

    for engine in ("envpool", "native"):
        out = run("-m", "sf.eval", str(exp), "--episodes", "4", "--env_engine", engine)
        assert "Policy 0: 4 episodes" in out, out
    # the default CSV names the engine when it is not the env's own: both evaluations kept
    assert sorted(p.name for p in exp.glob("eval_*.csv")) == ["eval_latest_seed0_4ep.csv",
                                                               "eval_latest_seed0_4ep_envpool.csv"]
    out = run(str(ROOT / "enjoy.py"), "--env", "atari_breakout", "--experiment", "e2e", "--train_dir", str(tmp_path),
              "--max_num_episodes", "1", "--save_video", "--video_frames", "50")
    assert "Video: " in out and list(exp.glob("*.mp4")), out
    pytest.importorskip("onnx")
    out = run("-m", "sf.export", str(exp))
    assert "ONNX" in out or list(exp.rglob("*.onnx")), out
