"""sf.learning.collectives (and sf.processes.ranks) with real processes: 2 ranks on gloo over 127.0.0.1 (spawned; no
mocks).

Each rank writes what it saw to a file in tmp_path (torch.save) that the test reads after both exit; a rank's
exception is written there too, so a failure shows the rank's traceback.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import time
import traceback

import pytest
import torch
from gymnasium import spaces

from e2e_helpers import free_port
from model_test_helpers import VECTOR_OBS, make_cfg, random_experience
from sf.learning import collectives
from sf.learning.collectives import (GradientAllReduce, check_identical_weights, collective_device, init_learner_group,
                                     share_normalizer_statistics)
from sf.processes.ranks import World, world_from_env
from sf.learning.appo import APPO
from sf.learning.checkpoint import weights_sha256
from sf.model.actor_critic import create_actor_critic

SMALL = dict(rnn_size=16, hidden_size=16, encoder_mlp_layers=[32, 32])
B, T = 4, 8  # trajectories per rank and step, steps per trajectory
ACTIONS = spaces.Discrete(3)


def world(rank: int, port: int) -> World:
    return World(rank=rank, world_size=2, local_rank=rank, local_world_size=2, master_addr="127.0.0.1",
                 master_port=port)


def setup(n_traj: int, **overrides):
    """The same cfg, model and batch of `n_traj` trajectories in every process (same seeds). Input normalization is
    off unless asked for (a rank's model then merges every rank's batch moments: share_normalizer_statistics)."""
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
    procs = [ctx.Process(target=_rank_main, args=(target, rank, port, str(tmp_path), ready, *args))
             for rank in range(2)]
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


def _one_step_rank(rank, port, out_dir, oracle):
    init_learner_group(world(rank, port), "cpu", timeout_sec=60)
    cfg, model, exp = setup(2 * B, **oracle)
    share_normalizer_statistics(model)
    hook = GradientAllReduce(model.parameters())
    appo = APPO(model, cfg, "cpu", grad_hook=hook)
    stats = appo.train(trajectories(exp, rank * B, (rank + 1) * B), policy_version=0)
    torch.save({"sha": weights_sha256(model), "state": model.state_dict(), "grad": flat_grads(appo.params),
                "grad_norm": stats[0]["grad_norm"], "calls": hook.calls, "identical": check_identical_weights(model)},
               os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.e2e
@pytest.mark.parametrize("normalized", [False, True], ids=["raw_inputs", "normalized_inputs_and_returns"])
def test_two_ranks_on_halves_match_one_process_on_the_whole_batch(tmp_path, normalized):
    """One SGD step: the 2 ranks end bitwise identical, and equal (float tolerance) to one process trained on the
    union batch without the hook; clipping saw the averaged gradient (the same norm as the union batch's, not the
    rank's own half's), so the clipped gradients match too. With input and returns normalization, the first forward
    already normalizes with the union batch's statistics (each rank's own half's would give other gradients)."""
    oracle = dict(ORACLE, normalize_input=True, normalize_returns=True) if normalized else ORACLE
    codes = run_ranks(_one_step_rank, tmp_path, args=(oracle,))
    r0, r1 = load_results(tmp_path)
    assert codes == [0, 0]
    assert r0["sha"] == r1["sha"] and r0["identical"] and r1["identical"]
    assert torch.equal(r0["grad"], r1["grad"]) and r0["calls"] == r1["calls"] == 1

    cfg, model, exp = setup(2 * B, **oracle)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    single = APPO(model, cfg, "cpu")
    stats = single.train(exp, policy_version=0)
    # the norm before clipping is the union batch's; clipping was active (norm > max_grad_norm): the clipped
    # gradients are the union batch's clipped gradients
    assert stats[0]["grad_norm"] > 2 * cfg.max_grad_norm
    assert r0["grad_norm"] == pytest.approx(stats[0]["grad_norm"], rel=1e-5)
    torch.testing.assert_close(r0["grad"], flat_grads(single.params), rtol=1e-4, atol=1e-7)
    if normalized:
        assert float(r0["state"]["encoder.obs_normalizer.count"]) == 2 * B * T  # the union batch's samples
    cfg_h, model_h, exp_h = setup(2 * B, **oracle)  # a rank's own half, without the hook: another norm
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
    # default loss: advantage normalization, clipping at 4.0; normalizers merged across the ranks, never broadcast
    cfg, model, exp = setup(2 * B * STEPS, normalize_input=True, normalize_returns=True)
    share_normalizer_statistics(model)
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


@pytest.mark.e2e
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


@pytest.mark.e2e
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
    params = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(3)),
              torch.nn.Parameter(torch.zeros(2))]
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
    outcome, seconds = timed_outcome(hook)
    torch.save({"outcome": outcome, "seconds": seconds}, os.path.join(out_dir, f"rank{rank}.pt"))


def timed_outcome(fn) -> tuple[str, float]:
    """fn() called: ("returned", or the first RuntimeError's text (DistributedError is one), its seconds)."""
    start = time.monotonic()
    try:
        fn()
        outcome = "returned"
    except RuntimeError as e:
        outcome = str(e)
    return outcome, time.monotonic() - start


@pytest.mark.e2e
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


# --- devices: every collective's tensors on the group's device --------------------------------------------------

def test_collective_device_per_backend():
    """NCCL takes CUDA tensors only (this rank's GPU: the current device, which init_learner_group sets), gloo CPU
    ones; a CPU tensor handed to NCCL made the learners' first agreement raise at start-up on CUDA."""
    assert collective_device("nccl") == torch.device("cuda")
    assert collective_device("gloo") == torch.device("cpu")
    assert collective_device("mpi") == torch.device("cpu")


COLLECTIVES = ("all_reduce", "all_gather", "broadcast")


def _devices_rank(rank, port, out_dir):
    """Every collective of sf.learning.collectives, with torch.distributed's collectives wrapped to record the devices
    and dtypes of the tensors they were given (the real collectives run)."""
    import torch.distributed as dist
    init_learner_group(world(rank, port), "cpu", timeout_sec=60)
    seen = []
    for name in COLLECTIVES:
        real = getattr(dist, name)

        def spy(tensor, *args, _real=real, _name=name, **kwargs):
            tensors = tensor if isinstance(tensor, list) else [tensor]
            seen.append((_name, {str(t.device) for t in tensors}, str(tensors[0].dtype)))
            return _real(tensor, *args, **kwargs)
        setattr(dist, name, spy)
    big = 2 ** 60  # float64 holds integers exactly only below 2^53
    sums = collectives.agree([big + rank, 1])
    lo, hi = collectives.agree_range([big + rank, 7])
    cfg, model, exp = setup(B, normalize_input=True, normalize_returns=True)
    share_normalizer_statistics(model)
    collectives.broadcast_state(model)
    appo = APPO(model, cfg, "cpu", grad_hook=GradientAllReduce(model.parameters()))
    appo.train(exp, policy_version=0)
    identical = check_identical_weights(model)
    rows = collectives.gather_rows(torch.tensor([rank, 10 + rank]))
    torch.save({"seen": seen, "sums": sums, "lo": lo, "hi": hi, "identical": identical, "rows": rows,
                "backend": dist.get_backend()}, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.e2e
def test_every_collective_uses_the_group_device_and_integers_stay_exact(tmp_path):
    codes = run_ranks(_devices_rank, tmp_path)
    results = load_results(tmp_path)
    assert codes == [0, 0]
    big = 2 ** 60
    for r in results:
        expected = str(collective_device(r["backend"]))
        assert r["backend"] == "gloo" and expected == "cpu"
        assert {name for name, _, _ in r["seen"]} == set(COLLECTIVES)
        assert all(devices == {expected} for _, devices, _ in r["seen"]), r["seen"]
        assert r["sums"] == [2 * big + 1, 2]  # exact: 2^61 + 1 is no float64
        assert (r["lo"], r["hi"]) == ([big, 7], [big + 1, 7])  # a difference of 1 at 2^60 is seen
        assert ("all_reduce", {"cpu"}, "torch.int64") in r["seen"]  # the agreements: integers
        assert r["identical"]
        assert torch.equal(r["rows"], torch.tensor([[0, 10], [1, 11]]))
    assert results[0]["seen"] == results[1]["seen"]  # the same collectives, in the same order, on both ranks


# --- skipped steps: the ranks' normalizers still agree ---------------------------------------------------------

def _skipped_rank(rank, port, out_dir):
    init_learner_group(world(rank, port), "cpu", timeout_sec=60)
    cfg, model, exp = setup(2 * B, normalize_input=True, normalize_returns=True, max_policy_lag=3)
    share_normalizer_statistics(model)
    appo = APPO(model, cfg, "cpu", grad_hook=GradientAllReduce(model.parameters()))
    steps = []
    # every sample was acted 10 versions ago, beyond --max_policy_lag 3: every SGD step is skipped on both ranks
    stats = appo.train(trajectories(exp, rank * B, (rank + 1) * B), policy_version=10,
                       on_sgd_step=lambda version: steps.append(version))
    torch.save({"sha": weights_sha256(model), "state": model.state_dict(), "steps": steps,
                "versions": [s["policy_version"] for s in stats], "identical": check_identical_weights(model)},
               os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.e2e
def test_a_batch_whose_steps_are_all_skipped_leaves_the_ranks_identical(tmp_path):
    """Each rank's input normalizer update comes from its own half of the batch; no SGD step runs (every sample too
    old). The normalizers merged both halves anyway: bitwise identical state_dicts, holding the union batch's
    statistics (those of one process updated with the whole batch)."""
    codes = run_ranks(_skipped_rank, tmp_path)
    r0, r1 = load_results(tmp_path)
    assert codes == [0, 0]
    assert r0["steps"] == r1["steps"] == [] and set(r0["versions"]) == {10.0}  # no step, no new version
    assert r0["sha"] == r1["sha"] and r0["identical"] and r1["identical"]
    _, model, exp = setup(2 * B, normalize_input=True)
    union = model.encoder.obs_normalizer
    union.update(exp["obs"]["obs"][:, :T])
    for k in ("mean", "var", "count"):
        torch.testing.assert_close(r0["state"][f"encoder.obs_normalizer.{k}"], getattr(union, k), rtol=1e-6, atol=1e-6)
    assert float(union.count) == 2 * B * T


# --- learners of 2 ranks: an exact version check at start, rank 1 reads its checkpoints without writing -----------

VERSION = 2 ** 30  # versions whose squares float64 cannot tell apart from their neighbours'
CORRIDOR = ["--env", "test_corridor", "--num_workers", "1", "--num_envs_per_worker", "2", "--rollout", "8",
            "--recurrence", "8", "--batch_size", "16", "--rnn_size", "16", "--hidden_size", "16", "--device", "cpu",
            "--seed", "3", "--distributed_timeout_sec", "60"]


def learner_inputs(train_dir: str):
    """cfg, spaces, model and what a Learner is built on (buffers, shared weights and state, queues): test_corridor."""
    from types import SimpleNamespace

    from sf.buffers.shared_weights import SharedWeights
    from sf.buffers.trajectory_buffers import TrajectoryBuffers
    from sf.cfg import parse_cfg
    from sf.ipc import Queue
    from sf.processes.shared_state import SharedState
    from sf_envs.registry import make_env
    cfg = parse_cfg([*CORRIDOR, "--experiment", "ddp", "--train_dir", str(train_dir)])
    env = make_env(cfg, 0)
    obs_space, action_space = env.observation_space, env.action_space
    env.close()
    model = create_actor_critic(cfg, obs_space, action_space)
    buffers = TrajectoryBuffers(4, cfg.rollout, obs_space, action_space, model.rnn_state_size)
    queues = SimpleNamespace(learner=Queue(), free=Queue(), report=Queue(max_size_bytes=2**22))
    return cfg, obs_space, action_space, model, buffers, SharedWeights(model), SharedState(1, num_slots=4), queues


def write_checkpoints(exp_dir, version: int) -> None:
    """A good checkpoint of `version` in exp_dir and, newer by its name, a file that fails verification."""
    from sf.learning.checkpoint import make_checkpoint_state
    from sf.learning.checkpoint_store import CheckpointManager
    from sf.learning.learner import checkpoint_meta
    cfg, obs_space, action_space, model, *_, queues = learner_inputs(exp_dir.parent)
    for q in vars(queues).values():
        q.close()
    appo = APPO(model, cfg, "cpu")
    state = make_checkpoint_state(model, appo.optimizer, version, 4096, checkpoint_meta(cfg, obs_space, action_space,
                                                                                       model))
    manager = CheckpointManager(exp_dir)
    manager.save(state, version, 4096)
    (manager.dir / f"checkpoint_{version + 5:09d}_8192.pth").write_bytes(b"not a checkpoint")


def snapshot(directory) -> dict:
    """Every path under `directory` -> its bytes (None for a directory)."""
    return {str(p.relative_to(directory)): (None if p.is_dir() else p.read_bytes()) for p in directory.rglob("*")}


def _learner_rank(rank, port, out_dir, exp_dirs):
    from sf.learning.learner import Learner
    exp_dir = exp_dirs[rank]
    cfg, obs_space, action_space, _, buffers, weights, state, queues = learner_inputs(os.path.dirname(exp_dir))
    try:
        learner = Learner(cfg, obs_space, action_space, buffers, queues, weights, state, "cpu", exp_dir, frameskip=1,
                          world=world(rank, port))
        result = {"version": learner.version, "identical": check_identical_weights(learner.model)}
    except collectives.DistributedError as e:
        result = {"error": str(e)}
    for q in vars(queues).values():
        q.close()
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.e2e
@pytest.mark.parametrize("rank1_files", ["same", "other_version", "none"])
def test_every_rank_resumes_from_rank_0s_checkpoint_sent_to_it_and_rank_1_reads_and_writes_nothing(tmp_path,
                                                                                                   rank1_files):
    """Rank 0 resumes from its experiment directory (a good checkpoint of version 2^30 and a newer file that fails
    verification: moved to rejected/) and sends the checkpoint's state to rank 1 through the process group. Rank 1 never
    reads its own directory, whatever it holds (the same files, a checkpoint of version 2^30 + 1, nothing: no shared
    filesystem), and leaves it byte for byte as it was: both ranks start at rank 0's version with identical weights."""
    exp_dirs = [tmp_path / f"rank{r}" / "ddp" for r in range(2)]
    write_checkpoints(exp_dirs[0], VERSION)
    if rank1_files != "none":
        write_checkpoints(exp_dirs[1], VERSION if rank1_files == "same" else VERSION + 1)
    else:
        exp_dirs[1].mkdir(parents=True)
    before = snapshot(exp_dirs[1])
    codes = run_ranks(_learner_rank, tmp_path, args=([str(d) for d in exp_dirs],))
    r0, r1 = load_results(tmp_path)
    assert codes == [0, 0]
    assert snapshot(exp_dirs[1]) == before  # rank 1: nothing read into it, moved, written or deleted
    assert [p.name for p in (exp_dirs[0] / "checkpoint_p0" / "rejected").iterdir()] == [
        f"checkpoint_{VERSION + 5:09d}_8192.pth"]  # rank 0 did move it aside
    assert r0 == r1 == {"version": VERSION, "identical": True}

def _broadcast_object_rank(rank, port, out_dir):
    init_learner_group(world(rank, port), "cpu", timeout_sec=60)
    mine = {"w": torch.arange(5, dtype=torch.float64) * (rank + 1), "n": torch.tensor([2**40 + rank]),
            "nested": {"name": f"rank {rank}", "none": None}} if rank == 0 else "rank 1's own, never sent"
    got = [collectives.broadcast_object(mine), collectives.broadcast_object(None if rank == 0 else "ignored")]
    torch.save(got, os.path.join(out_dir, f"rank{rank}.pt"))


def test_broadcast_object_sends_rank_0s_state_to_every_rank(tmp_path):
    """A checkpoint-like state (tensors of several dtypes, nested values) and None: every rank ends with rank 0's."""
    assert run_ranks(_broadcast_object_rank, tmp_path) == [0, 0]
    r0, r1 = load_results(tmp_path)
    for got in (r0, r1):
        assert torch.equal(got[0]["w"], torch.arange(5, dtype=torch.float64)) and got[0]["w"].dtype == torch.float64
        assert got[0]["n"].tolist() == [2**40] and got[0]["nested"] == {"name": "rank 0", "none": None}
        assert got[1] is None


def test_a_population_is_placed_policy_p_on_rank_p_mod_world_size_and_one_policy_is_data_parallel():
    from sf.processes.ranks import World
    assert [World(rank=r, world_size=3).policies(7) for r in range(3)] == [[0, 3, 6], [1, 4], [2, 5]]
    assert World(rank=1, world_size=2).policies(1) == [0] and World().policies(4) == [0, 1, 2, 3]
    assert World(rank=1, world_size=2).data_parallel(1) and not World(rank=1, world_size=2).data_parallel(4)
    assert not World().data_parallel(1)


@pytest.mark.parametrize("flags, needle", [
    (["--num_policies", "3"], "--num_policies 3: a population under torchrun places policy p on rank p mod 4; give at "
                              "least one policy per rank (4)"),
    (["--num_policies", "4", "--with_pbt", "True"], "--with_pbt: population-based training across ranks talks "
                                                    "through torchrun's store (TORCHELASTIC_USE_AGENT_STORE=True"),
    (["--sync_mode", "hts"], "--sync_mode hts: runs under torchrun train asynchronously"),
])
def test_what_torchrun_runs_cannot_place_is_one_line(tmp_path, monkeypatch, flags, needle):
    from sf.cfg import ConfigError, parse_cfg
    from sf.runner.startup.preflight import data_parallel_world
    for k, v in dict(RANK="1", WORLD_SIZE="4", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)  # (a launcher other than torchrun)
    cfg = parse_cfg(["--env", "test_corridor", "--train_dir", str(tmp_path), *flags])
    with pytest.raises(ConfigError, match=re.escape(needle)):
        data_parallel_world(cfg)
    cfg = parse_cfg(["--env", "test_corridor", "--train_dir", str(tmp_path), "--num_policies", "6"])
    assert data_parallel_world(cfg)[1].policies(6) == [1, 5]


def test_a_new_population_run_past_rank_0_refuses_its_machines_old_checkpoints(tmp_path):
    """Rank 1 of 2, policies 1 and 3: rank 0 moves or deletes only its own machine's experiment directory, so a new run
    (--restart_behavior restart or overwrite) that finds an earlier run's checkpoint of policy 3 on this machine is
    refused in one line naming it; resumed, it is this rank's to resume from; rank 0 and data-parallel ranks: no
    check."""
    from sf.cfg import ConfigError, parse_cfg
    from sf.processes.ranks import World
    from sf.runner.startup.preflight import check_rank_directory
    exp = tmp_path / "pop"
    (exp / "checkpoint_p3").mkdir(parents=True)
    (exp / "checkpoint_p3" / "checkpoint_000000004_512.pth").write_bytes(b"x")
    (exp / "checkpoint_p0").mkdir()
    (exp / "checkpoint_p0" / "checkpoint_000000004_512.pth").write_bytes(b"x")  # (rank 0's policy: not this rank's)
    cfg = lambda *flags: parse_cfg(["--env", "test_corridor", "--train_dir", str(tmp_path),  # noqa: E731
                                    "--experiment", "pop", "--num_policies", "4", *flags])
    with pytest.raises(ConfigError, match=re.escape(f"--restart_behavior restart: {exp} on rank 1's machine holds "
                                                    "checkpoints of policies 3 from an earlier run")):
        check_rank_directory(cfg("--restart_behavior", "restart"), World(rank=1, world_size=2), exp)
    check_rank_directory(cfg("--restart_behavior", "resume"), World(rank=1, world_size=2), exp)
    check_rank_directory(cfg("--restart_behavior", "overwrite"), World(rank=0, world_size=2), exp)
    check_rank_directory(cfg("--restart_behavior", "overwrite", "--num_policies", "1"),
                         World(rank=1, world_size=2), exp)
