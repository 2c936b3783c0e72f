"""Optimizers of --optimizer: Adam (torch's) and LAMB, written after Sample Factory 2.1.1's
sample_factory/algo/utils/optimizers.py (`Lamb`, from bps-nav; section 3.4 of arXiv:2103.07013) with its defaults."""
from __future__ import annotations

import torch

OPTIMIZERS = ("adam", "lamb")


class Lamb(torch.optim.Optimizer):
    r"""LAMB (You et al. 2020, "Large batch optimization for deep learning"), as Sample Factory has it. For each
    parameter tensor p with gradient g, at its step t = 1, 2, ...:

        m = beta1 m + (1 - beta1) g,    v = beta2 v + (1 - beta2) g^2
        u = (m / (1 - beta1^t)) / (sqrt(v) / sqrt(1 - beta2^t) + eps) + weight_decay p     (bias correction on)
        trust = 1 if ||p|| = 0 or ||u|| = 0, else clamp(min(||p||, 10) / ||u||, min_trust, 1 / min_trust)
        p = p - lr trust u

    (norms over the whole tensor, before the update). Sample Factory builds it with its defaults (weight decay 1e-4,
    min_trust 0.01) and --learning_rate, --adam_beta1/2, --adam_eps; its look-ahead option is never used there and
    is not implemented here. The trust ratio stays a tensor (no device synchronization per parameter)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 1e-4, min_trust: float = 0.01, bias_correction: bool = True):
        if not lr >= 0.0:
            raise ValueError(f"invalid learning rate {lr}")
        if not eps >= 0.0:
            raise ValueError(f"invalid epsilon {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid betas {betas}")
        if not 0.0 < min_trust <= 1.0:
            raise ValueError(f"min_trust must be in (0, 1], got {min_trust}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, min_trust=min_trust,
                                      bias_correction=bias_correction))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            min_trust, weight_decay = group["min_trust"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 1  # (a plain int, as Sample Factory's: checkpoints load it weights_only)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                t = int(state["step"])
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(p.grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1.0 - beta2)
                m, v = exp_avg.clone(), exp_avg_sq.sqrt()
                if group["bias_correction"]:
                    m.mul_(1.0 / (1.0 - beta1 ** t))
                    v.mul_(1.0 / (1.0 - beta2 ** t) ** 0.5)
                update = m.div_(v.add_(group["eps"]))
                if weight_decay > 0:
                    update.add_(p, alpha=weight_decay)
                if min_trust != 1.0:
                    weight_norm, update_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(update)
                    trust = (weight_norm.clamp(max=10.0) / update_norm).clamp(min_trust, 1.0 / min_trust)
                    trust = torch.where((weight_norm == 0) | (update_norm == 0), torch.ones_like(trust), trust)
                    update.mul_(trust)
                p.add_(update, alpha=-group["lr"])
                state["step"] = t + 1
        return loss


def make_optimizer(kind: str, params, lr: float, betas: tuple[float, float], eps: float) -> torch.optim.Optimizer:
    """--optimizer `kind` over `params` (Sample Factory's: the others' settings at their defaults)."""
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps)
    if kind == "lamb":
        return Lamb(params, lr=lr, betas=betas, eps=eps)
    raise ValueError(f"unknown optimizer {kind!r}; known: {OPTIMIZERS}")
