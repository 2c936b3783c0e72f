"""Observation encoders: conv nets for images (Doom `convnet_simple`, Atari `convnet_atari`), an MLP for
float vectors, and the measurements MLP of the paper's *full* Doom architecture.

All encoders take `[B, *obs_shape]` in storage dtype and return `[B, out_size]` float32. uint8 images
are scaled to [0, 1] inside the first convolution (its weight is multiplied by 1/255, which is the
same function as dividing the input and saves one pass over the largest tensor of the learner).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sf.model.normalization import RunningMeanStd

# (out_channels, kernel, stride)
CONV_ARCHITECTURES = {
    # Sample Factory's Doom encoder for 128x72 frames: [3,72,128] -> [32,17,31] -> [64,7,14] -> [128,3,6]
    "convnet_simple": [(32, 8, 4), (64, 4, 2), (128, 3, 2)],
    # Nature DQN CNN (Mnih et al. 2015) for 84x84x4 Atari frames: -> [32,20,20] -> [64,9,9] -> [64,7,7]
    "convnet_atari": [(32, 8, 4), (64, 4, 2), (64, 3, 1)],
}

MEASUREMENTS_HIDDEN = 128
CPU_BLOCK = 128  # frames per conv call on CPU (cache blocking)


def nonlinearity(name: str) -> nn.Module:
    return {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh}[name]()


def pick_conv_architecture(name: str, obs_shape: Sequence[int]) -> str:
    """'auto': 84x84 frames (Atari) -> convnet_atari, anything else (Doom 72x128, ...) -> convnet_simple."""
    if name != "auto":
        if name not in CONV_ARCHITECTURES:
            raise ValueError(f"unknown conv architecture {name!r}; one of auto, {', '.join(CONV_ARCHITECTURES)}")
        return name
    return "convnet_atari" if tuple(obs_shape[-2:]) == (84, 84) else "convnet_simple"


class ConvEncoder(nn.Module):
    """3 conv layers + nonlinearity, flatten, FC `hidden_size` + nonlinearity. Input `[B, C, H, W]`."""

    def __init__(self, obs_shape: Sequence[int], architecture: str, hidden_size: int, nonlin: str,
                 scale_uint8: bool = True, channels_last: bool = True, cpu_block: int = CPU_BLOCK):
        super().__init__()
        self.cpu_block = cpu_block
        c, h, w = obs_shape
        self.architecture = pick_conv_architecture(architecture, obs_shape)
        self.scale = 1.0 / 255.0 if scale_uint8 else 1.0
        self.channels_last = channels_last
        convs = []
        for out_c, k, s in CONV_ARCHITECTURES[self.architecture]:
            convs.append(nn.Conv2d(c, out_c, k, stride=s))
            c, h, w = out_c, (h - k) // s + 1, (w - k) // s + 1
            if h < 1 or w < 1:
                raise ValueError(f"observation {tuple(obs_shape)} too small for {self.architecture}")
        self.convs = nn.ModuleList(convs)
        self.act = nonlinearity(nonlin)
        self.conv_out_shape = (c, h, w)
        self.fc = nn.Linear(c * h * w, hidden_size)
        self.out_size = hidden_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, C, H, W] (uint8 or float) -> [B, hidden_size]. On CPU a large batch is run in blocks of
        `cpu_block` frames: the activations of a block stay in cache in the forward and in the backward
        pass (the whole learner step is faster than with one convolution over all the frames, see
        benchmarks/learner_step.py --cpu_block 0)."""
        first = self.convs[0]
        weight = first.weight * self.scale if self.scale != 1.0 else first.weight
        if x.device.type == "cpu" and self.cpu_block and x.shape[0] > self.cpu_block:
            return torch.cat([self._forward(block, weight) for block in x.split(self.cpu_block)])
        return self._forward(x, weight)

    def _forward(self, x: torch.Tensor, first_weight: torch.Tensor) -> torch.Tensor:
        first = self.convs[0]
        if x.dtype != torch.float32:
            x = x.to(torch.float32)
        x = F.conv2d(x, first_weight, first.bias, stride=first.stride)
        if self.channels_last:  # the 3-channel input stays NCHW (measured faster), later layers run NHWC
            x = x.contiguous(memory_format=torch.channels_last)
        x = self.act(x)
        for conv in self.convs[1:]:
            x = self.act(conv(x))
        return self.act(self.fc(x.flatten(1)))


class MLPEncoder(nn.Module):
    """Linear + nonlinearity per layer size. Input `[B, D]` float."""

    def __init__(self, in_size: int, layers: Sequence[int], nonlin: str):
        super().__init__()
        mods, d = [], in_size
        for size in layers:
            mods += [nn.Linear(d, size), nonlinearity(nonlin)]
            d = size
        self.net = nn.Sequential(*mods)
        self.out_size = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.to(torch.float32))


class ObsEncoder(nn.Module):
    """The whole encoder of a Dict observation: "obs" (image or vector) and optional "measurements".

    Vector observations and measurements go through a running mean/std normalizer (cfg.normalize_input)
    whose buffers live here (`obs_normalizer`, `measurements_normalizer`). Output: concatenation of the
    "obs" encoding and (full architecture) the measurements MLP (M -> 128 -> 128).
    """

    def __init__(self, cfg, obs_space, channels_last: bool = True):
        super().__init__()
        if "obs" not in obs_space.spaces:
            raise ValueError(f"observation space needs an 'obs' key, got {list(obs_space.spaces)}")
        extra = set(obs_space.spaces) - {"obs", "measurements"}
        if extra:
            raise ValueError(f"unsupported observation keys {sorted(extra)} (only 'obs' and 'measurements')")
        obs = obs_space.spaces["obs"]
        self.obs_normalizer: Optional[RunningMeanStd] = None
        self.measurements_normalizer: Optional[RunningMeanStd] = None
        if len(obs.shape) == 3:
            self.obs_encoder = ConvEncoder(obs.shape, cfg.encoder_conv_architecture, cfg.hidden_size, cfg.nonlinearity,
                                           scale_uint8=obs.dtype == "uint8", channels_last=channels_last)
        elif len(obs.shape) == 1:
            if cfg.normalize_input:
                self.obs_normalizer = RunningMeanStd(obs.shape)
            self.obs_encoder = MLPEncoder(obs.shape[0], cfg.encoder_mlp_layers, cfg.nonlinearity)
        else:
            raise ValueError(f"unsupported 'obs' shape {obs.shape}: [C, H, W] images or [D] vectors")
        out = self.obs_encoder.out_size
        self.measurements_encoder = None
        if "measurements" in obs_space.spaces:
            m = obs_space.spaces["measurements"]
            if len(m.shape) != 1:
                raise ValueError(f"'measurements' must be a vector, got shape {m.shape}")
            if cfg.normalize_input:
                self.measurements_normalizer = RunningMeanStd(m.shape)
            self.measurements_encoder = MLPEncoder(m.shape[0], [MEASUREMENTS_HIDDEN, MEASUREMENTS_HIDDEN], cfg.nonlinearity)
            out += self.measurements_encoder.out_size
        self.out_size = out

    @torch.no_grad()
    def update_normalizers(self, obs: dict, valid: Optional[torch.Tensor] = None) -> None:
        """Learner only: merge batch statistics of vector observations (`obs[key]` is `[..., D]`)."""
        if self.obs_normalizer is not None:
            self.obs_normalizer.update(obs["obs"], valid)
        if self.measurements_normalizer is not None:
            self.measurements_normalizer.update(obs["measurements"], valid)

    def forward(self, obs: dict) -> torch.Tensor:
        x = obs["obs"]
        if self.obs_normalizer is not None:
            x = self.obs_normalizer(x.to(torch.float32))
        x = self.obs_encoder(x)
        if self.measurements_encoder is not None:
            m = obs["measurements"].to(torch.float32)
            if self.measurements_normalizer is not None:
                m = self.measurements_normalizer(m)
            x = torch.cat([x, self.measurements_encoder(m)], dim=1)
        return x
