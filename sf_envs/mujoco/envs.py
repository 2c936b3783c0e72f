"""The MuJoCo env names: Sample Factory's (sf_examples/mujoco/mujoco_utils.py) and the gymnasium ids they stand for.
Importing this module imports neither mujoco nor gymnasium's MuJoCo envs."""
from __future__ import annotations

# Sample Factory's ids (the v4 envs) so that returns compare with its published runs. Pusher-v4 refuses mujoco>=3
# (gymnasium asks for mujoco<3 there), so mujoco_pusher is Pusher-v5.
MUJOCO_ENVS = {
    "mujoco_hopper": "Hopper-v4",
    "mujoco_halfcheetah": "HalfCheetah-v4",
    "mujoco_humanoid": "Humanoid-v4",
    "mujoco_ant": "Ant-v4",
    "mujoco_standup": "HumanoidStandup-v4",
    "mujoco_doublependulum": "InvertedDoublePendulum-v4",
    "mujoco_pendulum": "InvertedPendulum-v4",
    "mujoco_reacher": "Reacher-v4",
    "mujoco_walker": "Walker2d-v4",
    "mujoco_pusher": "Pusher-v5",
    "mujoco_swimmer": "Swimmer-v4",
}

# Envs whose model has a camera "track" following the body: videos use it (gymnasium's default camera stays where the
# episode started, and runners leave the picture).
TRACKING_CAMERA = {"mujoco_hopper", "mujoco_halfcheetah", "mujoco_humanoid", "mujoco_ant", "mujoco_standup",
                   "mujoco_walker", "mujoco_swimmer"}
