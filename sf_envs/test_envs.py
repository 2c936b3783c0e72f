"""Tiny built-in envs for the system's end-to-end tests and fast learning tests (no extra package).

| env           | obs                    | actions               | episode     | optimal return | random policy        |
|---------------|------------------------|-----------------------|-------------|----------------|----------------------|
| test_corridor | float32 [10] one-hot   | Discrete(3)           | <= 50 steps | 0.92 (9 steps) | about -0.26          |
| test_image    | uint8 [3, 36, 48]      | MultiDiscrete([3, 2]) | 16 steps    | 16.0           | 6.67                 |
| test_box      | float32 [2]            | Box(-1, 1, (1,))      | 16 steps    | 16.0           | 5.33                 |
| test_memory   | float32 [4]            | Discrete(2)           | 6 steps     | 1.0            | 0.5 (memoryless too) |
| test_race     | float32 [20], 2 agents | Discrete(3) each      | <= 50 steps | 0.92 each      | about -0.26 each     |
| test_masked   | float32 [4], mask [4]  | Discrete(4), masked   | 16 steps    | 16.0           | 9.78 (among valid)   |

test_masked has an "action_mask" observation key (int8 MultiBinary(4), 1 = valid) and raises on a masked action, so a
run that trains on it without an env failure proves masks are honoured.

test_race is the multi-agent env of the contract (docs/architecture.md): lists in and out, per-agent dones, each
agent's episode its own (an agent that reaches the goal starts its next episode while the other plays on), auto-reset,
infos[i]["final_obs"] when an agent's episode is cut by the time limit, infos[i]["episode"] per agent.

All are deterministic given the seed of reset() (or, when reset() gets none, the seed derived from
cfg.seed and env_index; unseeded when cfg.seed is None) and cost microseconds per step. make_env wraps them in
sf_envs.episode_stats.EpisodeStatistics (gymnasium's RecordEpisodeStatistics), which reports
info["episode"] = {"reward", "length"} at the end of every episode (frameskip 1: length = steps).
"""
from __future__ import annotations

from typing import Optional

import gymnasium as gym
import numpy as np

from sf_envs.utils import cfg_seed, derive_seed


class _TestEnv(gym.Env):
    __test__ = False  # not pytest test classes, despite the names
    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        self.render_mode = render_mode
        self.num_agents = 1
        self.is_multiagent = False
        self._first_seed = derive_seed(cfg_seed(cfg), env_index)
        self._steps = 0  # steps of this episode (the time limits)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        if seed is None and self._first_seed is not None:
            seed = self._first_seed
        self._first_seed = None
        super().reset(seed=seed)
        self._steps = 0
        return self._reset(), {}

    def _reset(self):
        """The first observation of an episode (each env's own)."""
        raise NotImplementedError

    def _finish(self, obs, reward: float, terminated: bool, truncated: bool):
        self._steps += 1
        return obs, float(reward), terminated, truncated, {}


class TestCorridor(_TestEnv):
    """A 10-cell corridor: walk right to the goal. Optimal return 0.92 in 9 steps.

    Start at cell 0, goal at cell 9. Actions: 0 left, 1 stay, 2 right. Reward -0.01 per step, +1.0 on the
    step that reaches the goal (episode terminated); truncated after 50 steps. Observation: one-hot cell.
    """

    N, MAX_STEPS, STEP_REWARD, GOAL_REWARD = 10, 50, -0.01, 1.0
    OPTIMAL_RETURN = GOAL_REWARD + (N - 2) * STEP_REWARD  # 0.92

    def __init__(self, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        super().__init__(cfg, env_index, render_mode)
        self.observation_space = gym.spaces.Dict(obs=gym.spaces.Box(0.0, 1.0, (self.N,), np.float32))
        self.action_space = gym.spaces.Discrete(3)
        self._eye = np.eye(self.N, dtype=np.float32)
        self.pos = 0

    def _reset(self):
        self.pos = 0
        return {"obs": self._eye[self.pos].copy()}

    def step(self, action):
        a = int(np.asarray(action).reshape(-1)[0])
        self.pos = min(max(self.pos + a - 1, 0), self.N - 1)
        terminated = self.pos == self.N - 1
        reward = self.GOAL_REWARD if terminated else self.STEP_REWARD
        truncated = not terminated and self._steps + 1 >= self.MAX_STEPS
        return self._finish({"obs": self._eye[self.pos].copy()}, reward, terminated, truncated)

    def render(self):
        img = np.zeros((8, 8 * self.N, 3), np.uint8)
        img[:, 8 * (self.N - 1):] = (0, 160, 0)
        img[:, 8 * self.pos: 8 * self.pos + 8] = (220, 220, 220)
        return img


class TestImage(_TestEnv):
    """Image cue: name the color (3) and half (2) of a bar. Optimal return 16.0, random 6.67.

    Each step shows a random bar in one of the 3 color channels, in the top or bottom half of a [3, 36, 48]
    image (the smallest size the conv encoders of sf/model take). Action heads: [color 0-2, half 0-1];
    reward 0.5 per correct head. 16 steps per episode.
    """

    H, W, STEPS = 36, 48, 16
    OPTIMAL_RETURN = float(STEPS)

    def __init__(self, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        super().__init__(cfg, env_index, render_mode)
        self.observation_space = gym.spaces.Dict(obs=gym.spaces.Box(0, 255, (3, self.H, self.W), np.uint8))
        self.action_space = gym.spaces.MultiDiscrete([3, 2])
        self._images = np.zeros((3, 2, 3, self.H, self.W), np.uint8)
        for c in range(3):
            for half in range(2):
                y0 = 2 + half * self.H // 2
                self._images[c, half, c, y0:y0 + self.H // 2 - 4, 4:self.W - 4] = 255
        self.cue = (0, 0)

    def _new_cue(self):
        self.cue = (int(self.np_random.integers(3)), int(self.np_random.integers(2)))
        return {"obs": self._images[self.cue].copy()}

    def _reset(self):
        return self._new_cue()

    def step(self, action):
        a = np.asarray(action).reshape(-1)
        reward = 0.5 * (int(a[0]) == self.cue[0]) + 0.5 * (int(a[1]) == self.cue[1])
        obs = self._new_cue()
        return self._finish(obs, reward, self._steps + 1 >= self.STEPS, False)

    def render(self):
        return np.ascontiguousarray(self._images[self.cue].transpose(1, 2, 0))


class TestBox(_TestEnv):
    """Continuous control: output the target shown in the observation. Optimal return 16.0, random 5.33.

    Observation [target, 1.0] with target uniform in [-1, 1]; action Box(-1, 1, (1,)); reward
    1 - |clip(action) - target|; 16 steps per episode.
    """

    STEPS = 16
    OPTIMAL_RETURN = float(STEPS)

    def __init__(self, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        super().__init__(cfg, env_index, render_mode)
        self.observation_space = gym.spaces.Dict(obs=gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.target = 0.0

    def _new_target(self):
        self.target = float(self.np_random.uniform(-1.0, 1.0))
        return {"obs": np.array([self.target, 1.0], np.float32)}

    def _reset(self):
        return self._new_target()

    def step(self, action):
        a = float(np.clip(np.asarray(action, np.float64).reshape(-1)[0], -1.0, 1.0))
        reward = 1.0 - abs(a - self.target)
        obs = self._new_target()
        return self._finish(obs, reward, self._steps + 1 >= self.STEPS, False)

    def render(self):
        img = np.zeros((8, 64, 3), np.uint8)
        img[:, int((self.target + 1) * 31.5)] = 255
        return img


class TestMemory(_TestEnv):
    """Memory: recall at the last step a cue shown only at the first. Optimal 1.0, memoryless 0.5.

    Observation [cue_a, cue_b, query, t/5]: the cue (one of two, one-hot) is visible at step 0 only; at
    step 5 query = 1 and the action (Discrete(2)) must name the cue: reward 1.0 if right. Actions at other
    steps do nothing. 6 steps per episode. Needs a recurrent policy.
    """

    STEPS = 6
    OPTIMAL_RETURN = 1.0

    def __init__(self, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        super().__init__(cfg, env_index, render_mode)
        self.observation_space = gym.spaces.Dict(obs=gym.spaces.Box(0.0, 1.0, (4,), np.float32))
        self.action_space = gym.spaces.Discrete(2)
        self.cue = 0
        self.t = 0

    def _obs(self):
        o = np.zeros(4, np.float32)
        if self.t == 0:
            o[self.cue] = 1.0
        if self.t == self.STEPS - 1:
            o[2] = 1.0
        o[3] = self.t / (self.STEPS - 1)
        return {"obs": o}

    def _reset(self):
        self.cue = int(self.np_random.integers(2))
        self.t = 0
        return self._obs()

    def step(self, action):
        reward = 0.0
        if self.t == self.STEPS - 1:
            reward = 1.0 if int(np.asarray(action).reshape(-1)[0]) == self.cue else 0.0
        self.t += 1
        done = self.t >= self.STEPS
        obs = self._obs() if not done else {"obs": np.zeros(4, np.float32)}
        return self._finish(obs, reward, done, False)

    def render(self):
        img = np.zeros((8, 8 * self.STEPS, 3), np.uint8)
        img[:, 8 * min(self.t, self.STEPS - 1): 8 * min(self.t, self.STEPS - 1) + 8] = 255
        return img


class TestMasked(_TestEnv):
    """Action masks: pick the cued action among the valid ones; a masked action raises. Optimal 16.0.

    Each step 1 to 3 of the 4 actions are valid (observation key "action_mask", int8 0/1) and one of them is cued
    (one-hot "obs"); reward 1.0 for the cued action, 0.0 for another valid one. 16 steps per episode. A uniform choice
    among the valid actions earns (1 + 1/2 + 1/3) / 3 per step: 9.78 per episode.
    """

    N, STEPS = 4, 16
    OPTIMAL_RETURN = float(STEPS)

    def __init__(self, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        super().__init__(cfg, env_index, render_mode)
        self.observation_space = gym.spaces.Dict(obs=gym.spaces.Box(0.0, 1.0, (self.N,), np.float32),
                                                 action_mask=gym.spaces.MultiBinary(self.N))
        self.action_space = gym.spaces.Discrete(self.N)
        self.mask = np.ones(self.N, np.int8)
        self.cue = 0

    def _new_step(self):
        valid = self.np_random.permutation(self.N)[:int(self.np_random.integers(1, self.N))]
        self.mask = np.zeros(self.N, np.int8)
        self.mask[valid] = 1
        self.cue = int(valid[0])
        obs = np.zeros(self.N, np.float32)
        obs[self.cue] = 1.0
        return {"obs": obs, "action_mask": self.mask.copy()}

    def _reset(self):
        return self._new_step()

    def step(self, action):
        a = int(np.asarray(action).reshape(-1)[0])
        if not self.mask[a]:
            raise RuntimeError(f"test_masked: action {a} is masked (action_mask {self.mask.tolist()})")
        reward = 1.0 if a == self.cue else 0.0
        return self._finish(self._new_step(), reward, self._steps + 1 >= self.STEPS, False)

    def render(self):
        img = np.zeros((8, 8 * self.N, 3), np.uint8)
        for a in range(self.N):
            img[:, 8 * a:8 * a + 8] = (0, 160, 0) if a == self.cue else (80, 80, 80) if self.mask[a] else (0, 0, 0)
        return img


class TestRace(gym.Env):
    """Two agents race down corridors side by side (multi-agent); each episode ends at its agent's own goal.

    Each agent walks its own 10-cell corridor as in test_corridor (0 left, 1 stay, 2 right; -0.01 per step, +1.0 at
    cell 9; truncated after 50 steps) and sees [its own cell one-hot, the other agent's cell one-hot]. An agent's
    episode ends when it reaches the goal: it starts its next episode at once, while the other agent plays on. Optimal
    return 0.92 per agent. info["episode"] also has "win": 1.0 if the agent reached the goal in fewer steps than the
    other agent took in its last finished episode (0.0 otherwise, and for an agent cut by the time limit).
    """

    __test__ = False
    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}
    NUM_AGENTS, N, MAX_STEPS = 2, 10, 50
    OPTIMAL_RETURN = TestCorridor.OPTIMAL_RETURN

    def __init__(self, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        self.render_mode = render_mode
        self.num_agents, self.is_multiagent = self.NUM_AGENTS, True
        self.observation_space = gym.spaces.Dict(obs=gym.spaces.Box(0.0, 1.0, (2 * self.N,), np.float32))
        self.action_space = gym.spaces.Discrete(3)
        self._first_seed = derive_seed(cfg_seed(cfg), env_index)
        self.pos = [0] * self.NUM_AGENTS
        self.steps = [0] * self.NUM_AGENTS
        self.returns = [0.0] * self.NUM_AGENTS
        self.last_length = [self.MAX_STEPS] * self.NUM_AGENTS

    def _obs(self, i: int) -> dict:
        o = np.zeros(2 * self.N, np.float32)
        o[self.pos[i]] = 1.0
        o[self.N + self.pos[1 - i]] = 1.0
        return {"obs": o}

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed if seed is not None else self._first_seed)
        self._first_seed = None
        self.pos, self.steps, self.returns = [0, 0], [0, 0], [0.0, 0.0]
        return [self._obs(i) for i in range(self.NUM_AGENTS)], [{} for _ in range(self.NUM_AGENTS)]

    def step(self, actions):
        rewards, terminated, truncated, infos = [0.0, 0.0], [False, False], [False, False], [{}, {}]
        for i, a in enumerate(actions):
            self.pos[i] = min(max(self.pos[i] + int(np.asarray(a).reshape(-1)[0]) - 1, 0), self.N - 1)
            self.steps[i] += 1
            terminated[i] = self.pos[i] == self.N - 1
            rewards[i] = TestCorridor.GOAL_REWARD if terminated[i] else TestCorridor.STEP_REWARD
            truncated[i] = not terminated[i] and self.steps[i] >= self.MAX_STEPS
            self.returns[i] += rewards[i]
        obs = [self._obs(i) for i in range(self.NUM_AGENTS)]
        wins = [float(terminated[i] and self.steps[i] < self.last_length[1 - i]) for i in range(self.NUM_AGENTS)]
        for i in range(self.NUM_AGENTS):
            if terminated[i] or truncated[i]:
                infos[i]["episode"] = {"reward": self.returns[i], "length": self.steps[i], "win": wins[i]}
                if truncated[i]:
                    infos[i]["final_obs"] = obs[i]
                self.last_length[i] = self.steps[i] if terminated[i] else self.MAX_STEPS
                self.pos[i], self.steps[i], self.returns[i] = 0, 0, 0.0  # this agent's next episode starts now
        return [self._obs(i) for i in range(self.NUM_AGENTS)], rewards, terminated, truncated, infos

    def render(self):
        img = np.zeros((16, 8 * self.N, 3), np.uint8)
        for i in range(self.NUM_AGENTS):
            img[8 * i:8 * i + 8, 8 * self.pos[i]:8 * self.pos[i] + 8] = (220, 220, 220)
        return img


TEST_ENVS = {"test_corridor": TestCorridor, "test_image": TestImage, "test_box": TestBox, "test_memory": TestMemory,
             "test_race": TestRace, "test_masked": TestMasked}
