"""The "Your own env" example of docs/envs.md as a script: a user env registered without editing the library."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gymnasium as gym  # noqa: E402

from sf.cfg import cli_main  # noqa: E402
from sf_envs.registry import register_env  # noqa: E402


def make_cartpole(cfg, env_index, render_mode=None):
    return gym.make("CartPole-v1", render_mode=render_mode)  # plain Box observations: adapted by make_env


register_env("my_cartpole", make_cartpole, family="custom", frameskip=1)

if __name__ == "__main__":
    from sf.runner.startup.entry import run_training
    sys.exit(cli_main(run_training, mode="train", prog="custom_train.py"))
