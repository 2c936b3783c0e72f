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
        views = {"obs", "final_obs", *self._packed.views}
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
        [N, T(+1), ...] (final_rnn [N, H], final_t [N]) on `device`, in the storage layout, in the order of `slots` (the
        copy frees the slots for reuse at once).
        """
        out = {"obs": {k: v.index_select(0, slots).to(device, non_blocking=True) for k, v in self.obs.items()},
               "final_obs": {k: v.index_select(0, slots).to(device, non_blocking=True) for k, v in self.final_obs.items()}}
        for k, v in self.step_tensors().items():
            if k != "action_noise":  # consumed by the policy workers
                out[k] = v.index_select(0, slots).to(device, non_blocking=True)
        return out

    @staticmethod
    def bytes_needed(num_slots: int, rollout: int, obs_space, action_space, rnn_state_size: int) -> int:
        per_step = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in obs_space.spaces.values())
        per_step += 4 * rnn_state_size + 8 * int(np.prod(action_shape(action_space)))
        per_step += 4 * num_action_logits(action_space) + 4 * 5 + 8 + 1 + 4 * int(np.prod(action_shape(action_space)))
        per_slot = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in obs_space.spaces.values())
        per_slot += 4 * rnn_state_size + 8  # final_obs, final_rnn, final_t
        return num_slots * ((rollout + 1) * per_step + per_slot)


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
