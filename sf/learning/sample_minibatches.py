"""Minibatches of single samples (--sample_minibatches): CleanRL's PPO minibatches, and Sample Factory 2's shuffled
ones at recurrence 1, for feed-forward policies with GAE.

By default a minibatch is a set of whole trajectories of the training batch (N trajectories of T steps, storage layout
of sf.buffers.trajectory_buffers). With --sample_minibatches each minibatch is instead drawn from all the batch's steps
at random. GAE needs whole trajectories, so the batch's value targets and advantages are computed once, before its
first epoch (APPO._batch_targets: from the behaviour values, the policy workers' own, as the references compute them,
and the learner's value of each trajectory's state after its last step); a minibatch then carries its samples and their
targets as m one-step trajectories, [m, 1, ...], which APPO._sgd_step trains on as on any other (it skips its own target
computation for a minibatch that has them).

Why it exists: consecutive steps of one env can be nearly the same frame (Atari's Pong), and the advantages are
normalized per minibatch: a minibatch of a few whole trajectories where no reward fell normalizes the critic's noise
to unit scale, while a minibatch of samples from every trajectory mixes the steps near a reward with the others.
"""
from __future__ import annotations

import torch

from sf.buffers.trajectory_buffers import DONES_HOST

# the batch's targets that each minibatch of samples carries ([N, T] each, selected like the per-step keys)
TARGET_KEYS = ("targets", "advantages", "behavior_values")


def sample_minibatch(experience: dict, targets: dict, idx: torch.Tensor) -> dict:
    """The samples `idx` ([m] int64 on the batch's device; sample i * T + t is step t of trajectory i) of `experience`
    (storage layout, N trajectories of T steps) as m one-step trajectories: per-step keys [N, T, ...] -> [m, 1, ...];
    keys that also hold the state after the last step ([N, T+1, ...]: obs, rnn_states) -> the samples' own steps
    [m, 1, ...], without the state after them; the batch's `targets` (TARGET_KEYS, [N, T] each) -> [m, 1]. The final
    observations of truncated episodes and the host dones are left out: the targets already hold their bootstraps, and
    a one-step trajectory has no episode to cut."""
    t_len = experience["rewards"].shape[1]
    with_next = idx + idx // t_len  # the same samples in [N, T+1] tensors

    def pick(v):
        if isinstance(v, dict):
            return {k: pick(x) for k, x in v.items()}
        rows = with_next if v.shape[1] == t_len + 1 else idx
        return v.flatten(0, 1).index_select(0, rows).unsqueeze(1)  # (flatten: a view of a contiguous batch)

    out = {k: pick(v) for k, v in experience.items() if not k.startswith("final_") and k != DONES_HOST}
    out.update((k, pick(targets[k])) for k in TARGET_KEYS)
    return out
