"""Running mean/std normalizers stored as registered buffers (they travel in the state_dict: checkpoints
and the shared weights that policy workers load).

Only the learner updates them (`update`), from whole training batches, before its forward pass; every
other process only applies them (`normalize` / `denormalize`). Data-parallel learners merge every rank's batch moments
at each update (`gather_moments`, set by sf.learning.collectives.share_normalizer_statistics).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn


class RunningMeanStd(nn.Module):
    """Per-feature running mean and variance over the last dims `shape` (parallel-Welford merge).

    Buffers: `mean`, `var` (float32, `shape`) and `count` (float64 scalar). `normalize(x)` returns
    `clamp((x - mean) / sqrt(var + eps), -clip, clip)`.

    `gather_moments` (None: this process's batch only): a collective taking this process's batch moments
    `[1 + 2 * numel]` float64 (count, mean, var) and returning every rank's `[world, 1 + 2 * numel]` in rank order;
    each update then merges them all, in that order, so every rank ends with the union batch's statistics, bit for bit
    alike. Every rank must then call `update` equally often (with an empty batch too).
    """

    def __init__(self, shape, eps: float = 1e-5, clip: Optional[float] = 5.0):
        super().__init__()
        shape = tuple(shape) if not isinstance(shape, int) else (shape,)
        self.shape, self.eps, self.clip = shape, eps, clip
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float32))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float32))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.gather_moments: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    @torch.no_grad()
    def update(self, x: torch.Tensor, valid: Optional[torch.Tensor] = None) -> None:
        """Merge the statistics of `x [..., *shape]` (only entries where `valid [...]` is true)."""
        nd = len(self.shape)
        x = x.reshape(-1, *self.shape) if nd else x.reshape(-1)
        if valid is not None:
            x = x[valid.reshape(-1).bool()]
        n = x.shape[0]
        if self.gather_moments is not None:
            return self._merge_ranks(n, x)
        if n == 0:
            return
        self._merge(n, *self._batch_moments(x))

    def _batch_moments(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The float64 mean and biased variance `[*shape]` of a non-empty batch `x [n, *shape]`."""
        x = x.double()
        return x.mean(0), x.var(0, unbiased=False)

    def _merge_ranks(self, n: int, x: torch.Tensor) -> None:
        """Merge every rank's moments of its batch `x [n, *shape]`, in rank order (see the class docstring)."""
        numel = self.mean.numel()
        mine = torch.zeros(1 + 2 * numel, dtype=torch.float64, device=self.mean.device)  # [count, mean, var]
        if n:
            mean, var = self._batch_moments(x)
            mine[0] = n
            mine[1:1 + numel] = mean.reshape(-1)
            mine[1 + numel:] = var.reshape(-1)
        rows = self.gather_moments(mine)  # [world, 1 + 2 * numel]
        for r, count in enumerate(rows[:, 0].tolist()):
            if count > 0:
                self._merge(int(count), rows[r, 1:1 + numel].view(self.shape), rows[r, 1 + numel:].view(self.shape))

    def _merge(self, n: int, b_mean: torch.Tensor, b_var: torch.Tensor) -> None:
        """Parallel-Welford merge of a batch of `n` samples with float64 mean and (biased) variance [*shape]."""
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


class PixelMeanStd(RunningMeanStd):
    """The running mean/std of preprocessed frames `p = (x - subtract) / scale`, fed the raw frames `x [..., C, H, W]`
    (uint8, or float): its buffers hold p's statistics, as a RunningMeanStd fed p would (checkpoints are alike).

    It exists for speed: the screen is the largest tensor a learner touches (a 1,024-frame Doom batch is 28M values),
    and per-pixel normalization took half of Sample Factory's health gathering preset's time.
    - `update` of uint8 frames sums x and x^2 in float32 over chunks of 256 frames: every partial sum is an integer
      below 2^24, so the sums are exact, and the float64 moments come from exact sums (the generic path converts
      the batch to float64 first: five times the time).
    - `normalize(x)` = clamp(x * a + b) with `a = 1 / (scale * sqrt(var + eps))`, `b = -(subtract / scale + mean) *
      sqrt(var + eps)^-1`: one multiply-add per element on one float32 copy, where preprocessing then normalizing
      makes five passes and four temporaries.
    """

    EXACT_ROWS = 256  # 256 * 255^2 < 2^24: float32 sums of 256 squared uint8 values are exact

    def __init__(self, shape, subtract: float, scale: float, eps: float = 1e-5, clip: Optional[float] = 5.0):
        super().__init__(shape, eps, clip)
        self.subtract, self.scale = float(subtract), float(scale)

    def _batch_moments(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dtype != torch.uint8:
            return super()._batch_moments((x.double() - self.subtract) / self.scale)
        y = x.reshape(x.shape[0], -1).to(torch.float32)  # [n, C*H*W], integers 0..255
        s1 = self._exact_sum(y)
        s2 = self._exact_sum(y.mul_(y))
        mean = s1 / x.shape[0]
        var = (s2 / x.shape[0] - mean * mean).clamp_(min=0.0)
        return ((mean - self.subtract) / self.scale).view(self.shape), (var / self.scale ** 2).view(self.shape)

    def _exact_sum(self, y: torch.Tensor) -> torch.Tensor:
        """sum over dim 0 of `y [n, F]` (float32 integers below 256^2), float64 `[F]`: exact (see EXACT_ROWS)."""
        total = torch.zeros(y.shape[1], dtype=torch.float64, device=y.device)
        for chunk in y.split(self.EXACT_ROWS):
            total += chunk.sum(0)
        return total

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        r = torch.rsqrt(self.var + self.eps)
        a = r * (1.0 / self.scale)
        b = (self.mean + self.subtract / self.scale) * -r
        y = x.to(torch.float32, copy=True).mul_(a).add_(b)
        return y.clamp_(-self.clip, self.clip) if self.clip is not None else y

    def denormalize(self, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("PixelMeanStd normalizes inputs only")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, subtract={self.subtract}, scale={self.scale}"
