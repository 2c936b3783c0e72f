"""V-trace off-policy value targets and policy-gradient advantages (Espeholt et al. 2018, "IMPALA", 4.1).

Written after deepmind/scalable_agent vtrace.py, time-major `[T, B]` like it, with per-step discounts
that are zero at episode ends (so the traces stop there).
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class VTraceReturns(NamedTuple):
    """vtrace()'s results, float32 [T, B] each, without gradient."""
    vs: torch.Tensor  # the value targets v_s
    advantages: torch.Tensor  # the policy-gradient advantages rho_s (r_s + gamma_s v_{s+1} - V(x_s))


@torch.no_grad()
def vtrace(behavior_log_probs: torch.Tensor, target_log_probs: torch.Tensor, rewards: torch.Tensor,
           values: torch.Tensor, bootstrap_value: torch.Tensor, discounts: torch.Tensor,
           rho_bar: float = 1.0, c_bar: float = 1.0, truncation_bootstrap: torch.Tensor | None = None) -> VTraceReturns:
    r"""V-trace targets `vs` and policy-gradient advantages, computed without gradient.

    Notation: T is the rollout length (time dimension, first), B the batch size (trajectories, second).
    For a behaviour policy mu that took action a_t in state x_t and a target policy pi,
    rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t)), c_i = min(c_bar, pi(a_i|x_i) / mu(a_i|x_i)),
    gamma_t = discounts[t] (gamma * (1 - done_t): zero when the episode ended after step t), and
    V(x_T) = bootstrap_value. The n-step V-trace target of IMPALA (eq. 1) is

        v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V,
        delta_t V = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),

    computed here by the equivalent recursion v_s - V(x_s) = delta_s V + gamma_s c_s (v_{s+1} - V(x_{s+1}))
    in one reverse-time loop over [B] vectors; v_T = V(x_T). The policy-gradient advantage is

        pg_advantages_s = rho_s (r_s + gamma_s v_{s+1} - V(x_s)).

    With rho_bar = c_bar = 1 and on-policy data (pi = mu) v_s is the n-step bootstrapped return.

    Truncation is not termination: an episode cut by a time limit after step t (done_t = 1, so gamma_t = 0 and the
    traces stop there) continues in a state x'_{t+1} nobody will see, whose target is its value. With
    truncation_bootstrap[t] = gamma * V(x'_{t+1}) at such steps (0 elsewhere), r_t + truncation_bootstrap[t] takes
    the place of r_t above: delta_t V = rho_t (r_t + gamma V(x'_{t+1}) - V(x_t)), and the same in the advantage.

    Args:
      behavior_log_probs: float32 [T, B], log mu(a_t | x_t) of the actions taken (from the policy worker).
      target_log_probs: float32 [T, B], log pi(a_t | x_t) under the current (learner) policy.
      rewards: float32 [T, B], reward r_t received after step t.
      values: float32 [T, B], V(x_t) from the learner's value function.
      bootstrap_value: float32 [B], V(x_T): value of the state after the last step.
      discounts: float32 [T, B], gamma_t = gamma * (1 - done_t).
      rho_bar: float, clipping threshold rho-bar of the importance weights in delta_t V and the
        policy-gradient advantage.
      c_bar: float, clipping threshold c-bar of the trace-cutting coefficients c_i.
      truncation_bootstrap: optional float32 [T, B], gamma * V(final observation) where the episode was truncated
        after step t, 0 elsewhere (see truncation_bootstrap()).

    Returns:
      VTraceReturns(vs, advantages): float32 [T, B] each, without gradient.
    """
    ratios = torch.exp(target_log_probs.float() - behavior_log_probs.float())
    rhos = torch.clamp(ratios, max=rho_bar)
    cs = torch.clamp(ratios, max=c_bar)
    values = values.float()
    rewards = rewards.float() if truncation_bootstrap is None else rewards.float() + truncation_bootstrap.float()
    discounts = discounts.float()
    bootstrap_value = bootstrap_value.float()

    values_next = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)  # V(x_{t+1})
    deltas = rhos * (rewards + discounts * values_next - values)
    vs_minus_v = reverse_discounted_sum(deltas, discounts * cs, out=torch.empty_like(values))
    vs = vs_minus_v + values

    vs_next = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    return VTraceReturns(vs=vs, advantages=rhos * (rewards + discounts * vs_next - values))


def reverse_discounted_sum(deltas: torch.Tensor, decays: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[t] = deltas[t] + decays[t] * out[t+1] for t = T-1 .. 0, with out[T] = 0: the backward recursion of V-trace
    (decays gamma_t c_t) and GAE (decays gamma_t lambda), one [B] vector per step. deltas, decays, out: float32
    [T, B]; `out` is written in place and returned (its memory layout is the caller's choice)."""
    acc = torch.zeros_like(out[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        acc = deltas[t] + decays[t] * acc
        out[t] = acc
    return out


@torch.no_grad()
def truncation_bootstrap(truncated: torch.Tensor, final_values: torch.Tensor, gamma: float) -> torch.Tensor:
    """gamma * V(final observation) where an episode was cut by a time limit, 0 elsewhere.

    truncated: float32 [T, B], 1 where the episode was truncated after step t; final_values: float32 [T, B], the value
    of the observation the truncated step led to (any value elsewhere, NaN included: it is not used).
    Returns float32 [T, B], the extra reward of vtrace()'s and gae()'s `truncation_bootstrap`.
    """
    return torch.where(truncated > 0, gamma * final_values.float(), torch.zeros_like(final_values, dtype=torch.float32))
