"""Trajectory buffers: every per-step tensor of the system, preallocated once in shared memory.

Storage layout (see docs/architecture.md), N = number of trajectory slots, T = --rollout:

    obs[key]          [N, T+1, *obs_shape]  env dtype (uint8 images)   rollout worker
    rnn_states        [N, T+1, H]           float32                    policy worker (t+1); zeroed after done
    actions           [N, T, A]             int64 / float32            policy worker
    action_logits     [N, T, L]             float32                    policy worker
    log_probs         [N, T]                float32                    policy worker
    values            [N, T]                float32                    policy worker
    policy_versions   [N, T]                int64                      policy worker
    policy_ids        [N, T]                int8                       policy worker: the policy that acted (a slot
                                                                         belongs to one policy's learner, which masks
                                                                         steps another policy acted, see rollout_worker)
    rewards           [N, T]                float32                    rollout worker
    dones             [N, T]                float32                    rollout worker (terminated or truncated)
    truncated         [N, T]                float32                    rollout worker (cut by a time limit)
    action_noise      [N, T, A]             float32                    rollout worker (hts/ppo modes only)
    final_obs[key]    [N, *obs_shape]       env dtype                  rollout worker: the last observation of the
    final_rnn         [N, H]                float32                      slot's first truncated episode, its RNN state,
    final_t           [N]                   int64                        and its step (-1: none)

Slot T holds the state after the last step (the learner bootstraps from it); it equals slot 0 of the
env's next trajectory. An episode cut by a time limit is not over: the learner bootstraps its last step from
the value of its final observation, which the reset overwrote in obs[., t+1], hence final_obs (one per slot:
a second truncation in one trajectory, from episodes shorter than T, bootstraps from V(x_t) instead).
Messages between processes carry slot indices into these tensors, never data.
Fresh buffers are poisoned (NaN, -1, 0xCD) so that reading a slot nobody wrote is visible.

A CUDA learner's batch also holds the dones in host memory, under DONES_HOST ([N, T] float32, a copy made at gather
time): the recurrent core cuts its pass at episode ends, and reading them there costs no wait for the device.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from sf.utils.packed import PackedTensors
from sf.model.action_spaces import action_dtype, action_shape, num_action_logits

POISON_UINT8 = 0xCD


def _torch_dtype(np_dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype


class TrajectoryBuffers:
    """Shared-memory tensors for `num_slots` trajectories of length `rollout`, all views of one packed storage.
    Picklable: children receive the same memory (torch.multiprocessing passes its one file descriptor)."""

    def __init__(self, num_slots: int, rollout: int, obs_space, action_space, rnn_state_size: int):
        n, t = num_slots, rollout
        self.num_slots, self.rollout = n, t
        with torch.device("meta"):  # shapes and dtypes only: the memory is the packed storage below
            self.obs = {k: torch.empty((n, t + 1, *s.shape), dtype=_torch_dtype(s.dtype))
                        for k, s in obs_space.spaces.items()}
            self.rnn_states = torch.empty((n, t + 1, rnn_state_size), dtype=torch.float32)
            self.actions = torch.empty((n, t, *action_shape(action_space)), dtype=action_dtype(action_space))
            self.action_logits = torch.empty((n, t, num_action_logits(action_space)), dtype=torch.float32)
            self.log_probs = torch.empty((n, t), dtype=torch.float32)
            self.values = torch.empty((n, t), dtype=torch.float32)
            self.policy_versions = torch.empty((n, t), dtype=torch.int64)
            self.policy_ids = torch.empty((n, t), dtype=torch.int8)
            self.rewards = torch.empty((n, t), dtype=torch.float32)
            self.dones = torch.empty((n, t), dtype=torch.float32)
            self.truncated = torch.empty((n, t), dtype=torch.float32)
            self.action_noise = torch.empty((n, t, *action_shape(action_space)), dtype=torch.float32)
            self.final_obs = {k: torch.empty((n, *s.shape), dtype=_torch_dtype(s.dtype))
                              for k, s in obs_space.spaces.items()}
            self.final_rnn = torch.empty((n, rnn_state_size), dtype=torch.float32)
            self.final_t = torch.empty((n,), dtype=torch.int64)
        # one shared storage for all of them: a process receiving the buffers gets one file descriptor (the fork
        # server sends a new process at most sf.processes.fds.MAX_FDS_SENT)
        self._packed = PackedTensors(self._named())
        self._views()
        self.poison()

    def _named(self) -> dict:
        """Every tensor by a unique name (observation keys prefixed)."""
        return {**{f"obs/{k}": v for k, v in self.obs.items()},
                **{f"final_obs/{k}": v for k, v in self.final_obs.items()}, **self.step_tensors()}

    def _views(self) -> None:
        """Point every tensor attribute at its view of the packed storage."""
        views = self._packed.views
        self.obs = {k[len("obs/"):]: v for k, v in views.items() if k.startswith("obs/")}
        self.final_obs = {k[len("final_obs/"):]: v for k, v in views.items() if k.startswith("final_obs/")}
        for name, view in views.items():
            if not name.startswith(("obs/", "final_obs/")):
                setattr(self, name, view)

    def __getstate__(self) -> dict:  # the views are rebuilt in the receiving process from the one packed storage
        views = {"obs", "final_obs", "_staging", *self._packed.views}  # (staging: the learner's own, see gather)
        return {k: v for k, v in self.__dict__.items() if k not in views}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._views()

    def step_tensors(self) -> dict:
        """Name -> tensor for everything except observations."""
        return dict(rnn_states=self.rnn_states, actions=self.actions, action_logits=self.action_logits,
                    log_probs=self.log_probs, values=self.values, policy_versions=self.policy_versions,
                    policy_ids=self.policy_ids,
                    rewards=self.rewards, dones=self.dones, truncated=self.truncated, action_noise=self.action_noise,
                    final_rnn=self.final_rnn, final_t=self.final_t)

    def all_tensors(self) -> list:
        return list(self.obs.values()) + list(self.final_obs.values()) + list(self.step_tensors().values())

    def poison(self) -> None:
        for tensor in self.all_tensors():
            if tensor.dtype.is_floating_point:
                tensor.fill_(float("nan"))
            elif tensor.dtype == torch.uint8:
                tensor.fill_(POISON_UINT8)
            else:
                tensor.fill_(-1)

    def gather(self, slots: torch.Tensor, device) -> dict:
        """Copy whole trajectories out of shared memory: the learner's experience dict.

        slots: [N] int64 slot indices. Returns obs dict [N, T+1, ...], final_obs dict [N, ...] and the other tensors
        [N, T(+1), ...] (final_rnn [N, H], final_t [N]) on `device`, in the storage layout, in the order of `slots`.
        When it returns, the slots have been read (they may be reused at once): the copy out of shared memory is a host
        copy (gather_into) into fresh tensors, which are the batch on the CPU; for CUDA into pinned staging buffers,
        copied to the device asynchronously (GatherStaging).
        """
        device = torch.device(device)
        if device.type != "cuda":
            return self.gather_into(slots)
        staging = self.__dict__.get("_staging")
        if staging is None or staging.rows != len(slots) or staging.device != device:
            staging = self._staging = GatherStaging(self, len(slots), device)
        return staging.to_device(self.gather_into(slots, staging.acquire()))

    def gather_into(self, slots: torch.Tensor, out: dict | None = None) -> dict:
        """The trajectories `slots` [N] in host memory, in the layout gather returns: into the tensors of `out` (a dict
        of that layout, e.g. GatherStaging's) or into fresh ones."""
        def take(src: torch.Tensor, *key: str) -> torch.Tensor:
            if out is None:
                return src.index_select(0, slots)
            return torch.index_select(src, 0, slots, out=out[key[0]][key[1]] if len(key) == 2 else out[key[0]])

        return {"obs": {k: take(v, "obs", k) for k, v in self.obs.items()},
                "final_obs": {k: take(v, "final_obs", k) for k, v in self.final_obs.items()},
                **{k: take(v, k) for k, v in self.step_tensors().items()
                   if k != "action_noise"}}  # (action noise: consumed by the policy workers)

    @staticmethod
    def bytes_needed(num_slots: int, rollout: int, obs_space, action_space, rnn_state_size: int) -> int:
        per_step = obs_bytes(obs_space)
        per_step += 4 * rnn_state_size + 8 * int(np.prod(action_shape(action_space)))
        per_step += 4 * num_action_logits(action_space) + 4 * 5 + 8 + 1 + 4 * int(np.prod(action_shape(action_space)))
        per_slot = obs_bytes(obs_space)
        per_slot += 4 * rnn_state_size + 8  # final_obs, final_rnn, final_t
        return num_slots * ((rollout + 1) * per_step + per_slot)


def obs_bytes(obs_space) -> int:
    """Bytes of one observation of the Dict space `obs_space` (all its keys)."""
    return sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in obs_space.spaces.values())


DONES_HOST = "dones_host"


class GatherStaging:
    """A CUDA learner's way from shared memory to the device: `depth` sets of pinned host buffers in gather's layout for
    `rows` trajectories, used in turn, each copied to the device on a side stream (non_blocking: it overlaps the
    training kernels of the batch before). The host fills a set again only after the copy out of it finished (an event
    recorded after the copy, waited on in acquire), and the consumer's stream waits for the copy before the batch's
    first use."""

    def __init__(self, buffers: TrajectoryBuffers, rows: int, device: torch.device, depth: int = 2):
        self.rows, self.device = rows, torch.device(device)
        layout = buffers.gather_into(torch.zeros(0, dtype=torch.int64))  # no trajectory: the shapes and dtypes
        self.sets = [_tree(layout, lambda t: torch.empty((rows, *t.shape[1:]), dtype=t.dtype, pin_memory=True))
                     for _ in range(depth)]
        self.copied: list = [None] * depth  # the event after each set's last copy to the device
        self.turn = 0
        self.stream = torch.cuda.Stream(self.device)

    def acquire(self) -> dict:
        """The next set, once the copy out of it (two batches ago) finished."""
        if self.copied[self.turn] is not None:
            self.copied[self.turn].synchronize()
        return self.sets[self.turn]

    def to_device(self, host: dict) -> dict:
        """The set `host` (just filled) on the device: copies queued on the side stream; the current stream (the
        batch's consumer: the learner's threads share the device's default stream) waits for them."""
        consumer = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):  # (the device memory is allocated for the side stream ...)
            out = _tree(host, lambda t: t.to(self.device, non_blocking=True))
            self.copied[self.turn] = torch.cuda.Event()
            self.copied[self.turn].record(self.stream)
        consumer.wait_event(self.copied[self.turn])
        _tree(out, lambda t: t.record_stream(consumer))  # (... and used on the consumer's: freed only after its use)
        out[DONES_HOST] = host["dones"].clone()  # the set is refilled two batches on: a copy of its 4 N T bytes
        self.turn = (self.turn + 1) % len(self.sets)
        return out


def _tree(tree: dict, fn) -> dict:
    return {k: _tree(v, fn) if isinstance(v, dict) else fn(v) for k, v in tree.items()}


def shm_available_bytes(path: str = "/dev/shm") -> int:
    """Free bytes of the shared-memory filesystem torch allocates from."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def shm_used_bytes(path: str = "/dev/shm") -> int:
    """Bytes in use on that filesystem (0 where it cannot be read): what an env's engine allocates there is counted
    in its memory."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize
