"""MuJoCo continuous-control envs (gymnasium's, on the `mujoco` package) under Sample Factory's names: see
mujoco_env.py; envs.py has the names."""
