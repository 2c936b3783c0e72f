"""APPO loss terms: pure functions of tensors (no cfg), every one with a `valid` mask.

All inputs are per-sample tensors of one shape (the learner uses time-major `[T, B]`); `valid` is a bool
tensor of that shape (None: all valid). Masked samples contribute exactly nothing: their inputs are
replaced by neutral values *before* any arithmetic (garbage, inf or NaN there cannot leak into the
forward value or the gradient), means are over valid samples only, and advantage normalization uses
statistics of valid samples only. With no valid sample every term is 0.
"""
from __future__ import annotations

from typing import Optional

import torch


def _valid(x: torch.Tensor, valid: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.ones_like(x, dtype=torch.bool) if valid is None else valid.bool()


def masked_mean(x: torch.Tensor, valid: Optional[torch.Tensor]) -> torch.Tensor:
    """Mean of `x` over valid entries (0 when there are none); masked entries may hold NaN/inf."""
    if valid is None:
        return x.mean()
    valid = valid.bool()
    return torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum() / valid.sum().clamp(min=1)


def normalize_advantages(advantages: torch.Tensor, valid: Optional[torch.Tensor], eps: float = 1e-8) -> torch.Tensor:
    """(A - mean) / (std + eps) with mean and (population) std over valid samples; masked entries -> 0."""
    valid = _valid(advantages, valid)
    zero = torch.zeros((), dtype=advantages.dtype, device=advantages.device)
    a = torch.where(valid, advantages, zero)
    n = valid.sum().clamp(min=1)
    mean = a.sum() / n
    var = torch.where(valid, (a - mean) ** 2, zero).sum() / n
    return torch.where(valid, (a - mean) / (var.sqrt() + eps), zero)


def policy_loss(log_probs: torch.Tensor, behavior_log_probs: torch.Tensor, advantages: torch.Tensor,
                clip_ratio: float, valid: Optional[torch.Tensor] = None):
    """PPO clipped surrogate with the ratio clipped to [1/(1+eps), 1+eps] (Sample Factory, eps = clip_ratio):

        loss = -mean_valid(min(r A, clip(r, 1/(1+eps), 1+eps) A)),   r = exp(log_probs - behavior_log_probs).

    Returns (loss, ratio); `ratio` is detached, 1 at masked samples."""
    valid = _valid(log_probs, valid)
    zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    log_ratio = torch.where(valid, log_probs - torch.where(valid, behavior_log_probs, zero), zero)
    ratio = torch.exp(log_ratio)
    adv = torch.where(valid, advantages, zero)
    surr = ratio * adv
    surr_clipped = torch.clamp(ratio, 1.0 / (1.0 + clip_ratio), 1.0 + clip_ratio) * adv
    return -masked_mean(torch.min(surr, surr_clipped), valid), ratio.detach()


def value_loss(values: torch.Tensor, behavior_values: torch.Tensor, targets: torch.Tensor, clip_value: float,
               valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Clipped value loss: 0.5 * mean_valid(max((v - R)^2, (v_clip - R)^2)),
    v_clip = behavior_value + clamp(v - behavior_value, -clip_value, clip_value)."""
    valid = _valid(values, valid)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    v = torch.where(valid, values, zero)
    old = torch.where(valid, behavior_values, zero)
    ret = torch.where(valid, targets, zero)
    v_clipped = old + torch.clamp(v - old, -clip_value, clip_value)
    err = torch.max((v - ret) ** 2, (v_clipped - ret) ** 2)
    return 0.5 * masked_mean(err, valid)


def entropy_loss(entropy: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """-mean_valid(entropy): multiply by exploration_loss_coeff and add to the loss (entropy bonus)."""
    valid = _valid(entropy, valid)
    return -masked_mean(torch.where(valid, entropy, torch.zeros((), dtype=entropy.dtype, device=entropy.device)), valid)


def appo_loss(log_probs: torch.Tensor, behavior_log_probs: torch.Tensor, advantages: torch.Tensor,
              values: torch.Tensor, behavior_values: torch.Tensor, value_targets: torch.Tensor,
              entropy: torch.Tensor, valid: Optional[torch.Tensor], *, clip_ratio: float, clip_value: float,
              value_loss_coeff: float, exploration_loss_coeff: float, normalize_advantage: bool = True) -> dict:
    """The whole APPO objective:

        loss = policy_loss(normalized A) + value_loss_coeff * value_loss + exploration_loss_coeff * entropy_loss

    Returns a dict of tensors: loss, policy_loss, value_loss, entropy (mean over valid samples, detached),
    ratio (detached, 1 where masked)."""
    if normalize_advantage:
        advantages = normalize_advantages(advantages, valid)
    pl, ratio = policy_loss(log_probs, behavior_log_probs, advantages, clip_ratio, valid)
    vl = value_loss(values, behavior_values, value_targets, clip_value, valid)
    el = entropy_loss(entropy, valid)
    total = pl + value_loss_coeff * vl + exploration_loss_coeff * el
    return {"loss": total, "policy_loss": pl, "value_loss": vl, "entropy": -el.detach(), "ratio": ratio}
