"""Policy worker: stateless batched inference for any env step of any rollout worker.

Loop: `get_many` requests `(worker, group)` from the policy queue; look up each env's `(slot, t)` in
`env_slots`; gather observations and RNN states by index; one forward pass on the device; sample
actions; write actions, logits, behaviour log-probs, values, the policy version and rnn_states[t+1]
into the trajectory buffers in place; reply `group` on each worker's queue. Before every batch it
copies new weights if the learner's shared version moved (instant weight updates, paper section 3.1).
"""
from __future__ import annotations

import os
import time
from queue import Empty

import numpy as np
import torch

from sf.model.actor_critic import create_actor_critic


class PolicyWorker:
    def __init__(self, cfg, obs_space, action_space, buffers, env_slots, queues, shared_weights, device: str):
        self.cfg, self.buffers, self.env_slots, self.q = cfg, buffers, env_slots, queues
        self.shared_weights, self.device = shared_weights, torch.device(device)
        self.group_size = cfg.num_envs_per_worker // cfg.worker_num_splits
        self.random_policy = getattr(cfg, "random_policy", False)
        self.model = create_actor_critic(cfg, obs_space, action_space).to(self.device).eval()
        self.version = -1
        self.max_requests = cfg.num_workers * cfg.worker_num_splits
        self._offsets = np.arange(self.group_size)

    def wait_for_weights(self, stopping) -> None:
        """Block until the learner published its first weights (after loading a checkpoint, say)."""
        while self.version < 0 and not stopping():
            self.version = self.shared_weights.load_into(self.model, self.version)
            if self.version < 0:
                time.sleep(0.01)

    def run_once(self, timeout: float = 0.1) -> int:
        """Serve one batch of requests; returns the number of env steps served (0 on timeout)."""
        try:
            requests = self.q.policy.get_many(timeout=timeout, max_messages_to_get=self.max_requests)
        except Empty:
            return 0
        self.version = self.shared_weights.load_into(self.model, self.version)
        req = np.asarray(requests, dtype=np.int64).reshape(-1, 2)  # [R, (worker, group)]
        workers = np.repeat(req[:, 0], self.group_size)
        envs = (req[:, 1:2] * self.group_size + self._offsets).reshape(-1)
        idx = self.env_slots[torch.from_numpy(workers), torch.from_numpy(envs)]  # [B, 2] (slot, t)
        slots, ts = idx[:, 0], idx[:, 1]
        self._infer(slots, ts)
        for w, g in req:
            self.q.workers[int(w)].put(int(g))
        return len(slots)

    @torch.inference_mode()
    def _infer(self, slots: torch.Tensor, ts: torch.Tensor) -> None:
        """slots, ts: [B] int64. Writes the step outputs for (slot, t) and the RNN state for (slot, t+1)."""
        b = self.buffers
        obs = {k: v[slots, ts].to(self.device, non_blocking=True) for k, v in b.obs.items()}
        rnn = b.rnn_states[slots, ts].to(self.device, non_blocking=True)
        if self.random_policy:  # sampler benchmark: uniform logits, no network
            logits = torch.zeros((len(slots), b.action_logits.shape[-1]), device=self.device)
            values, new_rnn = torch.zeros(len(slots), device=self.device), rnn
        else:
            out = self.model.forward_step(obs, rnn)
            logits, values, new_rnn = out.action_logits, out.values, out.new_rnn_states
        dist = self.model.action_distribution(logits)
        actions = dist.sample()
        log_probs = dist.log_prob(actions)
        b.actions[slots, ts] = actions.to("cpu").to(b.actions.dtype)
        b.action_logits[slots, ts] = logits.float().cpu()
        b.log_probs[slots, ts] = log_probs.float().cpu()
        b.values[slots, ts] = values.float().cpu()
        b.policy_versions[slots, ts] = self.version
        b.rnn_states[slots, ts + 1] = new_rnn.float().cpu()


def run_policy_worker(cfg, obs_space, action_space, buffers, env_slots, queues, shared_weights, shared_state, device) -> None:
    """Process entry: normal priority, `--policy_worker_torch_threads` threads."""
    from sf.runner.supervision import limit_threads
    limit_threads(cfg.policy_worker_torch_threads)
    parent = os.getppid()
    worker = PolicyWorker(cfg, obs_space, action_space, buffers, env_slots, queues, shared_weights, device)
    worker.wait_for_weights(shared_state.stopping)
    while not shared_state.stopping() and os.getppid() == parent:
        worker.run_once(timeout=0.1)
