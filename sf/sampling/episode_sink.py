"""Where a rollout worker's trajectories and episodes go: one small class per mode, chosen once when the worker is made
(`episode_sink`), so that the worker's step loop (sf/sampling/rollout_worker.py) is the same in every mode. The worker
asks its sink at the few points where the modes differ: which policy plays an agent's episodes (`mapping`), the slot
an agent fills next, the noise of its actions, an episode's end, a full trajectory, which envs of a group step, whether
a group asks for actions again, and what goes on the report queue.

    TrainingSink      --sync_mode async: any free slot (waiting on the free list is the run's backpressure); a full
                      trajectory goes to the learner of the policy that started it, each episode's report to the
                      runner's statistics; the policy workers sample the actions.
    SyncTrainingSink  --sync_mode hts/ppo (HTS-RL): fixed slots, two storages of one slot per agent (agent i's slot of
                      rollout interval k: (k % 2) * all agents + i); each agent's actions from its own noise stream
                      (sf.seeding), so that they do not depend on which policy worker or batch serves them; a group
                      that finished interval k asks for actions of interval k+1 only once the learner took batch k.
    EvaluationSink    python -m sf.eval (cfg._eval_plan, sf/sampling/evaluation.py): the plan's policy for each agent;
                      one slot per agent, filled again from step 0 (nothing goes to a learner); each agent's own noise;
                      its first episodes up to its quota recorded as rows for the runner; an env whose agents all met
                      their quotas is not stepped again.

A sink is given a SinkPort, not its worker: the worker's agents' table (AgentTable: each agent's slot, step and
policies, and the row of env_slots that publishes them), its outbox (Outbox: full trajectories for the learners, episode
reports and rows for the runner) and the few things it may ask of the worker (a free slot off the slot ledger, its own
action noise, an env's seed, the batches the learner took). The group gate of hts/ppo (each group's rollout interval and
the groups that wait for the learner) is the sink's own.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from sf.sampling.evaluation import EVAL_REPORT, EvalEpisodes
from sf.sampling.policy_mapping import PolicyMapping
from sf.seeding import POLICY_MAPPING, run_seed, stream_seed

if TYPE_CHECKING:
    from sf.cfg.config import Config
    from sf.cfg.shape import RunShape

EPISODE_REPORT_SEC = 1.0  # a worker's episodes go to the runner at most this often (and at its end)


@dataclass
class AgentTable:
    """A rollout worker's agents (agent i = env i // A, its agent i % A), each column [num_agents] int64: `slot` it
    fills and its step `t` there, the `policy` playing its episode and `slot_policy`, the one whose learner gets its
    slot; `published`: the worker's row of env_slots [num_agents, C], (slot, t[, policy]) per agent, what the policy
    workers and the runner read."""
    slot: np.ndarray
    t: np.ndarray
    policy: np.ndarray
    slot_policy: np.ndarray
    published: np.ndarray

    @classmethod
    def of(cls, published: np.ndarray) -> "AgentTable":
        n = len(published)
        return cls(*(np.zeros(n, dtype=np.int64) for _ in range(4)), published=published)

    def publish_fixed(self, i: int, slot: int) -> int:
        """`slot`, published as agent i's current slot at step 0."""
        self.published[i, :2] = slot, 0
        return slot


class Outbox:
    """What a rollout worker has for the others: `finished`, per policy, the full trajectory slots of the group being
    stepped (the worker hands them to the learners inside a slot move); `episodes`, the episode reports not yet on the
    report queue; `post` puts a report on it."""

    def __init__(self, num_policies: int, report_queue, worker_idx: int):
        self.finished: list[list[int]] = [[] for _ in range(num_policies)]
        self.episodes: list[dict] = []
        self.report_queue, self.worker_idx = report_queue, worker_idx
        self.last_report = time.time()

    def due(self, now: float, force: bool) -> bool:
        """Whether a report may go now: at most every EPISODE_REPORT_SEC (force: now)."""
        return force or now - self.last_report > EPISODE_REPORT_SEC

    def post(self, kind: str, payload: Any, now: float) -> None:
        self.report_queue.put((kind, self.worker_idx, payload))
        self.last_report = now


@dataclass
class SinkPort:
    """All that a rollout worker gives its sink. worker_idx and shape: which worker of which run; policies: those
    playing on this rank (None: every one); take_free_slot(i): a slot off the free list for agent i (the slot ledger's
    move, published at step 0; waits while the learner is behind); draw_own_noise(lo, hi): agents lo..hi-1's action
    noise from their own streams; env_seed(e): the seed of env e's current episodes; sync_ready_batches(): the batches
    the learner took (hts/ppo)."""
    cfg: Config
    worker_idx: int
    shape: RunShape
    num_policies: int
    policies: Optional[Sequence[int]]
    agents: AgentTable
    outbox: Outbox
    take_free_slot: Callable[[int], int]
    draw_own_noise: Callable[[int, int], None]
    env_seed: Callable[[int], Optional[int]]
    sync_ready_batches: Callable[[], int]


def episode_sink(port: SinkPort):
    """The sink of the worker behind `port`: sf.eval's when its cfg carries an evaluation plan, else training's of the
    run's mode (cfg.mode.intervals: HTS-RL's fixed slots)."""
    plan = port.cfg._eval_plan
    if plan is not None:
        return EvaluationSink(port, plan)
    return SyncTrainingSink(port) if port.cfg.mode.intervals else TrainingSink(port)


class TrainingSink:
    """--sync_mode async (see the module docstring)."""
    waiting: dict[int, int] = {}  # (hts/ppo's gate: never a group waiting here)

    def __init__(self, port: SinkPort):
        cfg, shape = port.cfg, port.shape
        self.port = port
        n = shape.envs_per_group
        self.mapping = PolicyMapping(port.num_policies, shape.agents_per_env, cfg.policy_mapping,
                                     cfg.policy_resample_episodes, cfg.pbt_mix_policies_in_one_env,
                                     port.worker_idx * cfg.num_envs_per_worker,
                                     stream_seed(run_seed(cfg), POLICY_MAPPING, port.worker_idx), n, run_seed(cfg),
                                     port.policies)  # (torchrun: this rank's)
        self.group_envs = [range(g * n, (g + 1) * n) for g in range(cfg.worker_num_splits)]

    def next_slot(self, i: int, first: bool) -> int:
        """The slot agent i fills next (first: its first trajectory): any free one."""
        return self.port.take_free_slot(i)

    def draw_noise(self, lo: int, hi: int) -> None:
        """Agents lo..hi-1's action noise before their request: none, the policy workers sample."""

    def envs_to_step(self, g: int) -> range:
        """The envs of group g that step with the actions that came (this worker's env indices)."""
        return self.group_envs[g]

    def episode_end(self, i: int, episode: dict) -> None:
        """Agent i ended an episode whose report is `episode` (info["episode"]): for the runner's statistics, with
        the policy that played it."""
        report = {k: float(v) for k, v in episode.items()}
        report["policy"] = float(self.port.agents.policy[i])
        self.port.outbox.episodes.append(report)

    def trajectory_end(self, i: int, slot: int) -> None:
        """Agent i filled `slot`: it goes to the learner of the policy that started it (with the group's others)."""
        self.port.outbox.finished[self.port.agents.slot_policy[i]].append(slot)

    def goes_on(self, g: int, interval_done: bool) -> bool:
        """Whether group g asks for actions again now (interval_done: its envs just ended a rollout interval)."""
        return True

    def released(self) -> list[int]:
        """The waiting groups that may ask for actions again now (hts/ppo)."""
        return []

    def report(self, now: float, force: bool) -> None:
        """Put the episodes gathered so far on the report queue, at most every EPISODE_REPORT_SEC (force: now)."""
        out = self.port.outbox
        if out.episodes and out.due(now, force):
            out.post("episodes", out.episodes, now)
            out.episodes = []


class SyncTrainingSink(TrainingSink):
    """--sync_mode hts/ppo (see the module docstring): the gate is the sink's, each group's rollout interval and the
    groups waiting for the learner (group -> the interval it waits to start)."""

    def __init__(self, port: SinkPort):
        super().__init__(port)
        self.interval = np.zeros(port.cfg.worker_num_splits, dtype=np.int64)
        self.waiting = {}
        self.draw_noise = port.draw_own_noise  # type: ignore[method-assign]

    def next_slot(self, i: int, first: bool) -> int:
        """Agent i's slot of its group's next rollout interval k: (k % 2) * all agents + its index in the run."""
        port = self.port
        interval = 0 if first else int(self.interval[i // port.shape.agents_per_group]) + 1
        return port.agents.publish_fixed(
            i, (interval % 2) * port.shape.agents + port.worker_idx * port.shape.agents_per_worker + i)

    def goes_on(self, g: int, interval_done: bool) -> bool:
        """A group that finished its interval waits (until released()) unless the learner took the batch of its
        previous one."""
        if interval_done:
            self.interval[g] += 1
            if self.port.sync_ready_batches() < self.interval[g]:
                self.waiting[g] = int(self.interval[g])
                return False
        return True

    def released(self) -> list[int]:
        ready = self.port.sync_ready_batches()
        groups = [g for g, interval in self.waiting.items() if ready >= interval]
        for g in groups:
            del self.waiting[g]
        return groups


class EvaluationSink:
    """python -m sf.eval (see the module docstring); `mapping` is its EvalEpisodes."""
    waiting: dict[int, int] = {}

    def __init__(self, port: SinkPort, plan):
        self.port = port
        self.episodes = self.mapping = EvalEpisodes(plan, port.worker_idx, port.cfg.num_envs_per_worker,
                                                    port.shape.agents_per_env)
        self.draw_noise = port.draw_own_noise

    def next_slot(self, i: int, first: bool) -> int:
        """Agent i's own slot, filled again from step 0."""
        return self.port.agents.publish_fixed(i, self.port.worker_idx * self.port.shape.agents_per_worker + i)

    def envs_to_step(self, g: int) -> list[int]:
        """The envs of group g with an agent still short of its quota."""
        n = self.port.shape.envs_per_group
        return [e for e in range(g * n, (g + 1) * n) if not self.episodes.env_done(e)]

    def episode_end(self, i: int, episode: dict) -> None:
        self.episodes.episode_end(i, episode, self.port.env_seed(i // self.port.shape.agents_per_env))

    def trajectory_end(self, i: int, slot: int) -> None:
        """Nothing goes to a learner."""

    def goes_on(self, g: int, interval_done: bool) -> bool:
        """Unless every env of group g met its quota."""
        n = self.port.shape.envs_per_group
        return not self.episodes.envs_done(g * n, (g + 1) * n)

    def released(self) -> list[int]:
        return []

    def report(self, now: float, force: bool) -> None:
        """Put the rows recorded so far on the report queue, at most every EPISODE_REPORT_SEC (force, or every
        quota met: now)."""
        if self.episodes.rows and (self.port.outbox.due(now, force) or self.episodes.all_done()):
            self.port.outbox.post(EVAL_REPORT, self.episodes.take_rows(), now)
