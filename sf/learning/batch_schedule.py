"""The learner's batch schedule (--sync_mode): which trajectories make a training batch, when the actors get new
weights, and whether the budget ends the run at a batch boundary. One class per schedule, chosen by the run's mode
(`schedule_class`, from cfg.mode.schedule: sf/cfg/mode.py). The learner owns its loop (Learner.run) and asks its
schedule at each batch boundary; a schedule is told the versions and counts it needs and answers with a `Boundary`
(what the learner does there), never touching the learner.

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

import dataclasses
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import torch

    from sf.cfg.config import Config
    from sf.cfg.shape import RunShape


@dataclasses.dataclass(frozen=True)
class Boundary:
    """What the learner does at a batch boundary, in this order."""
    publish: bool = False  # publish its current weights (the actors' from then on)
    release: Optional[int] = None  # let the actors start this rollout interval (SharedState.set_sync_ready)
    collect: bool = False  # collection may go on: the batch has left the learner's hands (SharedState.batch_trained)


STAY = Boundary()


class AsyncSchedule:
    """--sync_mode async: batches of trajectories as they come, weights published after every SGD step."""
    batcher_thread = True  # the next batch is copied out while one trains
    publishes_each_sgd_step = True
    ends_on_budget = False  # the runner ends an async run on the budget
    population_updates = True  # PBT's hyperparameters and weight copies, before each batch

    def __init__(self, shape: RunShape):
        pass

    @staticmethod
    def torch_threads(cores: int, cfg: Config) -> int:
        return max(1, cores // 2 // cfg.num_policies)  # a population's learners share the cores

    def order_batch(self, pending: list) -> None:
        """The batch's slots in training order: the order they came in."""

    def before_sgd(self, versions: torch.Tensor, version: int) -> Boundary:
        """A batch taken (its samples' policy versions, the learner's current version), before its SGD steps."""
        return STAY

    def after_sgd(self, stats: list, version: int) -> Boundary:
        """The batch's SGD steps done (their stats, the version they ended at): collection resumes at once (before a
        periodic save)."""
        return Boundary(collect=True)


class IntervalSchedule:
    """hts/ppo: batch k = one rollout interval of every env (module docstring); the subclasses say when the weights
    trained on it are published. No population updates: these modes train one policy (sf.cfg refuses
    --num_policies > 1 with them), whose hyperparameters are the configuration's (forced onto a loaded optimizer state
    in Learner._load_checkpoint)."""
    mode = ""
    batcher_thread = False  # nothing to overlap with
    publishes_each_sgd_step = False  # the actors' weights change at batch boundaries only
    ends_on_budget = True
    population_updates = False

    def __init__(self, shape: RunShape):
        self.agents = shape.agents
        self.batch = 0  # the rollout interval whose batch comes next
        self.published: dict[int, int] = {}  # batches trained on -> the policy version published after them
        self.lag = 0  # the batch in training: batches between its behaviour weights and the learner's

    def order_batch(self, pending: list) -> None:
        """Batch k's slots in env order (sorted in place), checked: one interval of every env."""
        pending.sort()
        expected = list(range((self.batch % 2) * self.agents, (self.batch % 2 + 1) * self.agents))
        if pending != expected:
            raise RuntimeError(f"--sync_mode {self.mode}: batch {self.batch} got slots {pending[:8]}..., "
                               f"expected {expected[0]}..{expected[-1]}")

    def behaviour(self, k: int) -> int:
        """How many batches the weights that acted in interval k were trained on (a key of `published`)."""
        raise NotImplementedError

    def before(self, k: int, version: int) -> Boundary:
        """Batch k taken, before its SGD steps (the learner at `version`)."""
        return STAY

    def after(self, k: int, version: int) -> Boundary:
        """Batch k's SGD steps done (the learner at `version`)."""
        return STAY

    def before_sgd(self, versions: torch.Tensor, version: int) -> Boundary:
        """Batch k taken: its samples must all be of the version published after `behaviour(k)` batches (the mode's
        guarantee, checked on the data itself)."""
        k = self.batch
        if k == 0:
            self.published[0] = version  # the initial (or resumed) weights, published at start
        behaviour = self.behaviour(k)
        self.lag = k - behaviour
        boundary = self.before(k, version)
        lo, hi = int(versions.min()), int(versions.max())
        if lo != hi or lo != self.published[behaviour]:
            raise RuntimeError(f"--sync_mode {self.mode}: batch {k} holds samples of policy versions {lo}..{hi}, "
                               f"expected only {self.published[behaviour]}")
        return boundary

    def after_sgd(self, stats: list, version: int) -> Boundary:
        k = self.batch
        for s in stats:
            s["policy_lag_batches"] = float(self.lag)
        boundary = self.after(k, version)
        self.published.pop(k - self.lag - 1, None)
        self.batch = k + 1
        return boundary

    def published_after(self, batches: int, version: int) -> Boundary:
        """Publish the weights trained on batches 0..batches-1 (the actors' next interval's) and release it."""
        self.published[batches] = version
        return Boundary(publish=True, release=self.batch + 1)


class HtsSchedule(IntervalSchedule):
    """hts: interval k+1 runs on the weights trained on batches 0..k-1 while batch k trains."""
    mode = "hts"

    @staticmethod
    def torch_threads(cores: int, cfg: Config) -> int:
        return max(1, cores // 2)  # independent of the worker layout: every layout computes the same bits

    def behaviour(self, k: int) -> int:
        return max(k - 1, 0)  # interval k ran on the weights trained on batches 0..k-2

    def before(self, k: int, version: int) -> Boundary:
        if k > 0:
            return self.published_after(k, version)  # trained on batches 0..k-1: interval k+1's weights
        return Boundary(release=k + 1)


class PpoSchedule(IntervalSchedule):
    """ppo: interval k+1 waits for the weights trained on batch k."""
    mode = "ppo"

    @staticmethod
    def torch_threads(cores: int, cfg: Config) -> int:
        return cores  # the actors wait while the learner trains

    def behaviour(self, k: int) -> int:
        return k

    def after(self, k: int, version: int) -> Boundary:
        return self.published_after(k + 1, version)


# a RunMode's schedule (sf/cfg/mode.py) -> its class
SCHEDULES = {"async": AsyncSchedule, "hts": HtsSchedule, "ppo": PpoSchedule}


def schedule_class(cfg: Config) -> type[AsyncSchedule | IntervalSchedule]:
    """The batch schedule of the run's mode (cfg.mode.schedule)."""
    if cfg.mode.schedule is None:
        raise ValueError(f"mode {cfg.mode.name} trains nothing: no learner, no batch schedule")
    return SCHEDULES[cfg.mode.schedule]
