"""APPO loss terms: pure functions of tensors (no cfg), every one with a `valid` mask.

All inputs are per-sample tensors of one shape (the learner uses time-major `[T, B]`); `valid` is a bool
tensor of that shape (None: all valid). Masked samples contribute exactly nothing: their inputs are
replaced by neutral values *before* any arithmetic (garbage, inf or NaN there cannot leak into the
forward value or the gradient), means are over valid samples only, and advantage normalization uses
statistics of valid samples only. With no valid sample every term is 0.
"""
from __future__ import annotations

import math
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
    """Clipped value loss: mean_valid(max((v - R)^2, (v_clip - R)^2)),
    v_clip = behavior_value + clamp(v - behavior_value, -clip_value, clip_value).

    No 1/2 in front: Sample Factory's (its Learner._value_loss; the paper's), so that its --value_loss_coeff weighs the
    critic as it does there. (CleanRL's 0.5 * MSE with its vf_coef 0.5 is --value_loss_coeff 0.25 here.) Until
    2026-12-07 this had the 1/2: at Sample Factory's settings the critic's gradient was half its own, and each SGD
    step moved the shared network's policy further (docs/benchmarks.md, One SGD step against Sample Factory's)."""
    valid = _valid(values, valid)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    v = torch.where(valid, values, zero)
    old = torch.where(valid, behavior_values, zero)
    ret = torch.where(valid, targets, zero)
    v_clipped = old + torch.clamp(v - old, -clip_value, clip_value)
    err = torch.max((v - ret) ** 2, (v_clipped - ret) ** 2)
    return masked_mean(err, valid)


def entropy_loss(entropy: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """-mean_valid(entropy): multiply by exploration_loss_coeff and add to the loss (entropy bonus)."""
    valid = _valid(entropy, valid)
    return -masked_mean(torch.where(valid, entropy, torch.zeros((), dtype=entropy.dtype, device=entropy.device)), valid)


SYMMETRIC_KL_MAX = 30.0  # Sample Factory's bound on the mean symmetric KL of the exploration loss


def symmetric_kl_with_uniform(log_probs_per_head: list[torch.Tensor],
                              allowed_per_head: Optional[list[torch.Tensor]] = None) -> torch.Tensor:
    """Symmetric KL divergence of categorical heads from the uniform distribution, summed over the heads (Sample
    Factory's symmetric_kl_with_uniform_prior). A head of K actions with probabilities p and u = 1/K:

        0.5 * (KL(p || u) + KL(u || p)) = 0.5 * (sum_a p_a (log p_a - log u) + sum_a u (log u - log p_a))

    log_probs_per_head: one [..., K_h] tensor of log-probabilities per head. allowed_per_head (action masks): one
    [..., K_h] bool tensor per head, or None; the uniform distribution is then over the allowed actions only (K their
    number, sums over them; masked actions have p = 0), and a head with none allowed counts all of them (the model
    makes it uniform). Returns [...]."""
    total = None
    for i, lp in enumerate(log_probs_per_head):
        allowed = None if allowed_per_head is None else allowed_per_head[i]
        if allowed is None:
            k = lp.shape[-1]
            log_u = -math.log(k)
            term = 0.5 * ((lp.exp() * (lp - log_u)).sum(-1) + ((log_u - lp) / k).sum(-1))
        else:
            allowed = allowed | ~allowed.any(-1, keepdim=True)
            k = allowed.sum(-1, keepdim=True).to(lp.dtype)
            log_u = -torch.log(k)
            zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
            term = 0.5 * (torch.where(allowed, lp.exp() * (lp - log_u), zero).sum(-1)
                          + torch.where(allowed, (log_u - lp) / k, zero).sum(-1))
        total = term if total is None else total + term
    return total


def symmetric_kl_loss(sym_kl: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The symmetric-KL exploration loss before its coefficient, as Sample Factory computes it: the mean over valid
    samples of `sym_kl` (symmetric_kl_with_uniform), 0 if it is not finite, at most SYMMETRIC_KL_MAX (beyond that
    it has no gradient: a policy that deterministic is far past what the penalty can steer)."""
    mean = masked_mean(sym_kl, valid)
    if not bool(torch.isfinite(mean)):
        return torch.zeros((), dtype=sym_kl.dtype, device=sym_kl.device)
    return torch.clamp(mean, max=SYMMETRIC_KL_MAX)


def kl_loss(kl: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The KL penalty before its coefficient: mean over valid samples of kl = KL(pi || mu), the current policy's
    divergence from the behaviour policy (Sample Factory's _kl_loss; the PPO paper's fixed-coefficient KL penalty)."""
    valid = _valid(kl, valid)
    return masked_mean(torch.where(valid, kl, torch.zeros((), dtype=kl.dtype, device=kl.device)), valid)


def appo_loss(log_probs: torch.Tensor, behavior_log_probs: torch.Tensor, advantages: torch.Tensor,
              values: torch.Tensor, behavior_values: torch.Tensor, value_targets: torch.Tensor,
              entropy: torch.Tensor, valid: Optional[torch.Tensor], *, clip_ratio: float, clip_value: float,
              value_loss_coeff: float, exploration_loss_coeff: float, normalize_advantage: bool = True,
              symmetric_kl: Optional[torch.Tensor] = None, kl: Optional[torch.Tensor] = None,
              kl_loss_coeff: float = 0.0) -> dict:
    """The whole APPO objective:

        loss = policy_loss(normalized A) + value_loss_coeff * value_loss + exploration_loss + kl_loss
        exploration_loss = exploration_loss_coeff * entropy_loss                (--exploration_loss entropy)
                         = exploration_loss_coeff * symmetric_kl_loss(symmetric_kl)        (symmetric_kl given)
        kl_loss = kl_loss_coeff * kl_loss(kl)

    A term whose coefficient is 0 is left out (not multiplied by 0: a non-finite term cannot spoil the loss).
    symmetric_kl, kl: per-sample tensors like the others (symmetric_kl_with_uniform; KL(pi || mu)), or None.
    Returns a dict of tensors: loss, policy_loss, value_loss, exploration_loss, kl_loss (the last two with their
    coefficients, detached), entropy (mean over valid samples, detached), ratio (detached, 1 where masked)."""
    if normalize_advantage:
        advantages = normalize_advantages(advantages, valid)
    pl, ratio = policy_loss(log_probs, behavior_log_probs, advantages, clip_ratio, valid)
    vl = value_loss(values, behavior_values, value_targets, clip_value, valid)
    el = entropy_loss(entropy, valid)
    zero = torch.zeros((), dtype=pl.dtype, device=pl.device)
    exploration = zero
    if exploration_loss_coeff != 0.0:
        term = el if symmetric_kl is None else symmetric_kl_loss(symmetric_kl, valid)
        exploration = exploration_loss_coeff * term
    kl_term = kl_loss_coeff * kl_loss(kl, valid) if kl is not None and kl_loss_coeff != 0.0 else zero
    total = pl + value_loss_coeff * vl + exploration + kl_term
    return {"loss": total, "policy_loss": pl, "value_loss": vl, "exploration_loss": exploration.detach(),
            "kl_loss": kl_term.detach(), "entropy": -el.detach(), "ratio": ratio}
