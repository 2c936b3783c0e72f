"""Which policy of the population controls each agent (Sample Factory paper, section 3.5).

The rollout worker asks `policy_for(env, agent)` at every episode start of that agent and routes the agent's action
requests and finished trajectories by the answer. Modes (--policy_mapping):

- random (the paper): every env holds a list of policies, one per agent, drawn uniformly from the population and drawn
  again every --policy_resample_episodes episodes of that env (counted in agent episode starts / num_agents, as Sample
  Factory 1.x's PolicyManager does). With --pbt_mix_policies_in_one_env False every agent of one env gets the same
  policy (no self-play between different policies inside one match).
- fixed: agent a of global env g is controlled by policy (g * num_agents + a) % num_policies, forever: every policy
  gets the same share of the agents, deterministically (evaluation, throughput benchmarks, seeded runs).

A change of policy happens only at an agent's own episode start, so an episode is played by one policy. Episodes do not
line up with trajectories: the rollout worker keeps a trajectory slot with the policy that started it and the learner
masks the steps another policy acted (see rollout_worker.py).
"""
from __future__ import annotations

import numpy as np


class PolicyMapping:
    def __init__(self, num_policies: int, num_agents: int, mode: str = "random", resample_episodes: int = 10,
                 mix_in_one_env: bool = True, first_global_env: int = 0, seed: int | None = None):
        """first_global_env: global index of this worker's env 0 (fixed mode); seed: of the random draws."""
        if mode not in ("random", "fixed"):
            raise ValueError(f"policy mapping mode must be 'random' or 'fixed' (got {mode!r})")
        self.num_policies, self.num_agents, self.mode = num_policies, num_agents, mode
        self.resample_episodes, self.mix = max(1, int(resample_episodes)), mix_in_one_env
        self.first_global_env = first_global_env
        self.rng = np.random.default_rng(seed)
        self.env_policies: dict[int, list[int]] = {}
        self.episode_starts: dict[int, int] = {}

    def policy_for(self, env: int, agent: int) -> int:
        """The policy that plays agent `agent` of env `env` (this worker's index) in the episode starting now."""
        if self.num_policies == 1:
            return 0
        if self.mode == "fixed":
            return ((self.first_global_env + env) * self.num_agents + agent) % self.num_policies
        starts = self.episode_starts.get(env, 0)
        if starts % (self.num_agents * self.resample_episodes) == 0:
            if self.mix:
                self.env_policies[env] = self.rng.integers(self.num_policies, size=self.num_agents).tolist()
            else:
                self.env_policies[env] = [int(self.rng.integers(self.num_policies))] * self.num_agents
        self.episode_starts[env] = starts + 1
        return int(self.env_policies[env][agent])
