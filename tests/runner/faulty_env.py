"""A gymnasium env that raises after a few steps: used to check that a crashing env inside a rollout
worker is reported with its traceback and stops the run (loaded through `--env gym:faulty_env:Faulty-v0`)."""
import gymnasium as gym
import numpy as np


class FaultyEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fail_after: int = 300):
        self.fail_after, self.steps = fail_after, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps > self.fail_after:
            raise RuntimeError("FaultyEnv exploded on purpose")
        return np.zeros(4, np.float32), 0.0, self.steps % 20 == 0, False, {}


gym.register("Faulty-v0", entry_point=FaultyEnv)
