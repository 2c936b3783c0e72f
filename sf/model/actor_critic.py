"""Actor-critic models of the Sample Factory paper (appendix A.1.3, figure A.1) and the model contract of
docs/architecture.md.

    simplified:  obs image -> 3 conv -> FC hidden_size ------------------------> GRU/LSTM core -> actor, critic
    full:        obs image -> 3 conv -> FC hidden_size --\\
                 measurements -> norm -> FC 128 -> FC 128 -+-> concat ---------> GRU/LSTM core -> one head per
                                                                                   action sub-space, critic
    vector obs:  obs [D] -> norm -> MLP encoder_mlp_layers -> core -> heads
    cfg.use_rnn False: the core is the identity (rnn_state_size 1, ignored).

Options (Sample Factory 2.1.1's sample_factory/model: actor_critic.py, core.py, action_parameterization.py):
- rnn_num_layers: a stacked GRU/LSTM; its state packs every layer's h (and c), see sf.model.cores.
- actor_critic_share_weights False (ActorCriticSeparateWeights): the critic has its own encoder and core
  (`critic_encoder`, `critic_core`; `encoder`/`core` are the actor's), the RNN state is
  cat(actor's state, critic's state) (feed-forward: [B, 2], ignored). Each encoder keeps its own input normalizers,
  updated with the same batches (so they hold the same statistics, as Sample Factory's single normalizer).
- adaptive_stddev False (Box actions; ActionParameterizationContinuousNonAdaptiveStddev): the head outputs the
  means only and the log-stds are one learned parameter `action_log_std` [A], initially log(initial_stddev), with
  continuous_tanh_scale s > 0 squashing the means to tanh(mean / s) * s. The logits are [means, log-stds] either way.
- policy_initialization / policy_init_gain: see `_init_weights`.

The full architecture is chosen automatically: a "measurements" key in the obs Dict adds its MLP, a
MultiDiscrete action space gets one independent linear head per sub-space (their logits are
concatenated in sub-space order: L = sum(nvec)).

Values returned by `forward_step` / `forward_sequence` are in return units; with cfg.normalize_returns the
critic head predicts normalized returns and `returns_normalizer` (buffers in the state_dict) maps them
back; the learner trains the head on normalized targets (`forward_sequence(..., normalized_values=True)`).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple, Optional

import torch
from torch import nn

from sf.model.action_spaces import (ACTION_MASK_KEY, action_distribution, action_heads, check_action_mask, mask_logits,
                                    num_action_logits)
from sf.model.cores import IdentityCore, RecurrentCore
from sf.model.encoders import ImageEncoder, ObsEncoder
from sf.model.normalization import RunningMeanStd

if TYPE_CHECKING:
    from sf.cfg.config import Config


class StepOutput(NamedTuple):
    action_logits: torch.Tensor  # [B, L]
    values: torch.Tensor  # [B]
    new_rnn_states: torch.Tensor  # [B, H]


def _row_independent(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """layer(x), x [B, R] -> [B, N], each row computed the same way whatever the other rows: a matrix product may
    round a row differently by its place among them (MKL on an AVX-512 Xeon: Linear(64 -> 2) on 4 rows, 1 ulp), which
    a deterministic policy worker's batch-invariant chunks cannot allow. Products, then one reduction per output over
    the contiguous last dim: B x N x R multiplies, a few thousand for a chunk of rows into small heads."""
    y = (x.unsqueeze(-2) * layer.weight).sum(-1)
    return y if layer.bias is None else y + layer.bias


class ActorCritic(nn.Module):
    # the image/vector encoders' arithmetic: None (float32) or torch.bfloat16 (torch.autocast); cores and heads compute
    # in float32 from float32 features. Set by the processes that run the model (resolve_precision), not saved.
    compute_dtype: Optional[torch.dtype] = None

    def __init__(self, cfg: Config, obs_space, action_space, channels_last: bool = True):
        super().__init__()
        self.obs_space, self.action_space = obs_space, action_space
        self.action_masked = check_action_mask(obs_space, action_space)  # obs["action_mask"] masks the logits
        self.is_recurrent = bool(cfg.use_rnn)
        self.encoder = ObsEncoder(cfg, obs_space, channels_last=channels_last)
        self.core = self._make_core(cfg, self.encoder.out_size)
        self.critic_encoder: Optional[ObsEncoder] = None  # separate weights: the critic's own encoder and core
        self.critic_core: Optional[nn.Module] = None
        if not cfg.actor_critic_share_weights:
            self.critic_encoder = ObsEncoder(cfg, obs_space, channels_last=channels_last)
            self.critic_core = self._make_core(cfg, self.critic_encoder.out_size)
        self.state_sizes = [int(c.state_size) for c in (self.core, self.critic_core) if c is not None]
        self.rnn_state_size = sum(self.state_sizes)
        core_out = self.core.out_size

        heads = action_heads(action_space)
        self.num_action_logits = num_action_logits(action_space)
        # Box actions without adaptive stddev: the heads give the means, the log-stds are a learned parameter
        self.action_log_std: Optional[nn.Parameter] = None
        self.tanh_scale = 0.0
        if not heads and not cfg.adaptive_stddev:
            means = self.num_action_logits // 2
            self.action_log_std = nn.Parameter(torch.full((means,), math.log(cfg.initial_stddev)))
            self.tanh_scale = float(cfg.continuous_tanh_scale)
            heads = [means]
        sizes = heads if heads else [self.num_action_logits]
        self.action_heads = nn.ModuleList(nn.Linear(core_out, n) for n in sizes)
        self.critic = nn.Linear((self.critic_core or self.core).out_size, 1)
        self.returns_normalizer: Optional[RunningMeanStd] = (
            RunningMeanStd((), clip=None) if cfg.normalize_returns else None)
        self._init_weights(cfg.policy_initialization, cfg.policy_init_gain)

    def _make_core(self, cfg: Config, in_size: int) -> nn.Module:
        if self.is_recurrent:
            return RecurrentCore(in_size, cfg.rnn_type, cfg.rnn_size, cfg.rnn_num_layers)
        return IdentityCore(in_size)

    def _init_weights(self, scheme: str, gain: Optional[float]) -> None:
        """Sample Factory's ActorCritic.initialize_weights: every Linear and Conv2d layer gets a zero bias and, unless
        `scheme` is torch_default, weights orthogonal or Xavier-uniform.

        gain given (Sample Factory's --policy_init_gain): what Sample Factory 2.1.1 does in effect. Its conv encoder
        (the conv net and its FC layers) and its vector MLP encoder are TorchScript modules, which its
        initialize_weights does not recognise (it tests `type(layer) == nn.Linear`): their weights keep torch's
        default (kaiming-uniform, |w| <= 1/sqrt(fan_in)). Only the other layers get `scheme` with `gain`: the action
        heads, the critic, the Doom measurements' MLP and the IMPALA ResNet. The RNN keeps torch's default. (Gain 1
        on every layer, as until 2026-12-07, made the Doom network's logits far more sensitive to a step: one Adam
        step from the initial weights moved the policy 13x further in KL, and in training each SGD step moved it
        2-3x further: docs/benchmarks.md, One SGD step against Sample Factory's.)

        gain None (this implementation's default): per-layer gains instead, sqrt(2) for the encoders' layers
        (followed by ELU/ReLU), 0.01 for the action heads (a nearly uniform initial policy), 1 for the critic; with
        orthogonal, the RNN's weight matrices are also orthogonal per gate block [R, in] and its biases zero."""
        if scheme not in ("orthogonal", "xavier_uniform", "torch_default"):
            raise ValueError(f"policy_initialization must be orthogonal, xavier_uniform or torch_default, "
                             f"got {scheme!r}")
        init = nn.init.orthogonal_ if scheme == "orthogonal" else nn.init.xavier_uniform_
        layer_gain = {id(h): 0.01 for h in self.action_heads}
        layer_gain[id(self.critic)] = 1.0
        kept = set()  # the layers at torch's default weights (gain given: Sample Factory's scripted encoders)
        if gain is not None:
            kept = {id(m) for enc in (self.encoder, self.critic_encoder) if enc is not None
                    for m in enc.scripted_in_sample_factory()}
        for m in self.modules():  # module order: the encoders' layers, the RNN, the heads, the critic
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                if scheme != "torch_default" and id(m) not in kept:
                    init(m.weight, gain=layer_gain.get(id(m), math.sqrt(2.0)) if gain is None else gain)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.GRU, nn.LSTM)) and scheme == "orthogonal" and gain is None:
                for name, p in m.named_parameters():
                    if "weight" in name:
                        for w in p.data.split(m.hidden_size, dim=0):  # one block per gate
                            nn.init.orthogonal_(w)
                    else:
                        nn.init.zeros_(p)

    # --- heads ---
    # hts/ppo policy workers (sf.sampling.policy_worker): heads computed row by row, see _row_independent
    row_independent_heads = False

    def _heads(self, x: torch.Tensor, critic_x: torch.Tensor):
        """Actor features x [..., R] and critic features critic_x [..., R] -> (logits [..., L], values [...])."""
        head = _row_independent if self.row_independent_heads else nn.Linear.__call__
        if len(self.action_heads) == 1:
            logits = head(self.action_heads[0], x)
        else:
            logits = torch.cat([head(h, x) for h in self.action_heads], dim=-1)
        if self.action_log_std is not None:  # logits are the means here
            if self.tanh_scale > 0:
                logits = torch.tanh(logits / self.tanh_scale) * self.tanh_scale
            logits = torch.cat([logits, self.action_log_std.expand_as(logits)], dim=-1)
        return logits, head(self.critic, critic_x).squeeze(-1)

    def _core_sequence(self, core: nn.Module, feats: torch.Tensor, rnn_states: torch.Tensor, dones: torch.Tensor,
                       recurrence: int, cut_dones: Optional[torch.Tensor] = None) -> torch.Tensor:
        """feats [B*S, F] -> core outputs [S, B, R] (time-major; feed-forward: feats itself); rnn_states [B, S, H]."""
        if not self.is_recurrent:
            return feats
        b, s = dones.shape[:2]
        return core.sequence(feats.view(b, s, -1).transpose(0, 1).contiguous(), rnn_states, dones, recurrence,
                             cut_dones)

    def _encode(self, encoder: ObsEncoder, obs: dict) -> torch.Tensor:
        """encoder(obs) [B, F] in float32, computed in compute_dtype (autocast) when one is set. Only the encoder: the
        convolutions are most of the cost, and oneDNN's bfloat16 GRU/LSTM backward over long segments (few episode
        ends in a trajectory) was measured 3x slower than float32's."""
        if self.compute_dtype is None:
            return encoder(obs)
        with torch.autocast(self.critic.weight.device.type, dtype=self.compute_dtype):
            return encoder(obs).float()

    def _denormalize_values(self, v: torch.Tensor) -> torch.Tensor:
        return self.returns_normalizer.denormalize(v) if self.returns_normalizer is not None else v

    # --- contract ---
    def forward_step(self, obs: dict, rnn_states: torch.Tensor) -> StepOutput:
        """obs: key -> [B, *shape] (storage dtype); rnn_states [B, H] -> StepOutput."""
        if self.critic_core is None:
            x, new_states = self.core.step(self._encode(self.encoder, obs), rnn_states)
            c = x
        else:
            actor_states, critic_states = rnn_states.split(self.state_sizes, dim=-1)
            x, new_actor = self.core.step(self._encode(self.encoder, obs), actor_states)
            c, new_critic = self.critic_core.step(self._encode(self.critic_encoder, obs), critic_states)
            new_states = torch.cat([new_actor, new_critic], dim=-1)
        logits, values = self._heads(x, c)
        return StepOutput(self._mask(logits, obs), self._denormalize_values(values), new_states)

    forward = forward_step

    def forward_sequence(self, obs: dict, rnn_states: torch.Tensor, dones: torch.Tensor, recurrence: int,
                         normalized_values: bool = False, cut_dones: Optional[torch.Tensor] = None):
        """obs: key -> [B, S, *shape]; rnn_states [B, S, H]; dones [B, S] -> (logits [B, S, L], values [B, S]).

        The encoder runs once over all B*S observations; only the RNN loops over time. Outputs are
        transposed views of time-major tensors, so `.transpose(0, 1)` gives contiguous `[S, B]` ones.
        With `normalized_values` the raw critic output (normalized return units) is returned. cut_dones: the dones
        in host memory for the recurrent core's episode cuts (RecurrentCore.sequence), None: `dones` themselves."""
        b, s = dones.shape[:2]
        flat = {k: v.reshape(b * s, *v.shape[2:]) for k, v in obs.items()}
        if self.critic_core is None:
            x = c = self._core_sequence(self.core, self._encode(self.encoder, flat), rnn_states, dones, recurrence,
                                        cut_dones)
        else:
            actor_states, critic_states = rnn_states.split(self.state_sizes, dim=-1)
            x = self._core_sequence(self.core, self._encode(self.encoder, flat), actor_states, dones, recurrence,
                                    cut_dones)
            c = self._core_sequence(self.critic_core, self._encode(self.critic_encoder, flat), critic_states, dones,
                                    recurrence, cut_dones)
        logits, values = self._heads(x, c)  # recurrent: [S, B, L], [S, B]; feed-forward: [B*S, L], [B*S]
        if self.is_recurrent:
            logits, values = logits.transpose(0, 1), values.transpose(0, 1)
        else:
            logits, values = logits.view(b, s, -1), values.view(b, s)
        if not normalized_values:
            values = self._denormalize_values(values)
        return self._mask(logits, obs), values

    def _mask(self, logits: torch.Tensor, obs: dict) -> torch.Tensor:
        """logits [..., L] -> the same with obs["action_mask"] [..., L] applied (sf.model.action_spaces.mask_logits):
        every consumer of the logits sees masked actions at probability exactly 0."""
        return mask_logits(logits, obs[ACTION_MASK_KEY]) if self.action_masked else logits

    def action_distribution(self, logits: torch.Tensor):
        """Distribution over actions for logits [..., L] (see sf.model.action_spaces)."""
        return action_distribution(self.action_space, logits)

    def cast_for_inference(self) -> "ActorCritic":
        """An acting copy (policy workers) with its matrix weights stored in `compute_dtype` (None: unchanged).

        The encoders' layers get the weights autocast would cast on every forward, so the encoders compute exactly
        what they compute in float32 storage (each image encoder's first convolution stays float32: its weights are
        scaled by the input preprocessing first, in float32, see ImageEncoder); the recurrent cores' weights make
        their gate products run in `compute_dtype` (RecurrentCore.step). Weights loaded later are converted by the
        copy (SharedWeights.load_into), once per published version instead of once per forward. The learner keeps
        its cores in float32 (see _encode), so the behaviour policy differs from the learner's by the rounding of
        the gate products: the log-probabilities stored with each action are the acting policy's own, and V-trace
        and the PPO ratio correct for the difference as for policy lag. Heads and critic stay float32."""
        dtype = self.compute_dtype
        if dtype is None:
            return self
        for encoder in (self.encoder, self.critic_encoder):
            if encoder is None:
                continue
            keep = {id(m.first_conv) for m in encoder.modules() if isinstance(m, ImageEncoder)}
            for m in encoder.modules():
                if isinstance(m, (nn.Linear, nn.Conv2d)) and id(m) not in keep:
                    m.to(dtype)
        for core in (self.core, self.critic_core):
            if isinstance(core, RecurrentCore):
                core.rnn.to(dtype)
        return self

    @torch.no_grad()
    def update_normalizers(self, obs: dict, valid: Optional[torch.Tensor] = None) -> None:
        """Learner only: merge the statistics of vector observations/measurements (`[..., D]`)."""
        self.encoder.update_normalizers(obs, valid)
        if self.critic_encoder is not None:
            self.critic_encoder.update_normalizers(obs, valid)


def native_bfloat16(device) -> bool:
    """Whether `device` computes bfloat16 natively (CPU: AVX512-BF16 or AMX; CUDA: the GPU's bf16 support): there
    bfloat16 convolutions and matrix products are faster than float32; elsewhere they are emulated, slower."""
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        cpu = torch.cpu
        return bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
                    or getattr(cpu, "_is_amx_tile_supported", lambda: False)())
    return False


def resolve_precision(choice: str, model: nn.Module, device, deterministic: bool) -> Optional[torch.dtype]:
    """--precision -> ActorCritic.compute_dtype. auto: bfloat16 for a convolutional encoder on hardware that computes
    it natively, unless `deterministic` (a bit-for-bit process: its guarantees are float32's)."""
    if choice == "bfloat16":
        return torch.bfloat16
    if choice == "float32" or deterministic:
        return None
    has_conv = any(isinstance(m, nn.Conv2d) for m in model.modules())
    return torch.bfloat16 if has_conv and native_bfloat16(device) else None


def run_precision(cfg: Config, model: ActorCritic, device, deterministic: bool) -> ActorCritic:
    """Set model.compute_dtype as the run's processes set it: --precision resolved on `device` (resolve_precision);
    `deterministic`: the process's bit-for-bit promise (its caller's cfg.mode says; the model knows no mode). Returns
    model."""
    model.compute_dtype = resolve_precision(cfg.precision, model, device, deterministic)
    return model


def create_actor_critic(cfg: Config, obs_space, action_space, channels_last: bool = True) -> ActorCritic:
    """The model of the contract. `channels_last`: conv activations after the first layer in NHWC memory
    format (oneDNN's preferred layout; measured a little faster on CPU, see benchmarks/learner_step.py
    --no_channels_last); the weights, the state_dict and the function are the same either way."""
    return ActorCritic(cfg, obs_space, action_space, channels_last=channels_last)
