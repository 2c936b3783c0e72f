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

A sink is a part of its worker: it reads and writes the worker's arrays (slots, steps, env_slots, finished) directly.
"""
from __future__ import annotations

from sf.model.action_spaces import draw_action_noise
from sf.sampling.evaluation import EVAL_REPORT, EvalEpisodes
from sf.sampling.policy_mapping import PolicyMapping
from sf.seeding import POLICY_MAPPING, run_seed, stream_seed

EPISODE_REPORT_SEC = 1.0  # a worker's episodes go to the runner at most this often (and at its end)


def episode_sink(worker):
    """The sink of `worker` (a RolloutWorker whose envs are made): sf.eval's when its cfg carries an evaluation plan,
    else training's of the run's mode (cfg.mode.intervals: HTS-RL's fixed slots)."""
    cfg = worker.cfg
    plan = cfg._eval_plan
    if plan is not None:
        return EvaluationSink(worker, plan)
    return SyncTrainingSink(worker) if cfg.mode.intervals else TrainingSink(worker)


def _draw_own_noise(sink, lo: int, hi: int) -> None:
    """Agents lo..hi-1's action noise at their current steps, each from its own stream."""
    w = sink.worker
    for i in range(lo, hi):
        draw_action_noise(w.envs[i // w.A].action_space, w.noise_rngs[i], w.noise_np[w.slot[i], w.t[i]])


def _fixed_slot(worker, i: int, slot: int) -> int:
    """`slot`, published as agent i's current slot at step 0 (env_slots)."""
    worker.agent_slots[i, :2] = slot, 0
    return slot


class TrainingSink:
    """--sync_mode async (see the module docstring)."""

    def __init__(self, worker):
        cfg, w = worker.cfg, worker
        self.worker = worker
        self.mapping = PolicyMapping(w.num_policies, w.A, cfg.policy_mapping,
                                     cfg.policy_resample_episodes,
                                     cfg.pbt_mix_policies_in_one_env, w.worker_idx * w.num_envs,
                                     stream_seed(run_seed(cfg), POLICY_MAPPING, w.worker_idx),
                                     w.envs_per_group, run_seed(cfg), w.policies_here)  # (torchrun: this rank's)
        self.group_envs = [range(g * w.envs_per_group, (g + 1) * w.envs_per_group) for g in range(w.splits)]

    def next_slot(self, i: int, interval: int) -> int:
        """The slot agent i fills next (its trajectory of rollout interval `interval`): any free one."""
        return self.worker._take_free_slot(i)

    def draw_noise(self, lo: int, hi: int) -> None:
        """Agents lo..hi-1's action noise before their request: none, the policy workers sample."""

    def envs_to_step(self, g: int) -> range:
        """The envs of group g that step with the actions that came (this worker's env indices)."""
        return self.group_envs[g]

    def episode_end(self, i: int, episode: dict) -> None:
        """Agent i ended an episode whose report is `episode` (info["episode"]): for the runner's statistics, with
        the policy that played it."""
        report = {k: float(v) for k, v in episode.items()}
        report["policy"] = float(self.worker.policy[i])
        self.worker.episodes.append(report)

    def trajectory_end(self, i: int, slot: int) -> None:
        """Agent i filled `slot`: it goes to the learner of the policy that started it (with the group's others)."""
        self.worker.finished[self.worker.slot_policy[i]].append(slot)

    def goes_on(self, g: int, interval_done: bool) -> bool:
        """Whether group g asks for actions again now (interval_done: its envs just ended a rollout interval)."""
        return True

    def report(self, now: float, force: bool) -> None:
        """Put the episodes gathered so far on the report queue, at most every EPISODE_REPORT_SEC (force: now)."""
        w = self.worker
        if w.episodes and (force or now - w.last_report > EPISODE_REPORT_SEC):
            w.queues.report.put(("episodes", w.worker_idx, w.episodes))
            w.episodes = []
            w.last_report = now


class SyncTrainingSink(TrainingSink):
    """--sync_mode hts/ppo (see the module docstring)."""
    draw_noise = _draw_own_noise

    def __init__(self, worker):
        super().__init__(worker)
        self.total_agents = worker.shape.agents

    def next_slot(self, i: int, interval: int) -> int:
        w = self.worker
        return _fixed_slot(w, i, (interval % 2) * self.total_agents + w.worker_idx * w.num_agents + i)

    def goes_on(self, g: int, interval_done: bool) -> bool:
        """A group that finished its interval waits (worker.waiting, until _release_waiting) unless the learner took
        the batch of its previous one."""
        w = self.worker
        if interval_done:
            w.interval[g] += 1
            if w.state.sync_ready_batches() < w.interval[g]:
                w.waiting[g] = int(w.interval[g])
                return False
        return True


class EvaluationSink:
    """python -m sf.eval (see the module docstring); `mapping` is its EvalEpisodes."""
    draw_noise = _draw_own_noise

    def __init__(self, worker, plan):
        self.worker = worker
        self.episodes = self.mapping = EvalEpisodes(plan, worker.worker_idx, worker.num_envs, worker.A)

    def next_slot(self, i: int, interval: int) -> int:
        """Agent i's own slot, filled again from step 0."""
        w = self.worker
        return _fixed_slot(w, i, w.worker_idx * w.num_agents + i)

    def envs_to_step(self, g: int) -> list[int]:
        """The envs of group g with an agent still short of its quota."""
        n = self.worker.envs_per_group
        return [e for e in range(g * n, (g + 1) * n) if not self.episodes.env_done(e)]

    def episode_end(self, i: int, episode: dict) -> None:
        self.episodes.episode_end(i, episode, self.worker._env_seed(i // self.worker.A))

    def trajectory_end(self, i: int, slot: int) -> None:
        """Nothing goes to a learner."""

    def goes_on(self, g: int, interval_done: bool) -> bool:
        """Unless every env of group g met its quota."""
        n = self.worker.envs_per_group
        return not self.episodes.envs_done(g * n, (g + 1) * n)

    def report(self, now: float, force: bool) -> None:
        """Put the rows recorded so far on the report queue, at most every EPISODE_REPORT_SEC (force, or every
        quota met: now)."""
        w = self.worker
        if self.episodes.rows and (force or self.episodes.all_done() or now - w.last_report > EPISODE_REPORT_SEC):
            w.queues.report.put((EVAL_REPORT, w.worker_idx, self.episodes.take_rows()))
            w.last_report = now
