"""Which policy of the population controls each agent (Sample Factory paper, section 3.5).

The rollout worker asks `policy_for(env, agent)` at every episode start of that agent and routes the agent's action
requests and finished trajectories by the answer. Modes (--policy_mapping):

- random (the paper): every env holds a list of policies, one per agent, drawn uniformly from the population and drawn
  again every --policy_resample_episodes episodes of that env (counted in agent episode starts / num_agents, as Sample
  Factory 1.x's PolicyManager does). With --pbt_mix_policies_in_one_env False every agent of one env gets the same
  policy (no self-play between different policies inside one match). The draws of a rollout worker are dealt from a
  shuffled deck of the population, shuffled again when it runs out: every policy is drawn before any is drawn again.
  Each draw is still uniform, but a population larger than the agents playing at once (8 policies on 2 envs) has every
  policy play within num_policies / agents draws, where independent draws leave some policies out for many periods
  (and, since the budget holds for every policy, the run waits for them).
- groups: the paper's random draw made per inference group instead of per env. A rollout worker steps its envs in
  --worker_num_splits groups, and each group's envs ask for their actions in one request; with a draw per env, a group
  of 8 envs and 4 policies gives each policy's worker about 2 rows per forward, and on a CPU a forward costs twice as
  much per row at 2 rows as at 8 (the weights are read once per call). Here every group takes its place in a random
  permutation of the population: agent a of global group k plays perm_r[(k * num_agents + a) % num_policies] (perm_r[k %
  num_policies] for every agent without mixing), where r counts the group's draws (one every
  --policy_resample_episodes episodes of its envs) and perm_r, drawn from the run's seed, is the same for every group
  and worker. So each agent's episode is still played by a uniformly random policy, the agents of one env by distinct
  policies, the groups at one draw share the policies equally (when the positions are a multiple of the population), and
  each policy worker gets whole groups to serve. What it gives up: the envs of one group play the same matchup for a
  period (the paper draws per env).
- fixed: agent a of global env g is controlled by policy (g * num_agents + a) % num_policies, forever: every policy
  gets the same share of the agents, deterministically (evaluation, throughput benchmarks, seeded runs).

A population placed on several ranks (torchrun, sf/processes/ranks.py): each rank's mapping draws from its own policies
only (`policies`), by the same rules over that smaller population, so a match never mixes policies of two ranks.

A change of policy happens only at an agent's own episode start, so an episode is played by one policy. Episodes do not
line up with trajectories: the rollout worker keeps a trajectory slot with the policy that started it and the learner
masks the steps another policy acted (see rollout_worker.py).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from sf.seeding import POLICY_GROUPS, stream_seed

MODES = ("random", "groups", "fixed")


class PolicyMapping:
    def __init__(self, num_policies: int, num_agents: int, mode: str = "random", resample_episodes: int = 10,
                 mix_in_one_env: bool = True, first_global_env: int = 0, seed: int | None = None,
                 envs_per_group: int = 1, shared_seed: int = 0, policies: Sequence[int] | None = None):
        """first_global_env: global index of this worker's env 0 (fixed, groups); seed: of this worker's random draws
        (random); envs_per_group: envs of one inference group (groups); shared_seed: the run's seed, the same in every
        worker: draw r's permutation comes from its stream POLICY_GROUPS r (groups); policies: those this worker's
        agents may play (default: all num_policies), the rules applied to them as the population."""
        if mode not in MODES:
            raise ValueError(f"policy mapping mode must be one of {', '.join(map(repr, MODES))} (got {mode!r})")
        self.policies = list(range(num_policies) if policies is None else policies)
        if not self.policies or not all(0 <= p < num_policies for p in self.policies):
            raise ValueError(f"policies {self.policies} must be a non-empty subset of 0..{num_policies - 1}")
        self.num_policies, self.num_agents, self.mode = len(self.policies), num_agents, mode
        self.resample_episodes, self.mix = max(1, int(resample_episodes)), mix_in_one_env
        self.first_global_env = first_global_env
        self.rng = np.random.default_rng(seed)
        self.deck: list[int] = []  # random: the policies not yet drawn in the current shuffle of the population
        self.env_policies: dict[int, list[int]] = {}
        self.episode_starts: dict[int, int] = {}  # per env (random) or per group (groups)
        self.envs_per_group, self.shared_seed = max(1, int(envs_per_group)), shared_seed
        self.perm: tuple = (-1, None)  # groups: (draw r, the population's permutation for it)

    def policy_for(self, env: int, agent: int) -> int:
        """The policy that plays agent `agent` of env `env` (this worker's index) in the episode starting now."""
        return self.policies[self._index(env, agent)]

    def _index(self, env: int, agent: int) -> int:
        """The answer of policy_for as an index into self.policies."""
        if self.num_policies == 1:
            return 0
        if self.mode == "fixed":
            return ((self.first_global_env + env) * self.num_agents + agent) % self.num_policies
        if self.mode == "groups":
            return self._group_policy(env, agent)
        starts = self.episode_starts.get(env, 0)
        if starts % (self.num_agents * self.resample_episodes) == 0:
            if self.mix:
                self.env_policies[env] = [self._deal() for _ in range(self.num_agents)]
            else:
                self.env_policies[env] = [self._deal()] * self.num_agents
        self.episode_starts[env] = starts + 1
        return int(self.env_policies[env][agent])

    def _deal(self) -> int:
        """The next policy of the deck, a new shuffle of the population when it is empty."""
        if not self.deck:
            self.deck = self.rng.permutation(self.num_policies).tolist()
        return int(self.deck.pop())

    def _group_policy(self, env: int, agent: int) -> int:
        group = (self.first_global_env + env) // self.envs_per_group  # global index of env's group
        if agent == 0 or env not in self.env_policies:  # an episode of env: its group's current draw r
            starts = self.episode_starts.get(group, 0)  # (counted in env episodes: all agents of an env share a draw)
            self.episode_starts[group] = starts + 1
            r = starts // (self.envs_per_group * self.resample_episodes)
            if self.perm[0] != r:  # (groups drift apart by a draw or so: one cached, any other drawn again, same bits)
                rng = np.random.default_rng(stream_seed(self.shared_seed, POLICY_GROUPS, r))
                self.perm = (r, rng.permutation(self.num_policies))
            agents = np.arange(self.num_agents)
            positions = group * self.num_agents + agents if self.mix else np.full_like(agents, group)
            self.env_policies[env] = self.perm[1][positions % self.num_policies].tolist()
        return int(self.env_policies[env][agent])
