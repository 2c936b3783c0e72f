"""Actor-critic models of the Sample Factory paper (appendix A.1.3, figure A.1) and the model contract of
docs/architecture.md.

    simplified:  obs image -> 3 conv -> FC hidden_size ------------------------> GRU/LSTM core -> actor, critic
    full:        obs image -> 3 conv -> FC hidden_size --\\
                 measurements -> norm -> FC 128 -> FC 128 -+-> concat ---------> GRU/LSTM core -> one head per
                                                                                   action sub-space, critic
    vector obs:  obs [D] -> norm -> MLP encoder_mlp_layers -> core -> heads
    cfg.use_rnn False: the core is the identity (rnn_state_size 1, ignored).

The full architecture is chosen automatically: a "measurements" key in the obs Dict adds its MLP, a
MultiDiscrete action space gets one independent linear head per sub-space (their logits are
concatenated in sub-space order: L = sum(nvec)).

Values returned by `forward_step` / `forward_sequence` are in return units; with cfg.normalize_returns the
critic head predicts normalized returns and `returns_normalizer` (buffers in the state_dict) maps them
back; the learner trains the head on normalized targets (`forward_sequence(..., normalized_values=True)`).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import nn

from sf.model.action_spaces import action_distribution, action_heads, num_action_logits
from sf.model.cores import IdentityCore, RecurrentCore
from sf.model.encoders import ObsEncoder
from sf.model.normalization import RunningMeanStd


class StepOutput(NamedTuple):
    action_logits: torch.Tensor  # [B, L]
    values: torch.Tensor  # [B]
    new_rnn_states: torch.Tensor  # [B, H]


class ActorCritic(nn.Module):
    def __init__(self, cfg, obs_space, action_space, channels_last: bool = True):
        super().__init__()
        self.obs_space, self.action_space = obs_space, action_space
        self.encoder = ObsEncoder(cfg, obs_space, channels_last=channels_last)
        if cfg.use_rnn:
            self.core = RecurrentCore(self.encoder.out_size, cfg.rnn_type, cfg.rnn_size)
        else:
            self.core = IdentityCore(self.encoder.out_size)
        self.rnn_state_size = int(self.core.state_size)
        self.is_recurrent = bool(cfg.use_rnn)
        core_out = self.core.out_size

        heads = action_heads(action_space)
        sizes = heads if heads else [num_action_logits(action_space)]
        self.action_heads = nn.ModuleList(nn.Linear(core_out, n) for n in sizes)
        self.num_action_logits = num_action_logits(action_space)
        self.critic = nn.Linear(core_out, 1)
        self.returns_normalizer: Optional[RunningMeanStd] = (
            RunningMeanStd((), clip=None) if getattr(cfg, "normalize_returns", False) else None)
        self._init_weights()

    def _init_weights(self) -> None:
        relu_gain = math.sqrt(2.0)
        for m in self.encoder.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.orthogonal_(m.weight, gain=relu_gain)
                nn.init.zeros_(m.bias)
        if isinstance(self.core, RecurrentCore):
            for name, p in self.core.rnn.named_parameters():
                if "weight" in name:
                    for w in p.data.split(self.core.rnn_size, dim=0):  # one block per gate
                        nn.init.orthogonal_(w)
                else:
                    nn.init.zeros_(p)
        for head in self.action_heads:
            nn.init.orthogonal_(head.weight, gain=0.01)
            nn.init.zeros_(head.bias)
        nn.init.orthogonal_(self.critic.weight, gain=1.0)
        nn.init.zeros_(self.critic.bias)

    # --- heads ---
    def _heads(self, x: torch.Tensor):
        if len(self.action_heads) == 1:
            logits = self.action_heads[0](x)
        else:
            logits = torch.cat([h(x) for h in self.action_heads], dim=-1)
        return logits, self.critic(x).squeeze(-1)

    def _denormalize_values(self, v: torch.Tensor) -> torch.Tensor:
        return self.returns_normalizer.denormalize(v) if self.returns_normalizer is not None else v

    # --- contract ---
    def forward_step(self, obs: dict, rnn_states: torch.Tensor) -> StepOutput:
        """obs: key -> [B, *shape] (storage dtype); rnn_states [B, H] -> StepOutput."""
        x = self.encoder(obs)
        x, new_states = self.core.step(x, rnn_states)
        logits, values = self._heads(x)
        return StepOutput(logits, self._denormalize_values(values), new_states)

    forward = forward_step

    def forward_sequence(self, obs: dict, rnn_states: torch.Tensor, dones: torch.Tensor, recurrence: int,
                         normalized_values: bool = False):
        """obs: key -> [B, S, *shape]; rnn_states [B, S, H]; dones [B, S] -> (logits [B, S, L], values [B, S]).

        The encoder runs once over all B*S observations; only the RNN loops over time. Outputs are
        transposed views of time-major tensors, so `.transpose(0, 1)` gives contiguous `[S, B]` ones.
        With `normalized_values` the raw critic output (normalized return units) is returned."""
        b, s = dones.shape[:2]
        flat = {k: v.reshape(b * s, *v.shape[2:]) for k, v in obs.items()}
        feats = self.encoder(flat)
        if self.is_recurrent:
            x = feats.view(b, s, -1).transpose(0, 1).contiguous()  # [S, B, F]
            x = self.core.sequence(x, rnn_states, dones, recurrence)
            logits, values = self._heads(x)  # [S, B, L], [S, B]
            logits, values = logits.transpose(0, 1), values.transpose(0, 1)
        else:
            logits, values = self._heads(feats)
            logits, values = logits.view(b, s, -1), values.view(b, s)
        if not normalized_values:
            values = self._denormalize_values(values)
        return logits, values

    def action_distribution(self, logits: torch.Tensor):
        """Distribution over actions for logits [..., L] (see sf.model.action_spaces)."""
        return action_distribution(self.action_space, logits)

    @torch.no_grad()
    def update_normalizers(self, obs: dict, valid: Optional[torch.Tensor] = None) -> None:
        """Learner only: merge the statistics of vector observations/measurements (`[..., D]`)."""
        self.encoder.update_normalizers(obs, valid)


def create_actor_critic(cfg, obs_space, action_space, channels_last: bool = True) -> ActorCritic:
    """The model of the contract. `channels_last`: conv activations after the first layer in NHWC memory
    format (oneDNN's preferred layout; measured a little faster on CPU, see benchmarks/learner_step.py
    --no_channels_last); the weights, the state_dict and the function are the same either way."""
    return ActorCritic(cfg, obs_space, action_space, channels_last=channels_last)
