"""Observation encoders, as Sample Factory 2.1.1's sample_factory/model/encoder.py (MultiInputEncoder): each key of
the observation Dict has its own encoder and their outputs are concatenated (`ObsEncoder`).

- image keys `[C, H, W]`: the conv net of --encoder_conv_architecture (`ConvEncoder`: convnet_simple, convnet_impala,
  convnet_atari; `ResnetEncoder`: resnet_impala, the IMPALA residual network), flattened, then the fully connected
  layers of --encoder_conv_mlp_layers (default: one layer of --hidden_size), each followed by the nonlinearity;
- vector keys `[D]`: an MLP of --encoder_mlp_layers; the key "measurements" (the paper's full Doom architecture,
  Sample Factory's VizdoomEncoder) a fixed MLP D -> 128 -> 128;
- "action_mask" is not an input: it masks the logits (sf.model.action_spaces).

Keys are encoded "obs" first, then the others in sorted order (Sample Factory sorts them all; "obs" first keeps the
order of the Doom full architecture: obs, measurements). Key K's modules are `K_encoder` and `K_normalizer`.

Input preprocessing (Sample Factory's ObservationNormalizer): image keys become `(x - obs_subtract_mean) / obs_scale`
(defaults 0 and 255: uint8 frames to [0, 1]); then, with --normalize_input, the keys of --normalize_input_keys (None:
every vector key) go through a running mean/std normalizer (sf.model.normalization), images per element as in Sample
Factory (PixelMeanStd, fed the raw frames: it folds the preprocessing into its statistics and its one multiply-add).
Vector keys are never scaled.

All encoders take `[B, *shape]` in storage dtype and return `[B, out_size]` float32. An image key without a normalizer
is scaled inside the first convolution: its weight is multiplied by 1/obs_scale and the mean is folded into its bias
(a padded first convolution sees the input padded with the mean), which is the same function as preprocessing the
input and saves passes over the largest tensor of the learner.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from sf.model.action_spaces import ACTION_MASK_KEY
from sf.model.normalization import PixelMeanStd, RunningMeanStd
from sf.utils.errors import ConfigError

if TYPE_CHECKING:
    from sf.cfg.config import Config

# (out_channels, kernel, stride), each conv followed by the nonlinearity (Sample Factory's ConvEncoder)
CONV_ARCHITECTURES = {
    # Sample Factory's Doom encoder for 128x72 frames: [3,72,128] -> [32,17,31] -> [64,7,14] -> [128,3,6]
    "convnet_simple": [(32, 8, 4), (64, 4, 2), (128, 3, 2)],
    # the IMPALA paper's shallow network: [4,84,84] -> [16,20,20] -> [32,9,9]
    "convnet_impala": [(16, 8, 4), (32, 4, 2)],
    # Nature DQN CNN (Mnih et al. 2015) for 84x84x4 Atari frames: -> [32,20,20] -> [64,9,9] -> [64,7,7]
    "convnet_atari": [(32, 8, 4), (64, 4, 2), (64, 3, 1)],
}
# (channels, residual blocks) per stage: conv 3x3 + max-pool 3x3 stride 2 + the blocks (Sample Factory's ResnetEncoder)
RESNET_ARCHITECTURES = {
    # the IMPALA paper's deep network: [4,84,84] -> [16,42,42] -> [32,21,21] -> [32,11,11]
    "resnet_impala": [(16, 2), (32, 2), (32, 2)],
}
ARCHITECTURES = ("auto", *CONV_ARCHITECTURES, *RESNET_ARCHITECTURES)

MEASUREMENTS_KEY = "measurements"
MEASUREMENTS_HIDDEN = 128
CPU_BLOCK = 128  # frames per conv call on CPU (cache blocking)
# On CPU in float32 the first convolution reads NHWC from this many input channels on: APPO.train on Atari's 4 stacked
# 84x84 frames x1.11 (2 threads), x1.09 (1 thread) (benchmarks/learner_step.py --frames 4 84 84 --nchw_input_too);
# Doom's 3 RGB channels stay NCHW (their conv layers alone were no faster reading NHWC: docs/benchmarks.md)
NHWC_INPUT_CHANNELS = 4


def nonlinearity(name: str) -> nn.Module:
    return {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh}[name]()


def pick_conv_architecture(name: str, obs_shape: Sequence[int]) -> str:
    """'auto': 84x84 frames (Atari) -> convnet_atari, anything else (Doom 72x128, ...) -> convnet_simple."""
    if name != "auto":
        if name not in ARCHITECTURES:
            raise ValueError(f"unknown conv architecture {name!r}; one of {', '.join(ARCHITECTURES)}")
        return name
    return "convnet_atari" if tuple(obs_shape[-2:]) == (84, 84) else "convnet_simple"


def conv_mlp_layers(cfg: Config) -> list[int]:
    """The fully connected layers after the conv layers: --encoder_conv_mlp_layers, or (None) one of --hidden_size."""
    return [cfg.hidden_size] if cfg.encoder_conv_mlp_layers is None else list(cfg.encoder_conv_mlp_layers)


class ImageEncoder(nn.Module):
    """What every image encoder shares: the input preprocessing folded into the first convolution, CPU cache
    blocking, channels_last activations and the fully connected head (`fc`, `fc2`, ...: `fc` is the one layer of
    older checkpoints). Subclasses build the conv layers and define `first_conv` and `features`."""

    def __init__(self, obs_shape: Sequence[int], architecture: str, nonlin: str, obs_scale: float = 255.0,
                 obs_subtract_mean: float = 0.0, channels_last: bool = True, cpu_block: int = CPU_BLOCK):
        super().__init__()
        self.obs_shape, self.architecture = tuple(obs_shape), architecture
        self.input_scale, self.input_mean = 1.0 / obs_scale, float(obs_subtract_mean)
        self.channels_last, self.cpu_block = channels_last, cpu_block
        self.act = nonlinearity(nonlin)

    def _too_small(self) -> ConfigError:
        return ConfigError(f"--encoder_conv_architecture {self.architecture}: observation {list(self.obs_shape)} is "
                           "too small for it (choose another architecture)")

    def _build_head(self, conv_out_shape: tuple, mlp_layers: Sequence[int]) -> None:
        self.conv_out_shape = tuple(conv_out_shape)
        d = math.prod(conv_out_shape)
        self._fc_names = []
        for i, size in enumerate(mlp_layers):
            name = "fc" if i == 0 else f"fc{i + 1}"
            self.add_module(name, nn.Linear(d, size))
            self._fc_names.append(name)
            d = size
        self.out_size = d

    @property
    def fc_layers(self) -> list[nn.Linear]:
        """The fully connected layers after the conv net, in order (each followed by the nonlinearity)."""
        return [getattr(self, name) for name in self._fc_names]

    @property
    def first_conv(self) -> nn.Conv2d:
        raise NotImplementedError

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The first convolution's output (no nonlinearity yet) -> the conv net's output `[B, C', H', W']`."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, C, H, W] (uint8 or float) -> [B, out_size]. On CPU a large batch is run in blocks of
        `cpu_block` frames: the activations of a block stay in cache in the forward and in the backward
        pass (the whole learner step is faster than with one convolution over all the frames, see
        benchmarks/learner_step.py --cpu_block 0)."""
        weight, bias = self._first_weight_bias()
        if x.device.type == "cpu" and self.cpu_block and x.shape[0] > self.cpu_block:
            return torch.cat([self._forward(block, weight, bias) for block in x.split(self.cpu_block)])
        return self._forward(x, weight, bias)

    def _conv_input(self, x: torch.Tensor) -> torch.Tensor:
        """The first convolution's input: float32, or under autocast its compute dtype at once: autocast would round
        the float32 values to it anyway (uint8 frames: exactly), so one conversion pass instead of two. On CPU also
        NHWC when the later layers are: oneDNN's bfloat16 convolution then writes NHWC itself (no reorder after
        it); the first conv + ELU + second conv of the Doom model took 1.08 instead of 1.30 ms at 16 frames
        (forward), 10.0 instead of 11.6 ms with the backward at 64 frames. The conversion changes no bit (the values
        are autocast's rounding); the layout picks another kernel than NCHW's, whose summation order may differ in the
        last bits (seen on AVX2 without bfloat16 instructions; tests/model/test_precision.py bounds it). In float32,
        NHWC from NHWC_INPUT_CHANNELS channels on."""
        device = x.device.type
        low = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        cpu_nhwc = self.channels_last and device == "cpu" and x.dim() == 4
        if low is None or low == torch.float32:
            if cpu_nhwc and x.shape[1] >= NHWC_INPUT_CHANNELS:
                x = x.contiguous(memory_format=torch.channels_last)  # in the storage dtype (uint8: 4x fewer bytes)
            return x if x.dtype == torch.float32 else x.to(torch.float32)  # (.to keeps the layout)
        if cpu_nhwc:
            if x.element_size() > low.itemsize:  # transposed in the narrower dtype (uint8 frames: as they are)
                x = x.to(low)
            return x.contiguous(memory_format=torch.channels_last).to(low)  # (.to keeps the layout)
        return x.to(low)

    def _first_weight_bias(self) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The first convolution with the preprocessing folded in: conv((x - m) * s, W) + b =
        conv(x, s W) + (b - m * sum(s W))."""
        conv = self.first_conv
        weight, bias = conv.weight, conv.bias
        if self.input_scale != 1.0:
            weight = weight * self.input_scale
        if self.input_mean != 0.0:
            bias = bias - self.input_mean * weight.sum((1, 2, 3))
        return weight, bias

    def _forward(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        conv = self.first_conv
        padding = conv.padding
        if self.input_mean != 0.0 and any(padding):  # a zero of the preprocessed input is the mean of the raw one
            x = F.pad(x.to(torch.float32), (padding[1], padding[1], padding[0], padding[0]), value=self.input_mean)
            padding = 0
        x = self._conv_input(x)
        x = F.conv2d(x, weight, bias, stride=conv.stride, padding=padding)
        if self.channels_last:  # (float32: an input of fewer than NHWC_INPUT_CHANNELS stays NCHW), later layers NHWC
            x = x.contiguous(memory_format=torch.channels_last)
        x = self.features(x).flatten(1)
        for fc in self.fc_layers:
            x = self.act(fc(x))
        return x


class ConvEncoder(ImageEncoder):
    """Conv layers of CONV_ARCHITECTURES[architecture] (`convs`), each + nonlinearity, flatten, `mlp_layers` fully
    connected layers + nonlinearity. Input `[B, C, H, W]`."""

    def __init__(self, obs_shape: Sequence[int], architecture: str, mlp_layers: Sequence[int], nonlin: str, **kw):
        super().__init__(obs_shape, architecture, nonlin, **kw)
        c, h, w = obs_shape
        convs = []
        for out_c, k, s in CONV_ARCHITECTURES[architecture]:
            convs.append(nn.Conv2d(c, out_c, k, stride=s))
            c, h, w = out_c, (h - k) // s + 1, (w - k) // s + 1
            if h < 1 or w < 1:
                raise self._too_small()
        self.convs = nn.ModuleList(convs)
        self._build_head((c, h, w), mlp_layers)

    @property
    def first_conv(self) -> nn.Conv2d:
        return self.convs[0]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(x)
        for conv in self.convs[1:]:
            x = self.act(conv(x))
        return x


class ResBlock(nn.Module):
    """x + conv(act(conv(act(x)))), 3x3 convolutions with 'same' padding (Sample Factory's ResBlock)."""

    def __init__(self, channels: int, nonlin: str):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.act = nonlinearity(nonlin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act(self.conv1(self.act(x))))


class ResStage(nn.Module):
    """conv 3x3 ('same'), max-pool 3x3 stride 2 ('same'), residual blocks. `rest` is all but the conv (the encoder
    runs the first stage's conv itself, with the input preprocessing folded in)."""

    def __init__(self, in_channels: int, channels: int, num_blocks: int, nonlin: str):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.blocks = nn.Sequential(*(ResBlock(channels, nonlin) for _ in range(num_blocks)))

    def rest(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.pool(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rest(self.conv(x))


class ResnetEncoder(ImageEncoder):
    """The IMPALA residual network (Espeholt et al. 2018; Sample Factory's ResnetEncoder): RESNET_ARCHITECTURES
    stages (`stages`), then the nonlinearity, flatten, `mlp_layers` fully connected layers + nonlinearity.
    Each stage halves the height and width (rounding up). Input `[B, C, H, W]`."""

    def __init__(self, obs_shape: Sequence[int], architecture: str, mlp_layers: Sequence[int], nonlin: str, **kw):
        super().__init__(obs_shape, architecture, nonlin, **kw)
        c, h, w = obs_shape
        stages = []
        for channels, num_blocks in RESNET_ARCHITECTURES[architecture]:
            stages.append(ResStage(c, channels, num_blocks, nonlin))
            c, h, w = channels, (h - 1) // 2 + 1, (w - 1) // 2 + 1
        self.stages = nn.ModuleList(stages)
        self._build_head((c, h, w), mlp_layers)

    @property
    def first_conv(self) -> nn.Conv2d:
        return self.stages[0].conv

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages[0].rest(x)
        for stage in self.stages[1:]:
            x = stage(x)
        return self.act(x)


def make_image_encoder(cfg: Config, obs_shape: Sequence[int], channels_last: bool = True,
                       preprocess: bool = True) -> ImageEncoder:
    """The image encoder of the configuration for `[C, H, W]` frames. `preprocess`: fold (x - obs_subtract_mean) /
    obs_scale into its first convolution (False: the caller feeds preprocessed, normalized input)."""
    arch = pick_conv_architecture(cfg.encoder_conv_architecture, obs_shape)
    cls = ResnetEncoder if arch in RESNET_ARCHITECTURES else ConvEncoder
    scale, mean = (cfg.obs_scale, cfg.obs_subtract_mean) if preprocess else (1.0, 0.0)
    return cls(obs_shape, arch, conv_mlp_layers(cfg), cfg.nonlinearity, obs_scale=scale, obs_subtract_mean=mean,
               channels_last=channels_last)


class MLPEncoder(nn.Module):
    """Linear + nonlinearity per layer size (none: the input itself). Input `[B, D]` float."""

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
    """The whole encoder of a Dict observation (see the module docstring): obs key -> `[B, *shape]` in storage dtype
    -> `[B, out_size]`, the keys' encodings concatenated in `keys` order.

    The running mean/std normalizers' buffers live here (`K_normalizer`: in the state_dict, so checkpoints and the
    weights policy workers load carry them); only the learner updates them (`update_normalizers`).
    """

    def __init__(self, cfg: Config, obs_space, channels_last: bool = True):
        super().__init__()
        spaces = obs_space.spaces
        self.keys = sorted((k for k in spaces if k != ACTION_MASK_KEY), key=lambda k: (k != "obs", k))
        if not self.keys:
            raise ValueError(f"observation space {obs_space} has no key to encode")
        normalized = self._normalized_keys(cfg, spaces)
        self.obs_scale, self.obs_subtract_mean = float(cfg.obs_scale), float(cfg.obs_subtract_mean)
        # (key, is an image, encoder, normalizer or None), in `keys` order
        self._inputs: list[tuple[str, bool, nn.Module, Optional[RunningMeanStd]]] = []
        out = 0
        for key in self.keys:
            shape = tuple(spaces[key].shape)
            if not key or "." in key:
                raise ValueError(f"observation key {key!r} cannot name a module (empty, or with a '.')")
            if len(shape) == 3:
                enc = make_image_encoder(cfg, shape, channels_last, preprocess=key not in normalized)
            elif len(shape) == 1:
                layers = [MEASUREMENTS_HIDDEN] * 2 if key == MEASUREMENTS_KEY else cfg.encoder_mlp_layers
                enc = MLPEncoder(shape[0], layers, cfg.nonlinearity)
            else:
                raise ValueError(f"observation key {key!r} has shape {list(shape)}: encoders take [C, H, W] images "
                                 "or [D] vectors")
            self.add_module(f"{key}_encoder", enc)
            norm = None
            if key in normalized:  # (an image's normalizer is fed raw frames: it preprocesses them itself)
                norm = PixelMeanStd(shape, self.obs_subtract_mean, self.obs_scale) if len(shape) == 3 else \
                    RunningMeanStd(shape)
                self.add_module(f"{key}_normalizer", norm)
            self._inputs.append((key, len(shape) == 3, enc, norm))
            out += enc.out_size
        self.out_size = out

    def scripted_in_sample_factory(self) -> list[nn.Module]:
        """The Linear and Conv2d layers that Sample Factory 2.1.1 builds inside TorchScript modules (its conv
        encoder's conv net and FC layers, its vector MLP encoder; not the Doom measurements' MLP nor the ResNet),
        which its weight initialization passes over (see ActorCritic._init_weights)."""
        out = []
        for key, is_image, enc, _ in self._inputs:
            if isinstance(enc, ConvEncoder) or (not is_image and key != MEASUREMENTS_KEY):
                out += [m for m in enc.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        return out

    def _normalized_keys(self, cfg: Config, spaces) -> set:
        """The keys with a running mean/std normalizer: --normalize_input_keys (None: the vector keys)."""
        if not cfg.normalize_input:
            return set()
        if cfg.normalize_input_keys is None:
            return {k for k in self.keys if len(spaces[k].shape) == 1}
        unknown = [k for k in cfg.normalize_input_keys if k not in self.keys]
        if unknown:
            raise ConfigError(f"--normalize_input_keys {' '.join(unknown)}: not an input of this env's observations "
                              f"(its keys: {' '.join(self.keys)})")
        return set(cfg.normalize_input_keys)

    @torch.no_grad()
    def update_normalizers(self, obs: dict, valid: Optional[torch.Tensor] = None) -> None:
        """Learner only: merge batch statistics of the normalized keys (`obs[key]` is `[..., *shape]`)."""
        for key, image, _, norm in self._inputs:
            if norm is not None:
                norm.update(obs[key] if image else obs[key].to(torch.float32), valid)

    def forward(self, obs: dict) -> torch.Tensor:
        outs = []
        for key, image, enc, norm in self._inputs:
            x = obs[key]
            if norm is not None:
                x = norm(x if image else x.to(torch.float32))
            outs.append(enc(x))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
