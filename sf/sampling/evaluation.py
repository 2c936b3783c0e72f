"""The rollout workers' side of evaluation (python -m sf.eval): which policy plays each agent, how many episodes each
agent records, and the rows it reports.

sf.eval runs the training sampler without its learners and hands every rollout worker an `EvalPlan` (as
cfg._eval_plan). A worker with a plan:
- routes agent i (global index: rollout worker x envs per worker x agents per env + agent) to `players[i]` at every
  episode start (in place of --policy_mapping), so the policy of every episode is fixed in advance;
- records the first `quotas[i]` episodes of agent i as rows, sends them on the report queue
  (("eval_episodes", worker, rows)) and records no more: an episode still running when its agent met its quota is
  never reported, and an env whose every agent met its quota is not stepped again;
- keeps one trajectory slot per agent, reused from step 0 at every --rollout boundary (nothing goes to a learner);
- draws each agent's action noise from its own stream, as --sync_mode hts does, so that actions do not depend on how
  the policy workers happened to batch the requests (the policy workers run the model in fixed-size chunks for the
  same reason).
Which episodes are recorded is then fixed by the seed and the layout alone, never by timing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

EVAL_REPORT = "eval_episodes"  # the report-queue message kind: (EVAL_REPORT, worker, [row dict, ...])


@dataclass(frozen=True)
class EvalPlan:
    """quotas[i], players[i]: episodes to record and the policy that plays, for every global agent i (lists of
    num_workers x num_envs_per_worker x agents per env ints)."""
    quotas: tuple
    players: tuple

    @staticmethod
    def make(num_agents: int, num_policies: int, episodes: int, policy: int | None = None) -> "EvalPlan":
        """`episodes` episodes for each policy that plays: all of them (agent i is played by policy i % num_policies,
        --policy_mapping fixed) or only `policy` (every agent). Each policy's episodes are spread over its agents in
        global order, the first ones one more where they do not divide evenly."""
        players = [policy if policy is not None else i % num_policies for i in range(num_agents)]
        quotas = [0] * num_agents
        for p in set(players):
            mine = [i for i in range(num_agents) if players[i] == p]
            for j, i in enumerate(mine):
                quotas[i] = episodes // len(mine) + (j < episodes % len(mine))
        return EvalPlan(tuple(quotas), tuple(players))

    @property
    def total(self) -> int:
        return sum(self.quotas)


class EvalEpisodes:
    """One rollout worker's share of an EvalPlan: its agents' quotas, policies, recorded rows. Also the worker's policy
    mapping (`policy_for`, the PolicyMapping interface)."""

    def __init__(self, plan: EvalPlan, worker_idx: int, num_envs: int, agents_per_env: int):
        n = num_envs * agents_per_env
        self.first = worker_idx * n  # global index of this worker's agent 0
        self.quota = np.asarray(plan.quotas[self.first:self.first + n], dtype=np.int64)
        self.players = plan.players[self.first:self.first + n]
        self.A = agents_per_env
        self.recorded = np.zeros(n, dtype=np.int64)
        self.started = np.full(n, time.time())  # wall-clock start of each agent's current episode
        self.rows: list[dict] = []

    def policy_for(self, env: int, agent: int) -> int:
        return self.players[env * self.A + agent]

    def episode_end(self, i: int, episode: dict, env_seed: int | None) -> None:
        """Agent i (this worker's index) ended an episode whose report is `episode` (info["episode"]): a row if its
        quota is not met yet. true_objective: the win where the env reports wins, else the game score, else None."""
        now = time.time()
        if self.recorded[i] < self.quota[i]:
            objective = episode.get("win", episode.get("score"))
            self.rows.append({"agent": self.first + i, "index": int(self.recorded[i]), "policy": self.players[i],
                              "env_seed": env_seed, "return": float(episode["reward"]),
                              "length": int(episode["length"]),
                              "true_objective": None if objective is None else float(objective),
                              "wall_time": now - self.started[i]})
            self.recorded[i] += 1
        self.started[i] = now

    def env_done(self, e: int) -> bool:
        """Every agent of env e met its quota: the env is not stepped again."""
        lo = e * self.A
        return bool((self.recorded[lo:lo + self.A] >= self.quota[lo:lo + self.A]).all())

    def envs_done(self, lo: int, hi: int) -> bool:
        """Every agent of envs lo..hi-1 met its quota."""
        return bool((self.recorded[lo * self.A:hi * self.A] >= self.quota[lo * self.A:hi * self.A]).all())

    def all_done(self) -> bool:
        return bool((self.recorded >= self.quota).all())

    def take_rows(self) -> list[dict]:
        rows, self.rows = self.rows, []
        return rows
