"""Generalized advantage estimation (Schulman et al. 2016), time-major [T, B] like sf.learning.vtrace."""
from __future__ import annotations

from typing import NamedTuple

import torch

from sf.learning.vtrace import reverse_discounted_sum


class GAEReturns(NamedTuple):
    """gae()'s results, float32 [T, B] each, without gradient."""
    advantages: torch.Tensor  # A_t
    returns: torch.Tensor  # lambda-returns A_t + V(x_t): the value targets


@torch.no_grad()
def gae(rewards: torch.Tensor, values: torch.Tensor, bootstrap_value: torch.Tensor, discounts: torch.Tensor,
        lam: float, truncation_bootstrap: torch.Tensor | None = None) -> GAEReturns:
    r"""GAE(gamma, lambda) advantages and lambda-returns, computed without gradient.

    Notation: T is the rollout length (first dim), B the batch size (second dim);
    gamma_t = discounts[t] (gamma * (1 - done_t)), V(x_T) = bootstrap_value;

        delta_t = r_t + gamma_t V(x_{t+1}) - V(x_t),
        A_t = sum_{s=t}^{T-1} (prod_{i=t}^{s-1} gamma_i lambda) delta_s = delta_t + gamma_t lambda A_{t+1},
        returns_t = A_t + V(x_t)   (the value targets).

    An episode truncated after step t (done_t = 1, gamma_t = 0) is bootstrapped from its final observation x':
    delta_t = r_t + gamma V(x') - V(x_t), with truncation_bootstrap[t] = gamma V(x') (sf.learning.vtrace.
    truncation_bootstrap).

    Args:
      rewards: float32 [T, B], reward after step t.
      values: float32 [T, B], V(x_t).
      bootstrap_value: float32 [B], V(x_T), the value of the state after the last step.
      discounts: float32 [T, B], gamma * (1 - done_t).
      lam: float, lambda.
      truncation_bootstrap: optional float32 [T, B], gamma * V(final observation) at truncated steps, 0 elsewhere.

    Returns:
      GAEReturns(advantages, returns): float32 [T, B] each.
    """
    values = values.float()
    values_next = torch.cat([values[1:], bootstrap_value.float().unsqueeze(0)], dim=0)
    discounts = discounts.float()
    if truncation_bootstrap is not None:
        rewards = rewards.float() + truncation_bootstrap.float()
    deltas = rewards.float() + discounts * values_next - values
    advantages = reverse_discounted_sum(deltas, discounts * lam, out=torch.empty_like(values))
    return GAEReturns(advantages=advantages, returns=advantages + values)
