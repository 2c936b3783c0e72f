"""Policy worker: stateless batched inference for any env step of any rollout worker.

Loop: `get_many` requests `(worker, group)` from the policy queue; look up each env's `(slot, t)` in
`env_slots`; gather observations and RNN states by index; one forward pass on the device; sample
actions; write actions, logits, behaviour log-probs, values, the policy version and rnn_states[t+1]
into the trajectory buffers in place; reply `group` on each worker's queue. Before every batch it
copies new weights if the learner's shared version moved (instant weight updates, paper section 3.1). With a compute
dtype (--precision) the copy stores the weights in it (ActorCritic.cast_for_inference): cast once per version.

--sync_mode hts/ppo: every batch runs through the model in chunks of exactly --sync_inference_chunk rows (padded), and
actions come from the noise each env drew for its observation: an observation's outputs are then the same bits whatever
batch, worker or layout served it (measured: CPU kernels give different bits for one row at different batch sizes, the
same bits at one batch size whatever the row's position or neighbours). The learner publishes weights only at batch
boundaries in these modes, so every request of an interval sees the same weights.

Populations (--num_policies N): each policy has its own policy workers, request queue and weights. A request (w, g)
names a group; env_slots[w, i] = (slot, t, policy) says which of its agents this worker's policy plays: it serves those
and writes its policy id into policy_ids (the learners mask steps another policy acted).

Self-healing: a request is (w, epoch * splits + g); one of an epoch the runner has voided (SharedState.epoch: the
rollout worker died, or another policy worker did) is dropped unanswered. SharedState.serving counts batches begun and
finished (odd while serving one): the runner waits for a batch begun before it voided an epoch before it reuses that
worker's slots or lets it ask again.

Pacing (async): while its learner has --num_batches_to_accumulate training batches out of shared memory (copied, not
yet trained on: SharedState.batches_out), a policy worker serves no request, and the rollout workers waiting on it
pause: collection follows the learner instead of filling every spare slot with experience that several SGD steps will
have made stale by the time it trains (Sample Factory's stop_experience_collection).
"""
from __future__ import annotations

import time
from queue import Empty
from typing import TYPE_CHECKING, Optional

import numpy as np
import torch

from sf.cfg.context import RunContext
from sf.buffers.shared_weights import ActingModels
from sf.cfg.shape import RunShape
from sf.model.action_spaces import ACTION_MASK_KEY, uniform_valid_actions
from sf.model.actor_critic import create_actor_critic, run_precision
from sf.seeding import POLICY_WORKER, deterministic_kernels, run_seed, stream_seed

if TYPE_CHECKING:
    from sf.cfg.config import Config

PACED_POLL_SEC = 0.002  # how often a paused policy worker looks whether its learner took a batch


class PolicyWorker:
    def __init__(self, cfg: Config, obs_space, action_space, buffers, env_slots, queues, shared_weights, device: str,
                 worker_idx: int = 0, policy_id: int = 0, shared_state=None, shape: Optional[RunShape] = None):
        """queues.policy: this policy's request queue; queues.workers: every rollout worker's reply queue;
        shared_weights: this policy's. env_slots: [W, E * A, 3] (slot, t, policy) or [W, E * A, 2] (one policy).
        shared_state: the run's (epochs, serving counter); None: every request is valid (tests). shape: the run's
        (the runner's, computed once); None: this configuration's with env_slots' agents (in-process tests)."""
        self.cfg, self.buffers, self.env_slots, self.queues = cfg, buffers, env_slots, queues
        self.policy_id = policy_id
        self.population = cfg.num_policies > 1 and env_slots.shape[-1] > 2
        # the deterministic modes (hts/ppo, sf.eval): actions from each env's noise, the model run in fixed-size chunks
        self.deterministic = cfg.mode.deterministic
        self.argmax = cfg._eval_plan is not None and bool(cfg.eval_deterministic)  # sf.eval --deterministic
        self.chunk = cfg.sync_inference_chunk
        seed = stream_seed(run_seed(cfg), POLICY_WORKER, policy_id, worker_idx)
        torch.manual_seed(seed)  # action sampling in async mode
        if self.deterministic:
            deterministic_kernels(device)
        self.shared_weights, self.device = shared_weights, torch.device(device)
        shape = shape or RunShape.of(cfg, env_slots.shape[1] // cfg.num_envs_per_worker)
        self.group_size = shape.agents_per_group
        self.random_policy = cfg.random_policy
        model = create_actor_critic(cfg, obs_space, action_space).to(self.device).eval()
        model.row_independent_heads = self.deterministic  # (the chunks' rows must not depend on each other's bits)
        run_precision(cfg, model, self.device, deterministic=self.deterministic)
        model.cast_for_inference()  # weights cast once per published version, not once per forward
        self.acting = ActingModels(model)  # never acts with a copy a stalled or dead learner tore
        self.version = -1
        self.max_requests = shape.groups
        # async: wait briefly for one request per rollout worker this worker serves (see run_once); the sync modes'
        # intervals end with fewer requests in flight, and their batches' composition does not change their cost
        self.batch_requests = max(1, cfg.num_workers // max(1, cfg.policy_workers_per_policy))
        self.batch_wait = 0.0 if self.deterministic else cfg.policy_worker_batch_wait_ms / 1000.0
        self.splits = cfg.worker_num_splits
        self.epoch = shared_state.epoch_np if shared_state is not None else np.zeros(cfg.num_workers, dtype=np.int64)
        self.serving = shared_state.serving_np if shared_state is not None else np.zeros(1, dtype=np.int64)
        self.serving_row = shared_state.serving_index(policy_id, worker_idx) if shared_state is not None else 0
        self.serving[self.serving_row] += self.serving[self.serving_row] % 2  # a predecessor killed while serving
        # numpy views of the shared tensors, flattened over (slot, t): one 1-D fancy index per tensor instead of
        # torch's two-tensor advanced indexing (which costs ~10x more per call at these small batch sizes).
        b = buffers
        self.T = b.rewards.shape[1]
        # env_slots [W, E * A, C] viewed as [W * splits, G, C]: request (w, g) is row w * splits + g, its G agents'
        # (slot, t[, policy])
        self.group_slots = env_slots.view(shape.groups, self.group_size, env_slots.shape[-1]).numpy()
        n = b.rewards.shape[0]
        self.obs_flat = {k: v.view(n * (self.T + 1), *v.shape[2:]).numpy() for k, v in b.obs.items()}
        self.rnn_flat = b.rnn_states.view(n * (self.T + 1), -1).numpy()
        self.step_flat = {k: getattr(b, k).view(n * self.T, *getattr(b, k).shape[2:]).numpy()
                          for k in ("actions", "action_logits", "log_probs", "values", "policy_versions", "policy_ids",
                                   "action_noise")}
        # --random_policy on (Multi)Discrete spaces: uniform actions drawn in numpy, constant log-prob.
        from gymnasium import spaces
        self.random_nvec = None
        if isinstance(action_space, spaces.Discrete):
            self.random_nvec = np.array([action_space.n], dtype=np.int64)
        elif isinstance(action_space, spaces.MultiDiscrete):
            self.random_nvec = np.asarray(action_space.nvec, dtype=np.int64).reshape(-1)
        # with an "action_mask" observation the uniform policy is over each step's valid actions (written per step)
        self.random_masked = self.random_nvec is not None and getattr(self.model, "action_masked", False)
        if self.random_nvec is not None:
            self.random_log_prob = -float(np.log(self.random_nvec.astype(np.float64)).sum())
            self.rng = np.random.default_rng(seed)
            if self.random_policy:  # the uniform policy's constant outputs, written once for every (slot, t)
                for tensor, value in ((b.action_logits, 0.0), (b.log_probs, self.random_log_prob), (b.values, 0.0),
                                      (b.rnn_states, 0.0)):  # (every policy worker writes the same values)
                    tensor.fill_(value)

    @property
    def model(self) -> torch.nn.Module:
        """The model that acts: the newest version that came whole (ActingModels)."""
        return self.acting.active

    def wait_for_weights(self, stopping, beat=lambda: None) -> None:
        """Block until the learner published its first weights (after loading a checkpoint, say); `beat()` while
        waiting tells the runner's watchdog that this worker is alive (a stuck learner is the learner's stall)."""
        while self.version < 0 and not stopping():
            beat()
            self.version = self.acting.refresh(self.shared_weights)
            if self.version < 0:
                time.sleep(0.01)

    def run_once(self, timeout: float = 0.1) -> int:
        """Serve one batch of requests; returns the number of env steps served (0 on timeout)."""
        try:
            requests = self.queues.policy.get_many(timeout=timeout, max_messages_to_get=self.max_requests)
        except Empty:
            return 0
        if len(requests) < self.batch_requests and self.batch_wait > 0:
            requests = self._more_requests(requests)
        self.serving[self.serving_row] += 1  # odd: serving (before the epochs are read: see the module docstring)
        try:
            return self._serve(np.asarray(requests, dtype=np.int64))  # [R, (worker, epoch * splits + group)]
        finally:
            self.serving[self.serving_row] += 1

    def _more_requests(self, requests: list) -> list:
        """Wait up to --policy_worker_batch_wait_ms for more requests, until one per rollout worker served has come:
        a forward pass of a convolutional model costs nearly as much for 4 rows as for 16 (weights read, per-call
        overhead), and the rollout workers step their other env group while their request waits."""
        deadline = time.monotonic() + self.batch_wait
        while len(requests) < self.batch_requests:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                requests = requests + self.queues.policy.get_many(
                    timeout=left, max_messages_to_get=self.max_requests - len(requests))
            except Empty:
                break
        return requests

    def _serve(self, req: np.ndarray) -> int:
        epochs, groups = np.divmod(req[:, 1], self.splits)
        live = epochs == self.epoch[req[:, 0]]
        if not live.all():  # requests the runner voided (their worker died, or asks again): dropped unanswered
            req, groups = req[live], groups[live]
            if len(req) == 0:
                return 0
        self.version = self.acting.refresh(self.shared_weights)
        rows = self.group_slots[req[:, 0] * self.splits + groups]  # [R, G, (slot, t[, policy])]
        rows = rows.reshape(-1, rows.shape[-1])
        if self.population:  # the agents of these groups this policy plays
            rows = rows[rows[:, 2] == self.policy_id]
        slots, ts = rows[:, 0], rows[:, 1]  # [B]
        step = slots * self.T + ts  # flat index into [N * T] tensors
        if self.random_policy and self.random_nvec is not None:
            self._random_actions(step, slots * (self.T + 1) + ts)
        else:
            self._infer(step, slots * (self.T + 1) + ts)  # observations: flat index into [N * (T+1)] tensors
        for worker, code in req.tolist():
            self.queues.workers[worker].put(code)
        return len(step)

    def _random_actions(self, step: np.ndarray, obs_i: np.ndarray) -> None:
        """Sampler benchmark on (Multi)Discrete actions (the paper's "infinitely fast action generation"): uniform
        actions drawn in numpy, no network, no torch. step, obs_i: [B] flat indices of (slot, t) into the [N * T] and
        [N * (T+1)] buffers. With an action mask the actions are uniform over the step's valid ones, and that step's
        log-probs and logits are written with them."""
        out = self.step_flat  # otherwise logits, log-probs, values and RNN states are constant: written in __init__
        if self.random_masked:
            u = out["action_noise"][step] if self.deterministic else self.rng.random((len(step), len(self.random_nvec)))
            actions, out["log_probs"][step], out["action_logits"][step] = uniform_valid_actions(
                u, self.random_nvec.tolist(), self.obs_flat[ACTION_MASK_KEY][obs_i])
            out["actions"][step] = actions
        elif self.deterministic:  # each env's own noise: uniforms in [0, 1) -> uniform actions
            u = out["action_noise"][step].astype(np.float64)
            out["actions"][step] = np.minimum((u * self.random_nvec).astype(np.int64), self.random_nvec - 1)
        else:
            out["actions"][step] = self.rng.integers(self.random_nvec, size=(len(step), len(self.random_nvec)))
        out["policy_versions"][step] = self.version
        out["policy_ids"][step] = self.policy_id

    @torch.inference_mode()
    def _infer(self, step: np.ndarray, obs_i: np.ndarray) -> None:
        """One batched forward for B env steps. step, obs_i: [B] flat indices of (slot, t) into the [N * T] and
        [N * (T+1)] buffers. Writes the step outputs at `step` and the RNN state at `obs_i + 1` (= (slot, t+1))."""
        out = self.step_flat
        rnn = torch.from_numpy(self.rnn_flat[obs_i]).to(self.device, non_blocking=True)
        if self.random_policy:  # sampler benchmark (Box actions): standard-normal logits, no network
            logits = torch.zeros((len(step), out["action_logits"].shape[-1]), device=self.device)
            values, new_rnn = torch.zeros(len(step), device=self.device), rnn
        else:
            obs = {k: torch.from_numpy(v[obs_i]).to(self.device, non_blocking=True) for k, v in self.obs_flat.items()}
            logits, values, new_rnn = (self._forward_chunked(obs, rnn) if self.deterministic
                                       else self.model.forward_step(obs, rnn))
        dist = self.model.action_distribution(logits)
        if self.argmax:
            actions = dist.mode()
        elif self.deterministic:
            actions = dist.sample(torch.from_numpy(out["action_noise"][step]).to(self.device, non_blocking=True))
        else:
            actions = dist.sample()
        log_probs = dist.log_prob(actions)
        actions, logits, log_probs, values, new_rnn = self._to_host(
            actions, logits.float(), log_probs.float(), values.float(), new_rnn.float())
        out["actions"][step] = actions.numpy()
        out["action_logits"][step] = logits.numpy()
        out["log_probs"][step] = log_probs.numpy()
        out["values"][step] = values.numpy()
        out["policy_versions"][step] = self.version
        out["policy_ids"][step] = self.policy_id
        self.rnn_flat[obs_i + 1] = new_rnn.numpy()

    def _to_host(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """The batch's outputs in host memory with one wait for the device (CUDA: every copy queued non_blocking into
        pinned memory, then one synchronisation, instead of one per .cpu()). (The inputs go the other way from the
        numpy rows as they are: a copy from pageable memory is staged by the driver at once, without waiting for the
        device, and nothing is queued before it.)"""
        if self.device.type != "cuda":
            return list(tensors)
        host = [t.to("cpu", non_blocking=True) for t in tensors]
        torch.cuda.current_stream(self.device).synchronize()
        return host


    def _forward_chunked(self, obs: dict, rnn: torch.Tensor):
        """forward_step on chunks of exactly `self.chunk` rows, the last one padded with zeros: obs key -> [B, ...],
        rnn [B, H] -> (logits [B, L], values [B], new_rnn [B, H]), each row independent of the others' bits."""
        b, c = rnn.shape[0], self.chunk
        pad = -b % c
        if pad:
            obs = {k: torch.cat([v, v.new_zeros((pad, *v.shape[1:]))]) for k, v in obs.items()}
            rnn = torch.cat([rnn, rnn.new_zeros((pad, rnn.shape[1]))])
        outs = [self.model.forward_step({k: v[i:i + c] for k, v in obs.items()}, rnn[i:i + c])
                for i in range(0, b + pad, c)]
        return tuple(torch.cat(parts)[:b] for parts in zip(*outs))


def run_policy_worker(run: RunContext, worker_idx, buffers, env_slots, queues, shared_weights, shared_state,
                      policy_id: int) -> None:
    """Process entry (run: the run's context, sf/cfg/context.py): `--policy_worker_torch_threads` threads; on a CPU
    device at the rollout workers' priority (nice +5), below the learner's: the learner is the costliest stage on a CPU
    and every frame waits for it, while a policy worker at the same priority as the learner takes its time slices
    (measured on 2 cores, doom_battle 2 workers x 8 envs: 1.07x the frames/s at nice +5). On a GPU its forwards are the
    device's work: normal priority."""
    from sf.processes.control import bind_device, limit_threads, runner_alive, set_affinity
    from sf.processes.shared_state import policy_worker_name
    cfg, device = run.cfg, run.device
    bind_device(device)
    if torch.device(device).type == "cpu":
        set_affinity(None, nice=5)
    limit_threads(cfg.policy_worker_torch_threads)
    heartbeat = shared_state.heartbeat_slot(policy_worker_name(policy_id, worker_idx, shared_state.num_policies))
    worker = PolicyWorker(cfg, run.obs_space, run.action_space, buffers, env_slots, queues, shared_weights, device,
                          worker_idx, policy_id, shared_state, run.shape)
    worker.wait_for_weights(shared_state.stopping, lambda: shared_state.beat(heartbeat))
    shared_state.set_started(heartbeat)
    # a paced mode (async): no request served while the learner has --num_batches_to_accumulate batches out
    # (SharedState.batches_out)
    paced = cfg.num_batches_to_accumulate if cfg.mode.paced else 0
    while not shared_state.stopping() and runner_alive():
        shared_state.beat(heartbeat)
        if paced and shared_state.collection_paused(policy_id, paced):
            time.sleep(PACED_POLL_SEC)
            continue
        worker.run_once(timeout=0.1)
