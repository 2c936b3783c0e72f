"""The run of python -m sf.eval (sf/eval.py tells the whole story): the runner's lifecycle (sf/runner/runner.py) with
training's sampler and no learner. Each policy that plays gets its weights from its checkpoint, published once into
the shared weights; the rollout workers play by the evaluation plan (cfg._eval_plan; their episode sink,
sf/sampling/episode_sink.py) and send the episodes they record as rows, gathered here until every agent met its quota.
Nothing is written here: no statistics, TensorBoard or checkpoint (sf.eval writes the CSV).
"""
from __future__ import annotations

import logging
import time

import torch

from sf.buffers.shared_weights import SharedWeights
from sf.cfg.shape import RunShape
from sf.policy_loading import load_policy
from sf.processes.control import bind_device
from sf.runner.runner import Runner
from sf.sampling.evaluation import EVAL_REPORT

log = logging.getLogger("sf")


class Evaluator(Runner):
    """Training's sampler without its learners: rollout workers, and policy workers of the policies that play. The
    runner's own run(), with its lifecycle's hooks (Runner's docstring) filled for an evaluation."""
    stopping_note = "stopping the evaluation (no CSV is written)"
    poll_sec = 0.02

    def check_policies(self, env_bytes: int) -> None:
        """Every policy that plays has a checkpoint that fits the model (load_policy); the run fits in memory, with one
        trajectory slot per agent, reused (sf/sampling/evaluation.py)."""
        cfg, self.plan = self.cfg, self.cfg._eval_plan
        self.policies = sorted(set(self.plan.players))
        self.models = {p: load_policy(cfg, self.obs_space, self.action_space, torch.device("cpu"), p)
                       for p in self.policies}
        self.shape = RunShape.of_evaluation(cfg, self.spec.num_agents, slots=len(self.plan.quotas))
        self._check_memory(self.models[self.policies[0]][0], env_bytes)
        self.population = None
        self.rows: list[dict] = []
        self.sampling_since = self.done_at = None

    def shared_weights(self) -> list[SharedWeights | None]:
        """The checkpoints' weights, published once (None for a policy that does not play)."""
        bind_device(self.device)  # (the shared weights on the evaluation's GPU)
        weights: list[SharedWeights | None] = [None] * self.num_policies
        for p, (model, state) in self.models.items():
            weights[p] = SharedWeights(model, self.device)
            weights[p].publish(model, max(0, int(state["policy_version"])))
        return weights

    def build(self) -> None:
        """What the processes share (Runner's) and the supervisor's bookkeeping; the rows come as reports."""
        self._build_shared()
        self.stats = None  # (no statistics, no TensorBoard: nothing is written but the CSV)
        self._build_supervision()
        self.reports.handlers[EVAL_REPORT] = self._add_rows

    def _add_rows(self, msg: tuple) -> None:
        """(EVAL_REPORT, worker, rows): episodes a rollout worker recorded."""
        self.rows += msg[2]
        if len(self.rows) >= self.plan.total and self.done_at is None:
            self.done_at = time.time()

    def start_learners(self) -> None:
        """None: the weights are the checkpoints'."""

    def start_tracking(self) -> None:
        """None: nothing is written but the CSV."""

    def supervise(self, start: float) -> None:
        """Runner's loop, timed from now: every process has been started (sampling_since, until every one has also
        started working: step)."""
        self.sampling_since, self.all_started = time.time(), False
        super().supervise(self.sampling_since)

    def budget_reached(self, start: float) -> bool:
        return self.done_at is not None  # every agent met its quota

    def step(self, start: float) -> None:
        """The moment every process had started (the throughput counts from it); every --report_interval_sec, the
        episodes evaluated so far."""
        now = time.time()
        if not self.all_started and all(self.state.has_started(n) for n in self.procs):
            self.sampling_since, self.all_started = now, True
        if now - self.last_report >= self.cfg.report_interval_sec:
            log.info("Evaluated %d of %d episodes", len(self.rows), self.plan.total)
            self.last_report = now

    def finish(self, start: float) -> None:
        """The last rows; the queues closed (no statistics, PBT or slot audit)."""
        self.reports.drain()
        self.close_queues()

    def conclude(self, start: float) -> int:
        """The exit code: 0 with every row in, 130 stopped by a signal, 1 a process failed."""
        if self.done_at is not None and self.exit_code == 0:
            return 0
        return 130 if self.interrupts else 1
