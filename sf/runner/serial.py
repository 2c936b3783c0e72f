"""Serial mode (--serial_mode, for debugging): every component of the run in the runner's own process, stepped
round-robin: the policy workers, the rollout workers, the learners, then the runner's supervision step (Runner.step,
the same as in the parallel mode's loop). Any layout of the parallel mode works: a rollout worker that finds no free
slot runs the learners (which free them) and the supervision step instead of waiting for them."""
from __future__ import annotations

import time

from sf.learning.learner import Learner, learner_threads
from sf.processes.control import limit_threads
from sf.runner.queues import learner_queues, policy_queues, worker_queues
from sf.sampling.policy_worker import PolicyWorker
from sf.sampling.rollout_worker import RolloutWorker


def run_serial(runner, start: float) -> None:
    """Run until the budget or a stop request: `runner` (sf.runner.runner.Runner) has built what the components
    share; start: the run's start (time.time())."""
    cfg, P, q = runner.cfg, runner.num_policies, runner.queues
    limit_threads(learner_threads(cfg))  # the learner's threads, as in its own process: the same bits
    learners = [Learner(cfg, runner.obs_space, runner.action_space, runner.buffers, learner_queues(q, p),
                        runner.weights[p], runner.state, runner.device, runner.exp_dir, runner.spec.frameskip,
                        runner.shape, p, runner.weights)
                for p in range(P)]
    runner.stats.start_frames = sum(learner.env_steps for learner in learners)
    runner.learner_ready = True  # (built here: frames count from where their checkpoints left them)
    policies = [PolicyWorker(cfg, runner.obs_space, runner.action_space, runner.buffers, runner.env_slots,
                             policy_queues(q, p), runner.weights[p], runner.device, policy_id=p, shape=runner.shape)
                for p in range(P)]
    for policy in policies:
        policy.wait_for_weights(runner.state.stopping)
    runner.last_report = runner.last_summary = time.time()

    def periodic() -> None:  # the runner's periodic work, also while a worker waits for a slot
        runner.reports.drain()
        runner.step(start)
        if runner.budget_reached(start):
            runner.state.request_stop()

    def train() -> None:
        for learner in learners:  # (each applies its PBT updates before training a batch)
            learner.run_once(timeout=0.0)

    def starved() -> None:
        train()
        periodic()

    workers = []
    try:
        for index in range(cfg.num_workers):
            workers.append(RolloutWorker(cfg, index, runner.buffers, runner.env_slots, worker_queues(q, index),
                                         runner.state, on_starved=starved, shape=runner.shape,
                                         policies=list(runner.policies)))
            workers[-1].start()
        while not runner.state.stopping():
            for policy in policies:
                policy.run_once(timeout=0.0)
            for w in workers:
                w.run_once(timeout=0.0)
            train()
            periodic()
    except StopIteration:  # a worker waiting for a slot saw the stop request
        pass
    finally:
        for learner in learners:
            learner.finish()
        runner.reports.drain()
        for w in workers:
            w.close()
