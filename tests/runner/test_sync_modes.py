"""--sync_mode hts / ppo end to end (HTS-RL's guarantee: same seed and config => bitwise-identical weights, across
repeated runs and across layouts of workers x envs with the same number of envs), the lag each mode guarantees, and
--seed resolution. Real train.py runs on doom_basic with tiny budgets."""
import json
import re

import pytest
import torch

from sf.learning.checkpoint import weights_sha256
from sf.runner.stats import read_event_scalars

pytestmark = [pytest.mark.doom, pytest.mark.e2e]

# 8 envs x rollout 32 x frameskip 4 = 1024 env frames per training batch: 4 batches, 2 minibatches x 4 epochs each
BUDGET = 4000


def run(entry, tmp_path, name, mode, seed, workers, envs, *extra):
    args = ["--env", "doom_basic", "--experiment", name, "--train_dir", str(tmp_path), "--sync_mode", mode,
            "--num_workers", workers, "--num_envs_per_worker", envs, "--train_for_env_steps", BUDGET,
            "--experiment_summaries_interval", "1", "--device", "cpu", *extra]
    if seed is not None:
        args += ["--seed", seed]
    res = entry("train.py", *args, timeout=240)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    digests = re.findall(r"Final weights sha256: ([0-9a-f]{64}) \(policy version (\d+), (\d+) env frames\)", out)
    assert len(digests) == 1, out[-3000:]
    return digests[0], out


def final_checkpoint_digest(exp_dir) -> str:
    """SHA-256 of the weights in the newest checkpoint file, loaded the way enjoy.py does."""
    from sf.cfg import parse_cfg
    from sf.model.actor_critic import create_actor_critic
    from sf_envs.registry import make_env
    cfg = parse_cfg(["--env", "doom_basic", "--experiment", exp_dir.name, "--train_dir", str(exp_dir.parent)],
                    mode="enjoy")
    env = make_env(cfg, 0)
    model = create_actor_critic(cfg, env.observation_space, env.action_space)
    env.close()
    newest = max((exp_dir / "checkpoint_p0").glob("checkpoint_*.pth"))
    model.load_state_dict(torch.load(newest, weights_only=True)["model"])
    return weights_sha256(model)


def test_hts_same_seed_same_weights_across_runs_and_layouts(entry, tmp_path):
    """The first run draws its seed (none given): it is saved in config.json and printed, and every other run is given
    it (so they also show that the saved seed repeats the run)."""
    (digest, version, frames), out = run(entry, tmp_path, "a", "hts", None, 2, 4)
    seed = json.loads((tmp_path / "a" / "config.json").read_text())["seed"]
    assert isinstance(seed, int) and f"--seed {seed} (drawn at random" in out and f"seed {seed}" in out
    assert int(frames) == 4096  # the budget ends at the batch boundary that reaches it: 4 batches of 1024
    assert "Mode: hts" in out and "policy lag exactly 1 batch" in out
    # (separate runs of other layouts: the same weights also show that a run repeats itself)
    for name, workers, envs, extra in (("w1x8", 1, 8, ()), ("w4x2", 4, 2, ()),
                                       ("serial", 2, 4, ("--serial_mode", "True"))):
        assert run(entry, tmp_path, name, "hts", seed, workers, envs, *extra)[0] == (digest, version, frames), name
    assert final_checkpoint_digest(tmp_path / "a") == digest  # the checkpoint on disk holds exactly those weights
    assert run(entry, tmp_path, "other_seed", "hts", seed ^ 1, 2, 4)[0][0] != digest  # another seed: other weights

    # one point per batch: the first trains on the initial weights' data (HTS-RL's theta_-1 = theta_0), then exactly 1
    # (each batch's data was also checked by the learner itself: samples of another version stop the run)
    lag = [v for _, v in read_event_scalars(tmp_path / "a")["train/policy_lag_batches"]]
    assert lag == [0.0, 1.0, 1.0, 1.0], lag


def test_ppo_same_seed_same_weights_and_lag_zero(entry, tmp_path):
    first, out = run(entry, tmp_path, "a", "ppo", 11, 2, 4)
    assert "Mode: ppo" in out and "policy lag 0 batches" in out
    assert run(entry, tmp_path, "b", "ppo", 11, 4, 2)[0] == first
    scalars = read_event_scalars(tmp_path / "a")
    assert [v for _, v in scalars["train/policy_lag_batches"]] == [0.0] * 4
    assert min(v for _, v in scalars["train/policy_lag_min"]) == 0.0  # each batch's first SGD step is on-policy


@pytest.mark.parametrize("flags,message", [
    (["--sync_mode", "hts", "--batch_size", "96"], "--batch_size (96) must divide it (or be at least 256)"),
    (["--sync_mode", "ppo", "--sampler_only", "True"], "--sampler_only measures the asynchronous sampler alone"),
    (["--sync_mode", "bogus"], "--sync_mode"),
])
def test_sync_mode_bad_input_is_one_line(entry, tmp_path, flags, message):
    res = entry("train.py", "--env", "doom_basic", "--train_dir", tmp_path, "--num_workers", "2",
                "--num_envs_per_worker", "4", *flags)
    assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not any(tmp_path.iterdir())  # nothing written
