"""Helpers for tests/model and tests/learning: a small cfg and synthetic observation/action spaces and batches."""
from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces


def make_cfg(**overrides):
    """The table defaults (sf.cfg.default_cfg) with `overrides`."""
    from sf.cfg import default_cfg
    return default_cfg(**overrides)


DOOM_OBS = spaces.Dict({"obs": spaces.Box(0, 255, (3, 72, 128), np.uint8)})
DOOM_FULL_OBS = spaces.Dict({"obs": spaces.Box(0, 255, (3, 72, 128), np.uint8),
                             "measurements": spaces.Box(-np.inf, np.inf, (23,), np.float32)})
ATARI_OBS = spaces.Dict({"obs": spaces.Box(0, 255, (4, 84, 84), np.uint8)})
VECTOR_OBS = spaces.Dict({"obs": spaces.Box(-np.inf, np.inf, (10,), np.float32)})
DOOM_FULL_ACTIONS = spaces.MultiDiscrete([3, 3, 2, 2, 2, 8, 21])  # Table A.4: 7 heads, 12096 combinations


def make_obs(obs_space, lead_shape, generator=None) -> dict:
    """Random observations [*lead_shape, *shape] in storage dtype."""
    out = {}
    for k, s in obs_space.spaces.items():
        shape = (*lead_shape, *s.shape)
        if s.dtype == np.uint8:
            out[k] = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
        elif isinstance(s, spaces.MultiBinary):  # action masks
            out[k] = torch.randint(0, 2, shape, dtype=torch.int8, generator=generator)
        else:
            out[k] = torch.randn(shape, generator=generator) * 3.0 + 1.0
    return out


def random_experience(model, obs_space, action_space, n: int, t: int, done_prob: float = 0.05,
                      policy_version: int = 0, seed: int = 0, obs: dict | None = None) -> dict:
    """A training batch in the storage layout, acted by `model` itself (behaviour = current policy),
    with episode ends inside the rollouts and stored RNN states consistent with the resets. obs: the observations
    [n, t+1, ...] to act on (random ones by default)."""
    g = torch.Generator().manual_seed(seed)
    obs = make_obs(obs_space, (n, t + 1), g) if obs is None else obs
    h = model.rnn_state_size
    rnn_states = torch.zeros((n, t + 1, h))
    actions, logits_all, log_probs, values = [], [], [], []
    dones = (torch.rand((n, t), generator=g) < done_prob).float()
    state = torch.zeros((n, h))
    with torch.no_grad():
        for step in range(t):
            rnn_states[:, step] = state
            out = model.forward_step({k: v[:, step] for k, v in obs.items()}, state)
            dist = model.action_distribution(out.action_logits)
            a = dist.sample()
            actions.append(a)
            logits_all.append(out.action_logits)
            log_probs.append(dist.log_prob(a))
            values.append(out.values)
            state = out.new_rnn_states * (1.0 - dones[:, step:step + 1])
        rnn_states[:, t] = state
    return {
        "obs": obs,
        "rnn_states": rnn_states,
        "actions": torch.stack(actions, 1),
        "action_logits": torch.stack(logits_all, 1),
        "log_probs": torch.stack(log_probs, 1),
        "values": torch.stack(values, 1),
        "policy_versions": torch.full((n, t), policy_version, dtype=torch.int64),
        "rewards": torch.randn((n, t), generator=g),
        "dones": dones,
        "truncated": torch.zeros((n, t)),  # no time limits: every episode end is a termination
        "final_obs": make_obs(obs_space, (n,), g),
        "final_rnn": torch.zeros((n, h)),
        "final_t": torch.full((n,), -1, dtype=torch.int64),
    }
