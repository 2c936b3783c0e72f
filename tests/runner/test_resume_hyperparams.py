"""End to end: hyperparameters given as flags when a run is resumed are the ones its optimizer trains with (not the
checkpoint's), as config.json records them: train.py for real, tiny budgets, asynchronous and hts modes."""
import json

import pytest
import torch

from e2e_helpers import train_args

pytestmark = pytest.mark.e2e

FLAGS = {"learning_rate": 5e-4, "adam_beta1": 0.8, "adam_beta2": 0.99, "adam_eps": 1e-7}


def latest_checkpoint(exp):
    return torch.load(sorted((exp / "checkpoint_p0").glob("checkpoint_*.pth"))[-1], weights_only=True)


@pytest.mark.parametrize("mode", ["async", "hts"])
def test_flags_given_on_resume_reach_the_optimizer(tmp_path, entry, mode):
    base = ["--num_workers", "1", "--use_rnn", "False", "--sync_mode", mode, "--seed", "4"]
    res = entry("train.py", *train_args(tmp_path, "test_image", *base, "--train_for_env_steps", "1000"), timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    exp = tmp_path / "e2e"
    first = latest_checkpoint(exp)
    group = first["optimizer"]["param_groups"][0]  # the preset's values: each one changed by the flags
    assert group["lr"] != 5e-4 and group["betas"][0] != 0.8 and group["betas"][1] != 0.99 and group["eps"] != 1e-7

    given = [x for k, v in FLAGS.items() for x in (f"--{k}", str(v))]
    res = entry("train.py", *train_args(tmp_path, "test_image", "--train_for_env_steps", "2000", *given), timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Resumed from checkpoint" in res.stdout
    later = latest_checkpoint(exp)
    assert later["env_steps"] > first["env_steps"]
    saved = json.loads((exp / "config.json").read_text())
    assert {k: saved[k] for k in FLAGS} == FLAGS and saved["sync_mode"] == mode
    for group in later["optimizer"]["param_groups"]:
        assert (group["lr"], tuple(group["betas"]), group["eps"]) == (5e-4, (0.8, 0.99), 1e-7)
