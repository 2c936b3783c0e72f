"""forward_sequence (truncated BPTT with resets) equals a loop of forward_step with manual resets."""
import pytest
import torch
from gymnasium import spaces

from model_test_helpers import VECTOR_OBS, make_cfg, make_obs
from sf.model.actor_critic import create_actor_critic
from sf.model.cores import chunk_starts


def test_chunk_starts():
    assert chunk_starts(33, 32) == [0]  # the bootstrap step continues the carried state
    assert chunk_starts(33, 16) == [0, 16]
    assert chunk_starts(32, 16) == [0, 16]
    assert chunk_starts(9, 4) == [0, 4]
    assert chunk_starts(5, 8) == [0]
    assert chunk_starts(4, 1) == [0, 1, 2, 3]


def reference(model, obs, rnn_states, dones, recurrence):
    """The slow definition: step by step; stored state at chunk starts; state * (1 - done) after a done."""
    B, S = dones.shape
    starts = set(chunk_starts(S, recurrence))
    logits, values = [], []
    state = None
    for t in range(S):
        if t in starts:
            state = rnn_states[:, t]
        if t > 0:
            state = state * (1.0 - dones[:, t - 1:t])
        out = model.forward_step({k: v[:, t] for k, v in obs.items()}, state)
        logits.append(out.action_logits)
        values.append(out.values)
        state = out.new_rnn_states
    return torch.stack(logits, 1), torch.stack(values, 1)


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
@pytest.mark.parametrize("S,recurrence", [(9, 8), (9, 4), (9, 3), (8, 4), (9, 1), (5, 16)])
def test_sequence_equals_step_loop(rnn_type, S, recurrence):
    torch.manual_seed(S * 10 + recurrence)
    cfg = make_cfg(rnn_type=rnn_type, rnn_size=16, encoder_mlp_layers=[16])
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    B = 5
    obs = make_obs(VECTOR_OBS, (B, S))
    rnn_states = torch.randn(B, S, model.rnn_state_size)  # arbitrary stored states: chunk starts must use them
    dones = (torch.rand(B, S) < 0.25).float()
    dones[0, 1] = 1.0
    dones[1, S - 2] = 1.0
    dones[2] = 0.0  # one trajectory without resets
    with torch.no_grad():
        logits, values = model.forward_sequence(obs, rnn_states, dones, recurrence)
        ref_logits, ref_values = reference(model, obs, rnn_states, dones, recurrence)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values, ref_values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_stored_states_consistent_with_rollout(rnn_type):
    """With stored states written by the acting loop (zeroed after done), any recurrence gives the acting outputs."""
    torch.manual_seed(3)
    cfg = make_cfg(rnn_type=rnn_type, rnn_size=16, encoder_mlp_layers=[16])
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    B, T = 4, 8
    obs = make_obs(VECTOR_OBS, (B, T + 1))
    dones = (torch.rand(B, T + 1) < 0.2).float()
    stored = torch.zeros(B, T + 1, model.rnn_state_size)
    state = torch.randn(B, model.rnn_state_size)
    acted_values = []
    with torch.no_grad():
        for t in range(T + 1):
            stored[:, t] = state
            out = model.forward_step({k: v[:, t] for k, v in obs.items()}, state)
            acted_values.append(out.values)
            state = out.new_rnn_states * (1 - dones[:, t:t + 1])
        acted_values = torch.stack(acted_values, 1)
        for recurrence in (T, 4, 2, 1):
            _, values = model.forward_sequence(obs, stored, dones, recurrence)
            torch.testing.assert_close(values, acted_values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_gradient_truncation_and_reset(rnn_type):
    """No gradient crosses a chunk start or an episode reset; it does flow within a chunk."""
    torch.manual_seed(4)
    cfg = make_cfg(rnn_type=rnn_type, rnn_size=16, encoder_mlp_layers=[16], normalize_input=False)
    model = create_actor_critic(cfg, VECTOR_OBS, spaces.Discrete(3))
    B, S = 2, 9
    obs = make_obs(VECTOR_OBS, (B, S))
    obs["obs"].requires_grad_(True)
    dones = torch.zeros(B, S)
    dones[1, 1] = 1.0  # trajectory 1: reset before step 2
    _, values = model.forward_sequence(obs, torch.zeros(B, S, model.rnn_state_size), dones, 4)
    g_chunk, = torch.autograd.grad(values[0, 5], obs["obs"], retain_graph=True)
    assert g_chunk[0, 4:6].abs().sum() > 0  # within the chunk [4, 8)
    assert (g_chunk[0, :4] == 0).all()  # previous chunk: truncated
    g_reset, = torch.autograd.grad(values[1, 3], obs["obs"])
    assert g_reset[1, 2:4].abs().sum() > 0
    assert (g_reset[1, :2] == 0).all()  # before the reset
    assert (g_reset[0] == 0).all()  # trajectories are independent


def test_cut_dones_in_host_memory_set_the_cuts():
    """RecurrentCore.sequence's cut_dones (a CUDA batch's dones in host memory, DONES_HOST): the batch's own dones give
    the same bits as cutting at `dones`; a superset of trajectories (a minibatch cut where any of its training batch
    ended) only adds segments (the same function); dones without their cuts would leave a done's reset out."""
    from sf.model.cores import RecurrentCore
    torch.manual_seed(0)
    core = RecurrentCore(6, "gru", 5)
    s, b = 9, 3
    x, states = torch.randn(s, b, 6), torch.randn(b, s, 5)
    dones = torch.zeros(b, s)
    dones[0, 2] = dones[2, 5] = 1.0
    with torch.no_grad():
        ref = core.sequence(x, states, dones, 4)
        assert torch.equal(core.sequence(x, states, dones, 4, cut_dones=dones.clone()), ref)
        others = torch.zeros(4, s)
        others[1, 0] = others[3, 6] = 1.0  # trajectories of the batch outside this minibatch
        superset = core.sequence(x, states, dones, 4, cut_dones=torch.cat([dones, others]))
        torch.testing.assert_close(superset, ref, rtol=1e-6, atol=1e-6)
        uncut = core.sequence(x, states, dones, 4, cut_dones=torch.zeros(b, s))
    assert not torch.allclose(uncut, ref)  # the cuts come from cut_dones
