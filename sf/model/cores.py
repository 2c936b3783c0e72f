"""Recurrent cores (GRU / LSTM) with truncated BPTT and episode resets, and the feed-forward identity.

State packing (Sample Factory's ModelCoreRNN): `[B, H]`, layer after layer; GRU: H = num_layers * rnn_size, layer l's
h at `[l * R, (l + 1) * R)`; LSTM: H = 2 * num_layers * rnn_size, layer l's (h, c) at `[2 l R, 2 (l + 1) R)`.

`sequence(x, rnn_states, dones, recurrence)` is the learner's pass over `S` steps (time-major `[S, B, F]`):
- chunk starts (multiples of `recurrence`) take the *stored* state of that step (truncated BPTT: no
  gradient flows into a chunk from the previous one); the last chunk, when shorter than `recurrence`
  (S = T+1: the bootstrap step), continues from the carried state instead;
- before step t (t > 0) the state is multiplied by (1 - dones[t-1]) (reset after an episode end).
The time axis is cut into segments at chunk starts and at every step that follows a done of *any*
trajectory; each segment is one call of the fused `nn.GRU`/`nn.LSTM` (input projections of the whole
segment in one matmul, the time loop in C++), so Python only loops over segments.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def chunk_starts(seq_len: int, recurrence: int) -> list[int]:
    """Steps whose stored RNN state starts a BPTT chunk: 0 and every full chunk's first step."""
    recurrence = max(1, int(recurrence))
    return [t for t in range(0, seq_len, recurrence) if t == 0 or t + recurrence <= seq_len]


class RecurrentCore(nn.Module):
    def __init__(self, in_size: int, rnn_type: str, rnn_size: int, num_layers: int = 1):
        super().__init__()
        if rnn_type not in ("gru", "lstm"):
            raise ValueError(f"rnn_type must be gru or lstm, got {rnn_type!r}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        self.rnn_type, self.rnn_size, self.num_layers = rnn_type, rnn_size, num_layers
        self.is_lstm = rnn_type == "lstm"
        self.rnn = (nn.LSTM if self.is_lstm else nn.GRU)(in_size, rnn_size, num_layers=num_layers)
        self.state_size = (2 if self.is_lstm else 1) * num_layers * rnn_size
        self.out_size = rnn_size

    def _unpack(self, state: torch.Tensor):
        """[B, H] -> nn.GRU's hidden [L, B, R] (nn.LSTM: a pair of them)."""
        layers = state.reshape(state.shape[0], self.num_layers, -1).transpose(0, 1)  # [L, B, R] (LSTM: [L, B, 2R])
        if self.is_lstm:
            h, c = layers.split(self.rnn_size, dim=-1)
            return h.contiguous(), c.contiguous()
        return layers.contiguous()

    def _pack(self, hidden) -> torch.Tensor:
        """nn.GRU/nn.LSTM hidden -> [B, H]."""
        if self.is_lstm:
            hidden = torch.cat(hidden, dim=-1)  # [L, B, 2R]
        return hidden.transpose(0, 1).reshape(hidden.shape[1], -1)

    @staticmethod
    def _mask(hidden, keep: torch.Tensor):
        """Multiply the hidden state by keep [B] (1 - done)."""
        k = keep.view(1, -1, 1)
        if isinstance(hidden, tuple):
            return hidden[0] * k, hidden[1] * k
        return hidden * k

    def step(self, x: torch.Tensor, state: torch.Tensor):
        """x [B, F], state [B, H] -> (out [B, R], new_state [B, H])."""
        if self.rnn.weight_ih_l0.dtype != torch.float32:
            return self._step_low_precision(x, state)
        if not self.is_lstm:  # one step: the GRU cell on nn.GRU's own weights (skips the sequence-RNN set-up:
            # ~0.9 -> ~0.5 ms at the policy worker's batch of 2 on CPU; same numbers), layer after layer
            state, r, new = state.to(x.dtype), self.rnn_size, []
            for i, (w_ih, w_hh, b_ih, b_hh) in enumerate(self.rnn.all_weights):
                x = torch.gru_cell(x, state[:, i * r:(i + 1) * r], w_ih, w_hh, b_ih, b_hh)
                new.append(x)
            return x, (x if len(new) == 1 else torch.cat(new, dim=-1))
        out, hidden = self.rnn(x.unsqueeze(0), self._unpack(state))
        return out[0], self._pack(hidden)

    def _step_low_precision(self, x: torch.Tensor, state: torch.Tensor):
        """`step` with the weights in a lower precision (a policy worker's acting copy, ActorCritic.cast_for_inference):
        each layer's two gate products x W_ih^T + b_ih and h W_hh^T + b_hh in the weights' dtype, the gate arithmetic
        of torch.gru_cell / lstm_cell and the state in float32. x [B, F], state [B, H] -> (out [B, R], new [B, H])."""
        dtype, r = self.rnn.weight_ih_l0.dtype, self.rnn_size
        width = 2 * r if self.is_lstm else r  # one layer's part of the packed state
        new = []
        for i, (w_ih, w_hh, b_ih, b_hh) in enumerate(self.rnn.all_weights):
            layer = state[:, i * width:(i + 1) * width].float()
            h = layer[:, :r]
            gx = F.linear(x.to(dtype), w_ih, b_ih).float()  # [B, G * R], G = 3 (GRU: r, z, n) or 4 (LSTM: i, f, g, o)
            gh = F.linear(h.to(dtype), w_hh, b_hh).float()
            if self.is_lstm:
                gi, gf, gg, go = (gx + gh).chunk(4, dim=1)
                c = torch.sigmoid(gf) * layer[:, r:] + torch.sigmoid(gi) * torch.tanh(gg)
                x = torch.sigmoid(go) * torch.tanh(c)
                new.append(torch.cat([x, c], dim=1))
            else:
                xr, xz, xn = gx.chunk(3, dim=1)
                hr, hz, hn = gh.chunk(3, dim=1)
                n = torch.tanh(xn + torch.sigmoid(xr + hr) * hn)
                x = n + torch.sigmoid(xz + hz) * (h - n)  # (1 - z) n + z h
                new.append(x)
        return x, (new[0] if len(new) == 1 else torch.cat(new, dim=-1))

    def sequence(self, x: torch.Tensor, rnn_states: torch.Tensor, dones: torch.Tensor, recurrence: int,
                 cut_dones: torch.Tensor | None = None) -> torch.Tensor:
        """x [S, B, F] time-major; rnn_states [B, S, H] (stored, read at chunk starts); dones [B, S].
        cut_dones [B', S]: where to cut the pass instead of `dones` (after a step where any row is done), in host
        memory (a CUDA batch's DONES_HOST: no wait for the device); its rows may be a superset of the batch's (a
        minibatch cut where any trajectory of its training batch ended: more segments, the same function).

        Returns core outputs [S, B, R]."""
        seq_len = x.shape[0]
        starts = chunk_starts(seq_len, recurrence)
        keep = None
        cuts = set(starts)
        if seq_len > 1:
            dones_prev = dones[:, :-1]
            any_done = ((dones_prev if cut_dones is None else cut_dones[:, :-1]) != 0).any(0)
            if bool(any_done.any()):
                cuts.update((torch.nonzero(any_done).view(-1) + 1).tolist())
            keep = (1.0 - dones_prev.to(x.dtype)).t()  # [S-1, B]: keep[t-1] multiplies the state before step t
        bounds = sorted(cuts) + [seq_len]
        stored = set(starts)
        # torch.split, not x[a:b]: its backward is one concatenation, slicing would zero-fill a full-size
        # gradient per segment.
        segments = x.split([b - a for a, b in zip(bounds[:-1], bounds[1:])])
        outs = []
        hidden = None
        for a, seg in zip(bounds[:-1], segments):
            if a in stored:
                hidden = self._unpack(rnn_states[:, a].to(x.dtype))
            if a > 0:
                hidden = self._mask(hidden, keep[a - 1])
            out, hidden = self.rnn(seg, hidden)
            outs.append(out)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


class IdentityCore(nn.Module):
    """Feed-forward model: no recurrence, state size 1 (ignored, returned as zeros)."""

    state_size = 1

    def __init__(self, in_size: int):
        super().__init__()
        self.out_size = in_size

    def step(self, x: torch.Tensor, state: torch.Tensor):
        return x, torch.zeros((x.shape[0], 1), dtype=torch.float32, device=x.device)

    def sequence(self, x: torch.Tensor, rnn_states, dones, recurrence, cut_dones=None) -> torch.Tensor:
        return x
