"""sf.distributed with real processes: 2 ranks on gloo over 127.0.0.1 (spawned; no mocks).

Each rank writes what it saw to a file in tmp_path (torch.save) that the test reads after both exit; a rank's
exception is written there too, so a failure shows the rank's traceback.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import time
import traceback

import pytest
import torch
from gymnasium import spaces

from model_test_helpers import VECTOR_OBS, make_cfg, random_experience
from sf.distributed import GradientAllReduce, World, check_identical_weights, init_learner_group, world_from_env
from sf.learning.appo import APPO
from sf.learning.checkpoint import weights_sha256
from sf.model.actor_critic import create_actor_critic

SMALL = dict(rnn_size=16, hidden_size=16, encoder_mlp_layers=[32, 32])
B, T = 4, 8  # trajectories per rank and step, steps per trajectory
ACTIONS = spaces.Discrete(3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def world(rank: int, port: int) -> World:
    return World(rank=rank, world_size=2, local_rank=rank, local_world_size=2, master_addr="127.0.0.1", master_port=port)


def setup(n_traj: int, **overrides):
    """The same cfg, model and batch of `n_traj` trajectories in every process (same seeds). Input normalization is
    off: its statistics come from each rank's own batch, which gradients do not synchronize (module docstring)."""
    torch.manual_seed(0)
    kw = dict(SMALL, rollout=T, recurrence=T, batch_size=B * T, normalize_input=False)
    kw.update(overrides)
    cfg = make_cfg(**kw)
    model = create_actor_critic(cfg, VECTOR_OBS, ACTIONS)
    # policy_versions 0 and every train() call at its version: lag <= steps done, far below max_policy_lag, so
    # every sample is valid on every rank (equal valid counts: averaged gradients = union-batch gradient)
    exp = random_experience(model, VECTOR_OBS, ACTIONS, n_traj, T, done_prob=0.1, seed=1)
    return cfg, model, exp


def trajectories(exp: dict, start: int, stop: int) -> dict:
    return {k: trajectories(v, start, stop) if isinstance(v, dict) else v[start:stop].clone() for k, v in exp.items()}


def flat_grads(params) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel()) for p in params])


def run_ranks(target, tmp_path, args=(), timeout: float = 60.0) -> list:
    """Start ranks 0 and 1 as spawned processes running `target(rank, port, tmp_path, *args)`; wait for both (at
    most `timeout` s, then kill: a safety net, far above the normal few seconds, as a busy shared machine can slow
    niced tests ten-fold); return their exit codes."""
    ctx = mp.get_context("spawn")
    port = free_port()
    ready = ctx.Barrier(2)
    procs = [ctx.Process(target=_rank_main, args=(target, rank, port, str(tmp_path), ready, *args)) for rank in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return [p.exitcode for p in procs]


def _rank_main(target, rank, port, out_dir, ready, *args):
    torch.set_num_threads(1)
    try:
        # both ranks imported (seconds, uneven on a busy machine): the rendezvous, bounded by the group's short
        # timeout in the failure tests, does not wait for an import
        ready.wait(timeout=60)
        target(rank, port, out_dir, *args)
    except BaseException:
        with open(os.path.join(out_dir, f"error{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    # exit as a learner process does (multiprocessing ends its children with os._exit): no process group teardown,
    # which on a busy machine could abort a rank whose peer had already torn down ("terminate called without an active
    # exception", SIGABRT) after every result was written
    os._exit(0)


def load_results(tmp_path, n: int = 2) -> list:
    errors = [(tmp_path / f"error{r}.txt") for r in range(n)]
    msgs = [f"rank {r}:\n{e.read_text()}" for r, e in enumerate(errors) if e.exists()]
    assert not msgs, "\n".join(msgs)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(n)]


# --- one SGD step: 2 ranks on halves = 1 process on the whole batch -----------------------------------------

ORACLE = dict(max_grad_norm=0.05, normalize_advantage=False, learning_rate=1e-3)


def _one_step_rank(rank, port, out_dir):
    init_learner_group(world(rank, port), "cpu", timeout_sec=60)
    cfg, model, exp = setup(2 * B, **ORACLE)
    hook = GradientAllReduce(model.parameters())
    appo = APPO(model, cfg, "cpu", grad_hook=hook)
    stats = appo.train(trajectories(exp, rank * B, (rank + 1) * B), policy_version=0)
    torch.save({"sha": weights_sha256(model), "state": model.state_dict(), "grad": flat_grads(appo.params),
                "grad_norm": stats[0]["grad_norm"], "calls": hook.calls, "identical": check_identical_weights(model)},
               os.path.join(out_dir, f"rank{rank}.pt"))


def test_two_ranks_on_halves_match_one_process_on_the_whole_batch(tmp_path):
    """One SGD step: the 2 ranks end bitwise identical, and equal (float tolerance) to one process trained on the
    union batch without the hook; clipping saw the averaged gradient (the same norm as the union batch's, not the
    rank's own half's), so the clipped gradients match too."""
    codes = run_ranks(_one_step_rank, tmp_path)
    r0, r1 = load_results(tmp_path)
    assert codes == [0, 0]
    assert r0["sha"] == r1["sha"] and r0["identical"] and r1["identical"]
    assert torch.equal(r0["grad"], r1["grad"]) and r0["calls"] == r1["calls"] == 1

    cfg, model, exp = setup(2 * B, **ORACLE)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    single = APPO(model, cfg, "cpu")
    stats = single.train(exp, policy_version=0)
    # the norm before clipping is the union batch's; clipping was active (norm > max_grad_norm): the clipped
    # gradients are the union batch's clipped gradients
    assert stats[0]["grad_norm"] > 2 * cfg.max_grad_norm
    assert r0["grad_norm"] == pytest.approx(stats[0]["grad_norm"], rel=1e-5)
    torch.testing.assert_close(r0["grad"], flat_grads(single.params), rtol=1e-4, atol=1e-7)
    cfg_h, model_h, exp_h = setup(2 * B, **ORACLE)  # a rank's own half, without the hook: another norm
    own = APPO(model_h, cfg_h, "cpu").train(trajectories(exp_h, 0, B), policy_version=0)
    assert abs(own[0]["grad_norm"] - stats[0]["grad_norm"]) > 1e-3 * stats[0]["grad_norm"]

    for k, v in model.state_dict().items():
        moved = (v - before[k]).abs().max()
        scale = max(float(before[k].abs().max()), 1.0)
        assert (r0["state"][k] - v).abs().max() <= 1e-6 * scale, k
        if k.endswith("weight"):
            assert moved > 1e-4, k  # the step did move the weights (Adam: ~lr per entry)


# --- several steps: the ranks stay bitwise identical --------------------------------------------------------

STEPS = 3


def _steps_rank(rank, port, out_dir):
    init_learner_group(world(rank, port), "cpu", timeout_sec=60)
    cfg, model, exp = setup(2 * B * STEPS)  # default loss: advantage normalization, clipping at 4.0
    appo = APPO(model, cfg, "cpu", grad_hook=GradientAllReduce(model.parameters()))
    shas, identical = [], []
    for step in range(STEPS):  # step s: rank r trains on chunk 2 s + r
        chunk = 2 * step + rank
        stats = appo.train(trajectories(exp, chunk * B, (chunk + 1) * B), policy_version=step)
        assert stats[0]["policy_version"] == step + 1
        shas.append(weights_sha256(model))
        identical.append(check_identical_weights(model))
    if rank == 1:  # a rank that drifts is seen by both
        with torch.no_grad():
            next(model.parameters()).view(-1)[0] += 1e-6
    identical.append(check_identical_weights(model))
    torch.save({"shas": shas, "identical": identical}, os.path.join(out_dir, f"rank{rank}.pt"))


def test_ranks_stay_bitwise_identical_over_several_steps(tmp_path):
    codes = run_ranks(_steps_rank, tmp_path)
    r0, r1 = load_results(tmp_path)
    assert codes == [0, 0]
    assert r0["shas"] == r1["shas"]
    assert len(set(r0["shas"])) == STEPS  # every step changed the weights
    assert r0["identical"] == r1["identical"] == [True] * STEPS + [False]


# --- one rank: no process group, the hook does nothing ------------------------------------------------------

def test_world_of_one_rank_is_a_no_op():
    assert not torch.distributed.is_initialized()
    cfg, model, exp = setup(B)
    hook = GradientAllReduce(model.parameters())
    assert hook.world_size == 1 and hook.buffer is None and hook.nbytes == 0
    init_learner_group(World(), "cpu", timeout_sec=1)  # nothing to join
    assert not torch.distributed.is_initialized()
    seen = []
    appo = APPO(model, cfg, "cpu", grad_hook=lambda: (hook(), seen.append(flat_grads(model.parameters()).clone())))
    stats = appo.train(exp, policy_version=0)
    assert hook.calls == 0 and len(seen) == 1
    torch.testing.assert_close(seen[0], flat_grads(appo.params), rtol=0, atol=0)  # no clipping at this norm
    assert stats[0]["grad_norm"] < cfg.max_grad_norm

    cfg2, model2, _ = setup(B)  # the same step without a hook: the same weights, bit for bit
    APPO(model2, cfg2, "cpu").train(exp, policy_version=0)
    assert weights_sha256(model2) == weights_sha256(model)
    assert check_identical_weights(model)


def test_parameters_without_gradient_stay_none_only_if_none_on_every_rank(tmp_path):
    codes = run_ranks(_partial_grads_rank, tmp_path)
    r0, r1 = load_results(tmp_path)
    assert codes == [0, 0]
    for r in (r0, r1):
        assert r["grads"][0] is None  # no gradient on any rank
        assert torch.equal(r["grads"][1], torch.full((3,), 1.0))  # rank 0 only: (2 + 0) / 2
        assert torch.equal(r["grads"][2], torch.full((2,), 2.0))  # (1 + 3) / 2


def _partial_grads_rank(rank, port, out_dir):
    init_learner_group(world(rank, port), "cpu", timeout_sec=60)
    params = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    hook = GradientAllReduce(params)
    if rank == 0:
        params[1].grad = torch.full((3,), 2.0)
    params[2].grad = torch.full((2,), 1.0 + 2 * rank)
    hook()
    torch.save({"grads": [p.grad for p in params]}, os.path.join(out_dir, f"rank{rank}.pt"))


# --- failures: a peer that dies or hangs makes the all-reduce raise, never hang ---------------------------------

TIMEOUT = 4.0  # the group's timeout (seconds): bounds every collective with gloo


def _failing_rank(rank, port, out_dir, victim, how):
    init_learner_group(world(rank, port), "cpu", timeout_sec=TIMEOUT)
    params = [torch.nn.Parameter(torch.zeros(1000))]
    hook = GradientAllReduce(params)
    params[0].grad = torch.ones(1000)
    hook()  # both ranks alive: fine
    if rank == victim:
        if how == "exits":
            os._exit(3)
        if how == "killed_while_peer_waits":
            time.sleep(1.0)  # the survivor is already blocked in the all-reduce
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(TIMEOUT + 3)  # "hangs": alive, sockets open, not in the all-reduce until the peer gave up
        os._exit(0)
    start = time.monotonic()
    try:
        hook()
        outcome = "returned"
    except RuntimeError as e:
        outcome = str(e)
    torch.save({"outcome": outcome, "seconds": time.monotonic() - start}, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.parametrize("victim,how", [(0, "exits"), (1, "killed_while_peer_waits"), (1, "hangs")])
def test_a_peer_that_dies_or_hangs_makes_the_all_reduce_raise(tmp_path, victim, how):
    """A dead peer (exited or SIGKILLed: its sockets close; rank 0 hosts the rendezvous store, which the
    all-reduce no longer needs) is seen at once (connection closed or reset by peer); a live but stuck one after the
    group's timeout. Either way a one-line RuntimeError, not a hang."""
    codes = run_ranks(_failing_rank, tmp_path, args=(victim, how))
    survivor = 1 - victim
    assert codes[survivor] == 0, (codes, (tmp_path / f"error{survivor}.txt").read_text())
    result = torch.load(tmp_path / f"rank{survivor}.pt")
    assert result["outcome"].startswith(f"gradient all-reduce failed on rank {survivor}/2"), result
    assert "\n" not in result["outcome"]
    if how == "hangs":
        assert "Timed out" in result["outcome"]
        assert TIMEOUT - 0.5 < result["seconds"] < TIMEOUT + 10
    else:
        # its kernel closed the sockets: FIN ("Connection closed by peer") or, with unread data, RST ("reset")
        assert "closed by peer" in result["outcome"] or "reset by peer" in result["outcome"], result
        assert result["seconds"] < 3.0 + (1.0 if how == "killed_while_peer_waits" else 0.0)


# --- rendezvous ------------------------------------------------------------------------------------------------

def test_world_from_env():
    assert world_from_env({}) == World() and not World().distributed
    w = world_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29501"})
    assert w == World(3, 4, 1, 2, "10.0.0.7", 29501) and w.distributed
    assert world_from_env({"RANK": "0", "WORLD_SIZE": "1"}) == World()
    for bad, words in [({"RANK": "1"}, "WORLD_SIZE is not"), ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'"),
                       ({"RANK": "2", "WORLD_SIZE": "2"}, "0 <= RANK"),
                       ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2"),
                       ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "MASTER_PORT")]:
        with pytest.raises(ValueError, match=words):
            world_from_env(bad)


def test_unreachable_master_is_a_one_line_error_within_the_timeout(monkeypatch):
    """Rank 1 of 2 with nobody listening at MASTER_ADDR:MASTER_PORT: RuntimeError naming them, in bounded time
    (the store client retries once: up to about twice the timeout)."""
    for var in ("MASTER_ADDR", "MASTER_PORT"):  # init_learner_group writes them (env://): restored afterwards
        monkeypatch.delenv(var, raising=False)
    port = free_port()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=f"MASTER_ADDR:MASTER_PORT 127.0.0.1:{port} within 2 s") as e:
        init_learner_group(world(1, port), "cpu", timeout_sec=2)
    assert time.monotonic() - start < 15
    assert "\n" not in str(e.value)
    assert not torch.distributed.is_initialized()
