"""Learning runs (slow; `pytest -m slow`): the real system reaches a reward threshold on small envs.

The doom_basic learning target (>= 0.75 within 600k frames) is measured by
benchmarks/learning_doom_basic.py; these are the fast ones a CI-sized machine can afford.
"""
import pytest

from sf.runner.stats import read_event_scalars

pytestmark = pytest.mark.e2e


@pytest.mark.slow
@pytest.mark.parametrize("env, frames, threshold, extra", [
    ("test_corridor", 60_000, 0.8, []),  # optimal 0.92, random about -0.26
    ("test_memory", 150_000, 0.9,
     ["--rollout", "8", "--recurrence", "8", "--batch_size", "256"]),  # needs the RNN: memoryless policies get 0.5
])
def test_reaches_reward_threshold(tmp_path, entry, env, frames, threshold, extra):
    res = entry("train.py", "--env", env, "--experiment", "learn", "--train_dir", tmp_path, "--num_workers", "2",
                "--train_for_env_steps", frames, "--experiment_summaries_interval", "2", "--device", "cpu",
                "--seed", "1", *extra, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:]
    rewards = [r for _, r in read_event_scalars(tmp_path / "learn")["reward/reward"]]
    assert max(rewards[-3:]) >= threshold, rewards[-10:]
