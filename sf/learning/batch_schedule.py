"""The learner's batch schedule (--sync_mode): which trajectories make a training batch, when the actors get new
weights, and the learner's process loop. One class per schedule, chosen by the run's mode (`schedule_class`, from
cfg.mode.schedule: sf/cfg/mode.py); the learner holds one.

async (Sample Factory's APPO): a training batch is `batch_size * num_batches_per_epoch / rollout` trajectories in the
order they arrived; a batcher thread collects the next batch while one trains (sf/learning/batcher.py) and the weights
are published after every SGD step.

hts/ppo (HTS-RL): no batcher thread. A training batch is one rollout interval k of every env (slots
(k % 2) * agents + agent index, in that order: a fixed composition, whatever order they arrived in). hts: take batch
k, publish the weights trained on batch k-1, let interval k+1 start, train on batch k (collection of k+1 overlaps it;
policy lag exactly one batch after the first). ppo: take batch k, train, publish, let interval k+1 start (lag 0).
Weights change for the actors only at these batch boundaries, and a --train_for_env_steps budget ends the run right
after the batch that reaches it: the same seed and config give the same weights.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from sf.learning import collectives
from sf.learning.phase_timing import LAPS
from sf.processes.control import runner_alive
from sf.seeding import deterministic_kernels

if TYPE_CHECKING:
    from sf.cfg.config import Config


class AsyncSchedule:
    """--sync_mode async: batches of trajectories as they come, weights published after every SGD step."""
    budget_done = False  # (the runner ends an async run on the budget)

    def __init__(self, learner):
        self.learner = learner

    @staticmethod
    def torch_threads(cores: int, cfg: Config) -> int:
        return max(1, cores // 2 // cfg.num_policies)  # a population's learners share the cores

    def order_batch(self, pending: list) -> None:
        """The batch's slots in training order: the order they came in."""

    def sgd_step(self, version: int) -> None:
        self.learner.publish(version)

    def train(self, experience) -> None:
        learner = self.learner
        learner.apply_population_updates()
        stats = learner.sgd(experience)
        learner.state.batch_trained(learner.policy_id)  # collection resumes at once (before a periodic save)
        learner.trained(stats)

    def run(self) -> None:
        """Process mode: batcher thread + training loop until the runner asks to stop; then the final save."""
        learner, batcher = self.learner, self.learner.batcher
        batcher.start_thread()
        learner.state.set_started(learner.heartbeat)
        try:
            while True:
                stopping = learner.state.stopping() or not runner_alive()
                if stopping and not learner.data_parallel:
                    break
                learner.state.beat(learner.heartbeat)
                if learner.population:  # also while no batch comes: a copy is visible to the actors at once
                    learner.apply_population_updates()
                experience = batcher.next_batch(timeout=0.1)
                LAPS.lap("wait_batch")
                if learner.data_parallel:
                    if experience is None and not stopping:
                        continue
                    if not learner.ranks_go_on(stopping):  # every rank stops at this batch boundary
                        break
                if experience is not None:
                    learner.train(experience)
        except collectives.DistributedError:
            learner.save(final=True)  # rank 0: the weights of the last step every rank made
            raise
        finally:
            batcher.stop_thread()
        learner.finish()


class IntervalSchedule:
    """hts/ppo: batch k = one rollout interval of every env (module docstring); the subclasses say when the weights
    trained on it are published. No population updates: these modes train one policy (sf.cfg refuses
    --num_policies > 1 with them), whose hyperparameters are the configuration's (forced onto a loaded optimizer state
    in Learner._load_checkpoint)."""
    mode = ""

    def __init__(self, learner):
        self.learner = learner
        deterministic_kernels(learner.device)
        self.batch = 0  # the rollout interval whose batch comes next
        self.published: dict[int, int] = {}  # batches trained on -> the policy version published after them
        self.budget_done = False

    def order_batch(self, pending: list) -> None:
        """Batch k's slots in env order (sorted in place), checked: one interval of every env."""
        pending.sort()
        agents = self.learner.shape.agents
        expected = list(range((self.batch % 2) * agents, (self.batch % 2 + 1) * agents))
        if pending != expected:
            raise RuntimeError(f"--sync_mode {self.mode}: batch {self.batch} got slots {pending[:8]}..., "
                               f"expected {expected[0]}..{expected[-1]}")

    def sgd_step(self, version: int) -> None:
        """The actors' weights change at batch boundaries only."""
        self.learner.version = version
        self.learner.state.beat(self.learner.heartbeat)

    def behaviour(self, k: int) -> int:
        """How many batches the weights that acted in interval k were trained on (a key of `published`)."""
        raise NotImplementedError

    def before_training(self, k: int) -> None:
        """Batch k taken, before its SGD steps."""

    def after_training(self, k: int) -> None:
        """Batch k's SGD steps done."""

    def publish_trained(self, batches: int) -> None:
        """Publish the weights trained on batches 0..batches-1 (the actors' next interval's)."""
        learner = self.learner
        learner.publish(learner.version)
        self.published[batches] = learner.version

    def train(self, experience) -> None:
        learner, k = self.learner, self.batch
        if k == 0:
            self.published[0] = learner.version  # the initial (or resumed) weights, published at start
        behaviour = self.behaviour(k)
        self.before_training(k)
        versions = experience["policy_versions"]
        lo, hi = int(versions.min()), int(versions.max())
        if lo != hi or lo != self.published[behaviour]:  # the mode's guarantee, checked on the data itself
            raise RuntimeError(f"--sync_mode {self.mode}: batch {k} holds samples of policy versions {lo}..{hi}, "
                               f"expected only {self.published[behaviour]}")
        stats = learner.sgd(experience)
        for s in stats:
            s["policy_lag_batches"] = float(k - behaviour)
        self.after_training(k)
        self.published.pop(behaviour - 1, None)
        self.batch = k + 1
        learner.trained(stats)
        if learner.env_steps >= learner.cfg.train_for_env_steps:  # end at this batch boundary, whoever notices first
            self.budget_done = True

    def run(self) -> None:
        """Process mode: batches in interval order, no batcher thread (nothing to overlap with)."""
        learner = self.learner
        learner.state.set_started(learner.heartbeat)
        while not learner.state.stopping() and runner_alive() and not self.budget_done:
            learner.state.beat(learner.heartbeat)
            learner.run_once(timeout=0.1)
        learner.finish()


class HtsSchedule(IntervalSchedule):
    """hts: interval k+1 runs on the weights trained on batches 0..k-1 while batch k trains."""
    mode = "hts"

    @staticmethod
    def torch_threads(cores: int, cfg: Config) -> int:
        return max(1, cores // 2)  # independent of the worker layout: every layout computes the same bits

    def behaviour(self, k: int) -> int:
        return max(k - 1, 0)  # interval k ran on the weights trained on batches 0..k-2

    def before_training(self, k: int) -> None:
        if k > 0:
            self.publish_trained(k)  # trained on batches 0..k-1: interval k+1's weights
        self.learner.state.set_sync_ready(k + 1)


class PpoSchedule(IntervalSchedule):
    """ppo: interval k+1 waits for the weights trained on batch k."""
    mode = "ppo"

    @staticmethod
    def torch_threads(cores: int, cfg: Config) -> int:
        return cores  # the actors wait while the learner trains

    def behaviour(self, k: int) -> int:
        return k

    def after_training(self, k: int) -> None:
        self.publish_trained(k + 1)
        self.learner.state.set_sync_ready(k + 1)


# a RunMode's schedule (sf/cfg/mode.py) -> its class
SCHEDULES = {"async": AsyncSchedule, "hts": HtsSchedule, "ppo": PpoSchedule}


def schedule_class(cfg: Config) -> type[AsyncSchedule | IntervalSchedule]:
    """The batch schedule of the run's mode (cfg.mode.schedule)."""
    if cfg.mode.schedule is None:
        raise ValueError(f"mode {cfg.mode.name} trains nothing: no learner, no batch schedule")
    return SCHEDULES[cfg.mode.schedule]
