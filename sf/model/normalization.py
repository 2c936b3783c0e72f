"""Running mean/std normalizers stored as registered buffers (they travel in the state_dict: checkpoints
and the shared weights that policy workers load).

Only the learner updates them (`update`), from whole training batches, before its forward pass; every
other process only applies them (`normalize` / `denormalize`).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn


class RunningMeanStd(nn.Module):
    """Per-feature running mean and variance over the last dims `shape` (parallel-Welford merge).

    Buffers: `mean`, `var` (float32, `shape`) and `count` (float64 scalar). `normalize(x)` returns
    `clamp((x - mean) / sqrt(var + eps), -clip, clip)`.
    """

    def __init__(self, shape, eps: float = 1e-5, clip: Optional[float] = 5.0):
        super().__init__()
        shape = tuple(shape) if not isinstance(shape, int) else (shape,)
        self.shape, self.eps, self.clip = shape, eps, clip
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float32))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float32))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor, valid: Optional[torch.Tensor] = None) -> None:
        """Merge the statistics of `x [..., *shape]` (only entries where `valid [...]` is true)."""
        nd = len(self.shape)
        x = x.reshape(-1, *self.shape) if nd else x.reshape(-1)
        if valid is not None:
            x = x[valid.reshape(-1).bool()]
        n = x.shape[0]
        if n == 0:
            return
        x = x.double()
        b_mean = x.mean(0)
        b_var = x.var(0, unbiased=False)
        count = self.count.double()
        tot = count + n
        delta = b_mean - self.mean.double()
        new_mean = self.mean.double() + delta * (n / tot)
        m2 = self.var.double() * count + b_var * n + delta * delta * (count * n / tot)
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / tot)
        self.count.copy_(tot)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        y = (x - self.mean) * torch.rsqrt(self.var + self.eps)
        if self.clip is not None:
            y = y.clamp(-self.clip, self.clip)
        return y

    def denormalize(self, y: torch.Tensor) -> torch.Tensor:
        return y * torch.sqrt(self.var + self.eps) + self.mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalize(x)

    def extra_repr(self) -> str:
        return f"shape={self.shape}, eps={self.eps}, clip={self.clip}"
