"""Action spaces -> storage shapes/dtypes/logit sizes, and the action distributions built from logits.

| space               | A (action_shape) | dtype   | L (num_action_logits) | distribution                        |
|---------------------|------------------|---------|-----------------------|-------------------------------------|
| Discrete(n)         | 1                | int64   | n                     | categorical                         |
| MultiDiscrete(n1..k)| k                | int64   | n1 + ... + nk         | k independent categoricals (summed) |
| Box(shape)          | prod(shape)      | float32 | 2 * prod(shape)       | diagonal Gaussian (means, log-stds) |

Distributions accept logits with any leading dims `[..., L]`: `sample(noise=None)`/`mode()` give `[..., A]`,
`log_prob(actions [..., A])`/`entropy()` give `[...]` (summed over heads / dimensions). They are plain
tensor code (no torch.distributions argument validation): the policy worker calls them on every step.

Action masks: an observation key "action_mask" `[L]` (nonzero = valid; the heads' masks concatenated in sub-space
order for MultiDiscrete) makes the model put MASKED_LOGIT in place of the masked logits (`mask_logits`), so every
consumer of the logits (sampling, mode, log-probs, entropy, KL, the stored behaviour logits, V-trace) sees a
distribution that gives masked actions probability exactly 0.
"""
from __future__ import annotations

import itertools

import math
from typing import Sequence

import numpy as np
import torch
from gymnasium import spaces

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _check(space) -> None:
    if not isinstance(space, (spaces.Discrete, spaces.MultiDiscrete, spaces.Box)):
        raise TypeError(f"unsupported action space {space!r} (Discrete, MultiDiscrete or Box)")


def action_heads(space) -> list[int]:
    """Sizes of the independent categorical heads (Discrete: [n]; MultiDiscrete: nvec); [] for Box."""
    _check(space)
    if isinstance(space, spaces.Discrete):
        return [int(space.n)]
    if isinstance(space, spaces.MultiDiscrete):
        return [int(n) for n in np.asarray(space.nvec).reshape(-1)]
    return []


def action_shape(space) -> tuple[int]:
    """`(A,)`: per-step shape of the stored action."""
    _check(space)
    if isinstance(space, spaces.Box):
        return (int(np.prod(space.shape)),)
    return (len(action_heads(space)),)


def action_dtype(space) -> torch.dtype:
    """torch.int64 for Discrete/MultiDiscrete, torch.float32 for Box."""
    _check(space)
    return torch.float32 if isinstance(space, spaces.Box) else torch.int64


def num_action_logits(space) -> int:
    """`L`: size of the policy head output."""
    _check(space)
    if isinstance(space, spaces.Box):
        return 2 * int(np.prod(space.shape))
    return sum(action_heads(space))


# Finite, not -inf: exp() of it (after log_softmax) is exactly 0 in float32, and 0 * MASKED_LOGIT is 0 where
# 0 * -inf would make the entropy and the KL NaN; a head whose every action is masked is uniform, not NaN.
MASKED_LOGIT = -1e9
ACTION_MASK_KEY = "action_mask"


def check_action_mask(obs_space, action_space) -> bool:
    """Whether `obs_space` (a Dict) has an "action_mask" key; ValueError if that key cannot mask `action_space`
    (a Discrete or MultiDiscrete space, mask shape [L])."""
    space = getattr(obs_space, "spaces", {}).get(ACTION_MASK_KEY)
    if space is None:
        return False
    _check(action_space)
    if isinstance(action_space, spaces.Box):
        raise ValueError(f"observation key {ACTION_MASK_KEY!r} masks Discrete or MultiDiscrete actions, "
                         f"not {action_space}")
    if tuple(space.shape) != (num_action_logits(action_space),):
        raise ValueError(f"observation key {ACTION_MASK_KEY!r} has shape {tuple(space.shape)}; {action_space} needs "
                         f"({num_action_logits(action_space)},): one 0/1 entry per action of every head")
    return True


def mask_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logits [..., L], mask [..., L] (any dtype, nonzero = valid) -> logits [..., L] with MASKED_LOGIT at the masked
    entries, in the memory layout of `logits` (clone keeps the strides of time-major sequence outputs). The filled
    entries are constants: the gradient w.r.t. a masked logit is exactly 0."""
    return logits.clone().masked_fill_(mask == 0, MASKED_LOGIT)


class CategoricalHeads:
    """Independent categorical distributions over consecutive slices of the logits (1 head: Discrete)."""

    def __init__(self, logits: torch.Tensor, head_sizes: Sequence[int]):
        self.logits = logits
        self.head_sizes = list(head_sizes)
        if len(self.head_sizes) == 1:
            self._log_p = [torch.log_softmax(logits, dim=-1)]
        else:
            self._log_p = [torch.log_softmax(lg, dim=-1) for lg in torch.split(logits, self.head_sizes, dim=-1)]

    @property
    def log_probs_per_head(self) -> list[torch.Tensor]:
        return self._log_p

    def sample(self, noise: torch.Tensor | None = None) -> torch.Tensor:
        """noise: optional [..., A] uniforms in [0, 1), one per head: the action is then a function of the logits and
        the noise alone (inverse CDF), whatever batch it is computed in (hts/ppo modes). Either way an action of
        probability 0 (masked) is never chosen."""
        out = []
        for i, lp in enumerate(self._log_p):
            if noise is None:  # Gumbel-max: argmax(log p - log(-log U)) samples softmax(log p); one vectorized op
                u = torch.rand_like(lp).clamp_(min=1e-20, max=1.0 - 1e-7)
                out.append(torch.argmax(lp - torch.log(-torch.log(u)), dim=-1))
            else:  # the first action whose cumulative probability exceeds u
                p = lp.exp()
                if p.device.type == "cpu":
                    cdf = torch.cumsum(p, dim=-1)
                else:  # running sums, elementwise: deterministic mode (hts/ppo) refuses torch.cumsum on CUDA floats
                    cdf = torch.stack(list(itertools.accumulate(p.unbind(-1))), dim=-1)
                u = noise[..., i:i + 1].to(cdf.dtype) * cdf[..., -1:]
                # the first index whose cdf exceeds u has p > 0; where none does (u rounded up to the total), the last
                # action of positive probability (the last action itself may be masked)
                last = torch.where(p > 0, torch.arange(p.shape[-1], device=p.device), 0).amax(-1)
                out.append(torch.minimum((cdf <= u).sum(-1), last))
        return torch.stack(out, dim=-1)

    def mode(self) -> torch.Tensor:
        return torch.stack([torch.argmax(lp, dim=-1) for lp in self._log_p], dim=-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        actions = actions.long()
        if len(self._log_p) == 1:
            return self._log_p[0].gather(-1, actions[..., :1]).squeeze(-1)
        total = None
        for i, lp in enumerate(self._log_p):
            term = lp.gather(-1, actions[..., i:i + 1]).squeeze(-1)
            total = term if total is None else total + term
        return total

    def entropy(self) -> torch.Tensor:
        total = None
        for lp in self._log_p:
            term = -(lp.exp() * lp).sum(-1)
            total = term if total is None else total + term
        return total

    def kl_divergence(self, other: "CategoricalHeads") -> torch.Tensor:
        """KL(self || other), summed over heads."""
        total = None
        for lp, lq in zip(self._log_p, other._log_p):
            term = (lp.exp() * (lp - lq)).sum(-1)
            total = term if total is None else total + term
        return total


class DiagGaussian:
    """Diagonal Gaussian; logits = [means (d), log-stds (d)], log-stds clamped to [-20, 2]."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits
        self.mean, log_std = torch.chunk(logits, 2, dim=-1)
        self.log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        self.std = self.log_std.exp()

    def sample(self, noise: torch.Tensor | None = None) -> torch.Tensor:
        """noise: optional [..., A] standard-normal draws (hts/ppo modes); drawn here when absent."""
        return self.mean + self.std * (torch.randn_like(self.mean) if noise is None else noise.to(self.mean.dtype))

    def mode(self) -> torch.Tensor:
        return self.mean

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) / self.std
        return (-0.5 * z * z - self.log_std - _HALF_LOG_2PI).sum(-1)

    def entropy(self) -> torch.Tensor:
        return (self.log_std + (0.5 + _HALF_LOG_2PI)).sum(-1)

    def kl_divergence(self, other: "DiagGaussian") -> torch.Tensor:
        """KL(self || other), summed over dimensions."""
        var_ratio = (self.std / other.std) ** 2
        t1 = ((self.mean - other.mean) / other.std) ** 2
        return 0.5 * (var_ratio + t1 - 1.0 - torch.log(var_ratio)).sum(-1)


def draw_action_noise(space, rng: np.random.Generator, out: np.ndarray) -> None:
    """Fill `out` [A] with the noise `sample(noise)` turns into one action: uniforms in [0, 1) for categorical heads,
    standard normals for Box dimensions."""
    if isinstance(space, spaces.Box):
        rng.standard_normal(out=out, dtype=np.float32)
    else:
        rng.random(out=out, dtype=np.float32)


def action_distribution(space, logits: torch.Tensor):
    """The distribution of `space` parameterized by `logits [..., L]`."""
    _check(space)
    if isinstance(space, spaces.Box):
        return DiagGaussian(logits)
    return CategoricalHeads(logits, action_heads(space))


def uniform_valid_actions(u: np.ndarray, head_sizes: Sequence[int], mask: np.ndarray | None = None):
    """The uniform policy over each head's valid actions, in numpy (--random_policy: no network, no torch).

    u: [B, K] uniforms in [0, 1), one per head; mask: [B, L] (nonzero = valid) or None (all valid). Returns actions
    [B, K] int64 (head k's action is the floor(u * n_valid)-th valid one: inverse CDF, as `CategoricalHeads.sample`),
    log_probs [B] float32 (-sum of log n_valid) and logits [B, L] float32 (0, MASKED_LOGIT where masked: the stored
    behaviour logits give the same distribution). A head with every action masked is uniform over all of them, as a
    masked model's (`mask_logits`)."""
    b = u.shape[0]
    if mask is None:
        mask = np.ones((b, sum(head_sizes)), dtype=bool)
    actions = np.empty((b, len(head_sizes)), dtype=np.int64)
    log_probs = np.zeros(b, dtype=np.float64)
    logits = np.zeros(mask.shape, dtype=np.float32)
    start = 0
    for k, n in enumerate(head_sizes):
        valid = mask[:, start:start + n] != 0  # [B, n]
        valid[~valid.any(axis=1)] = True  # every action masked: uniform over all
        count = valid.sum(axis=1)  # [B] >= 1
        rank = np.minimum((u[:, k].astype(np.float64) * count).astype(np.int64), count - 1)  # [B]
        actions[:, k] = np.argmax(np.cumsum(valid, axis=1) > rank[:, None], axis=1)  # the rank-th valid action
        log_probs -= np.log(count)
        logits[:, start:start + n][~valid] = MASKED_LOGIT
        start += n
    return actions, log_probs.astype(np.float32), logits
