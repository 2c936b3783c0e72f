"""MuJoCo env of the contract: gymnasium's env (sf_envs/mujoco/envs.py maps Sample Factory's names to its ids)
through the gymnasium adapter (sf_envs/gym_env.py).

- observations: {"obs": float32 [D]} (the env's float64 vector);
- actions: Box float32 [A] with the env's bounds. The Gaussian policy samples outside them and the env is stepped with
  the sample as it is, as Sample Factory does: MuJoCo's actuators clamp the control to the bounds (the same motion),
  while the reward's control cost is charged for the sample, so returns compare with Sample Factory's;
- episodes: the env's time limit (1000 steps; Reacher 50) truncates, falls terminate; info["episode"] holds the
  return and the length (frameskip 1);
- rendering for videos (render_mode "rgb_array", 480x480; the camera follows the runners and swimmers) is headless:
  with MUJOCO_GL unset, EGL where libEGL is installed (Mesa's software renderer works without a GPU), else OSMesa.
"""
from __future__ import annotations

import ctypes.util
import importlib.util
import os
import warnings
from typing import Optional

import gymnasium as gym

from sf_envs.errors import EnvUnavailableError
from sf_envs.gym_env import adapt_env
from sf_envs.mujoco.envs import MUJOCO_ENVS, TRACKING_CAMERA

INSTALL_HINT = "pip install 'mujoco>=2.3.3' imageio (or pip install -e '.[mujoco]')"


def check_mujoco(env_name: str) -> None:
    """EnvUnavailableError (one line) when the packages gymnasium's MuJoCo envs import are missing."""
    missing = [m for m in ("mujoco", "imageio") if importlib.util.find_spec(m) is None]
    if missing:
        raise EnvUnavailableError(f"env {env_name} needs {' and '.join(missing)} (MuJoCo): {INSTALL_HINT}")


def offscreen_gl() -> str:
    """The MUJOCO_GL backend for rendering without a display: the user's MUJOCO_GL if set, else egl where libEGL is
    installed, else osmesa where libOSMesa is. EnvUnavailableError (one line) when there is neither."""
    if os.environ.get("MUJOCO_GL"):
        return os.environ["MUJOCO_GL"]
    for backend, lib in (("egl", "EGL"), ("osmesa", "OSMesa")):
        if ctypes.util.find_library(lib):
            return backend
    raise EnvUnavailableError("rendering MuJoCo without a display needs EGL or OSMesa: apt-get install libegl1 "
                              "libegl-mesa0 libgl1-mesa-dri (or libosmesa6), or set MUJOCO_GL")


def make_mujoco_env(name: str, cfg=None, env_index: int = 0, render_mode: Optional[str] = None) -> gym.Env:
    env_id = MUJOCO_ENVS[name]
    check_mujoco(name)
    if render_mode == "rgb_array":
        os.environ["MUJOCO_GL"] = offscreen_gl()  # read by gymnasium's renderer when the first frame is drawn
    with warnings.catch_warnings():  # Sample Factory's v4 ids are chosen on purpose: not "out of date" here
        warnings.filterwarnings("ignore", message=".*is out of date", category=DeprecationWarning)
        camera = {"camera_name": "track"} if render_mode and name in TRACKING_CAMERA else {}
        env = gym.make(env_id, disable_env_checker=True, render_mode=render_mode, **camera)
    return adapt_env(env, cfg, env_index)
