"""The sampling stage in this process, for tests that step it by hand: one rollout worker and one policy worker over
real shared buffers, queues and weights (tests/sampling, and the in-process self-healing tests in tests/runner)."""
from types import SimpleNamespace

import torch

from sf.buffers.shared_weights import SharedWeights
from sf.buffers.trajectory_buffers import TrajectoryBuffers
from sf.cfg import parse_cfg
from sf.ipc import Queue
from sf.model.actor_critic import create_actor_critic
from sf.processes.shared_state import SharedState
from sf.sampling.policy_worker import PolicyWorker
from sf.sampling.rollout_worker import RolloutWorker
from sf_envs.registry import make_env


class Run:
    """One rollout worker (W workers' layout, this one is worker 0 unless told), one policy worker, shared buffers."""

    def __init__(self, tmp_path, *flags, workers=1, envs=4, rollout=8):
        self.cfg = cfg = parse_cfg(["--env", "test_corridor", "--num_workers", str(workers), "--num_envs_per_worker",
                                    str(envs), "--rollout", str(rollout), "--recurrence", str(rollout),
                                    "--rnn_size", "16", "--hidden_size", "16", "--batch_size", str(rollout * 2),
                                    "--device", "cpu", "--train_dir", str(tmp_path), "--seed", "3", *flags])
        env = make_env(cfg, 0)
        self.obs_space, self.action_space = env.observation_space, env.action_space
        env.close()
        self.model = create_actor_critic(cfg, self.obs_space, self.action_space)
        n = 2 * workers * envs
        self.buffers = TrajectoryBuffers(n, rollout, self.obs_space, self.action_space, self.model.rnn_state_size)
        self.weights = SharedWeights(self.model)
        self.weights.publish(self.model, 0)
        self.state = SharedState(workers, num_slots=n)
        self.env_slots = torch.zeros((workers, envs, 2), dtype=torch.int64).share_memory_()
        self.queues = SimpleNamespace(policy=Queue(), workers=[Queue() for _ in range(workers)], learner=Queue(),
                                      free=Queue(), report=Queue(max_size_bytes=2**22))
        if cfg.sync_mode == "async":
            self.queues.free.put_many(list(range(n)))
        self.policy = PolicyWorker(cfg, self.obs_space, self.action_space, self.buffers, self.env_slots, self.queues,
                                   self.weights, "cpu", shared_state=self.state)
        self.policy.wait_for_weights(lambda: False)
        q = self.queues
        self.worker = RolloutWorker(cfg, 0, self.buffers, self.env_slots, SimpleNamespace(
            policy=q.policy, worker=q.workers[0], learner=q.learner, free=q.free, report=q.report), self.state)
        self.worker.start()

    def step(self, times=1):
        for _ in range(times):
            self.policy.run_once(timeout=0.05)
            self.worker.run_once(timeout=0.05)

    def finished_slots(self):
        try:
            return [int(s) for s in self.queues.learner.get_many(timeout=0.0)]
        except Exception:
            return []

    def close(self):
        self.worker.close()
        for q in (self.queues.policy, self.queues.learner, self.queues.free, self.queues.report, *self.queues.workers):
            q.close()
