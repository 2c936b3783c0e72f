"""PBT across torchrun's ranks (sf/runner/population/link.py), two ranks in one process over a real TCPStore, each
with its own SharedState and shared weights as its runner builds them: rank 0 decides on both ranks' figures, every
rank applies the decisions, and a copy to a policy of rank 0 from a policy of rank 1 arrives bit for bit in rank 0's
shared slot of the source, with the copy asked of its learner (the learner's copy itself: test_learner_population)."""
import json

import pytest
import torch
import torch.distributed as dist

from e2e_helpers import free_port
from sf.buffers.shared_weights import SharedWeights
from sf.cfg import parse_cfg
from sf.processes.ranks import World
from sf.model.actor_critic import create_actor_critic
from sf.processes.shared_state import COPIES_REQUESTED, ENV_STEPS, HYPERPARAMS, SharedState
from sf.runner.population.control import PopulationControl, fill_shared
from sf.runner.population.link import PopulationLink
from sf.runner.stats import RunStats
from sf_envs.registry import make_env

P = 4


def test_rank_0_decides_for_both_ranks_and_a_copy_from_rank_1_lands_bitwise(tmp_path, monkeypatch):
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True)  # (torchrun's agent store, as on the first node)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    cfg = parse_cfg(["--env", "test_corridor", "--experiment", "pop", "--train_dir", str(tmp_path), "--num_policies",
                     str(P), "--with_pbt", "True", "--pbt_period_env_steps", "100", "--pbt_start_mutation", "100",
                     "--pbt_replace_fraction", "0.25", "--pbt_replace_reward_gap", "0.0", "--hidden_size", "16",
                     "--encoder_mlp_layers", "16", "--use_rnn", "False", "--device", "cpu"])
    env = make_env(cfg)
    model = lambda seed: (torch.manual_seed(seed), create_actor_critic(cfg, env.observation_space,  # noqa: E731
                                                                        env.action_space))[1]
    ranks = []
    for r in (0, 1):
        world = World(rank=r, world_size=2, master_addr="127.0.0.1", master_port=port)
        state = SharedState(1, 1, P, (), 8)
        weights = [SharedWeights(model(0)) for _ in range(P)]
        for p in world.policies(P):  # each rank's learners publish its own policies (their own weights)
            weights[p].publish(model(100 + p), 7 + p)
            state.learner[p, ENV_STEPS] = 100
        stats = RunStats(tmp_path / f"rank{r}", 10, 1, num_policies=P)
        control = PopulationControl(cfg, tmp_path, {}) if r == 0 else None
        fill_shared(state, control.hyperparams() if control else [dict.fromkeys(HYPERPARAMS, 0.5)] * P)
        link = PopulationLink(world, P, weights, lambda: model(0), 10, state, control)  # (rank 0 first: rank 1 waits)
        ranks.append((world, state, weights, stats, control, link))
    # before any process starts, rank 1 holds rank 0's hyperparameters for every policy (decision batch 1)
    assert ranks[1][1].hyperparams.tolist() == ranks[0][1].hyperparams.tolist() != [[0.5] * len(HYPERPARAMS)] * P
    assert ranks[1][5].hyper == ranks[0][4].hyperparams()
    # policy 1 (rank 1) the best, policy 0 (rank 0) the worst: with a quarter replaced, 0 copies 1
    for world, state, weights, stats, control, link in ranks:
        stats.add_episodes([{"policy": p, "reward": {0: -5.0, 1: 9.0, 2: 1.0, 3: 2.0}[p]} for p in world.policies(P)])

    def step_all():
        for world, state, weights, stats, control, link in reversed(ranks):  # rank 1 sends its figures first
            link.last = 0.0  # (no wait for PERIOD_SEC)
            link.step(state, stats, control)

    step_all()  # rank 1's figures; rank 0 decides, both apply
    decided = json.loads(server.get("sf/pop/0/decisions/2"))
    assert [0, 1] in decided["copies"], decided
    step_all()  # rank 1 serves policy 1's weights
    step_all()  # rank 0 receives them
    (_, state0, weights0, _, _, link0), (_, state1, weights1, _, _, _) = ranks
    assert int(state0.copy_requests[0, COPIES_REQUESTED]) == 1 and int(state0.replace_from[0]) == 1
    assert int(state1.copy_requests[0, COPIES_REQUESTED]) == 0  # (policy 0 is not rank 1's)
    assert weights0[1].version == weights1[1].version == 8
    for k, v in weights1[1].tensors.items():
        assert torch.equal(weights0[1].tensors[k], v), k
    assert not server.check(["sf/pop/0/weights/2/0"])  # read once, then deleted
    # every rank holds rank 0's hyperparameters for every policy (its own read them from its SharedState)
    for _, state, _, _, _, _ in ranks:
        assert state.hyperparams.tolist() == ranks[0][1].hyperparams.tolist()
    assert not link0.broken


def test_an_unreachable_store_ends_the_exchange_with_one_warning(tmp_path, monkeypatch, caplog):
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    world = World(rank=1, world_size=2, master_addr="127.0.0.1", master_port=port)
    link = PopulationLink(world, 2, [], lambda: None, timeout_sec=2)
    del server  # (rank 0's machine gone)
    state, stats = SharedState(1, 1, 2, (), 8), RunStats(tmp_path, 10, 1, num_policies=2)
    with caplog.at_level("WARNING", logger="sf"):
        for _ in range(3):
            link.last = 0.0
            link.step(state, stats, None)
    assert link.broken
    warned = [r.getMessage() for r in caplog.records if "PBT across ranks" in r.getMessage()]
    assert len(warned) == 1 and "cannot be reached" in warned[0], warned




def test_a_rank_that_never_gets_rank_0s_hyperparameters_stops_in_one_line(tmp_path, monkeypatch):
    """Rank 1 waits --distributed_timeout_sec for decision batch 1 (rank 0's hyperparameters) before its processes
    start; past it, a RunError naming the flag, not a failure to allocate shared memory."""
    from sf.cfg import RunError
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True)  # noqa: F841 (rank 0 never publishes)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    world = World(rank=1, world_size=2, master_addr="127.0.0.1", master_port=port)
    with pytest.raises(RunError, match=r"rank 1: rank 0 did not publish the population's hyperparameters within 1 s "
                                       r"\(--distributed_timeout_sec\)"):
        PopulationLink(world, 2, [], lambda: None, 1, SharedState(1, 1, 2, (), 8), None)
