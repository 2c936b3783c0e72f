"""The CUDA paths, for real, where a GPU exists (tests/gpu/conftest.py skips them, with the reason, elsewhere):
collectives on an NCCL group, data-parallel learners on one GPU (gloo through host memory) and on two (torchrun, NCCL),
--sync_mode hts bit for bit on CUDA, weights published to another process through CUDA shared memory, and a short
doom_basic run. Each reuses the CPU tests' helpers (tests/learning/test_distributed.py, tests/runner/...)."""
import multiprocessing as mp
import os
import re
import time

import pytest
import torch
import torch.multiprocessing  # noqa: F401  (CUDA tensors pickled to a spawned process travel as CUDA IPC handles)

import test_distributed as dp  # tests/learning/test_distributed.py
from sf.learning import collectives
from sf.learning.collectives import (GradientAllReduce, check_identical_weights, init_learner_group,
                                     share_normalizer_statistics)
from sf.learning.appo import APPO
from sf.learning.checkpoint import weights_sha256

pytestmark = pytest.mark.gpu


def on_gpu(experience: dict) -> dict:
    return {k: on_gpu(v) if isinstance(v, dict) else v.cuda() for k, v in experience.items()}


# --- collectives on NCCL: every tensor on the GPU -------------------------------------------------------------------

def _nccl_one_rank(rank, port, out_dir):
    """A one-rank NCCL group (init_learner_group forms none for one rank: formed here as it does it): NCCL refuses the
    CPU tensors the learners' agreement used to hand it, which stopped every data-parallel CUDA run at start-up."""
    import datetime

    import torch.distributed as dist
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method="env://", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", 0))
    big = 2 ** 60
    cfg, model, exp = dp.setup(dp.B, normalize_input=True, normalize_returns=True)
    model.cuda()
    share_normalizer_statistics(model)
    before = weights_sha256(model)
    collectives.broadcast_state(model)
    after_broadcast = weights_sha256(model)
    appo = APPO(model, cfg, "cuda")
    stats = appo.train(on_gpu(exp), policy_version=0)
    result = {"backend": dist.get_backend(), "device": str(collectives.collective_device(dist.get_backend())),
              "sums": collectives.agree([big, 1]), "range": collectives.agree_range([big + 1, 7]),
              "rows": collectives.gather_rows(torch.tensor([3.0, 4.0], device="cuda")).cpu(),
              "broadcast_kept": before == after_broadcast, "steps": len(stats),
              "count": float(model.encoder.obs_normalizer.count)}
    try:  # what the learners' agreement did before it went through collective_device
        dist.all_reduce(torch.zeros(3, dtype=torch.float64))
        result["cpu_refused"] = False
    except Exception:  # noqa: BLE001 - NCCL's words vary with the version
        result["cpu_refused"] = True
    torch.save(result, os.path.join(out_dir, "rank0.pt"))


@pytest.mark.e2e
def test_collectives_on_an_nccl_group_take_cuda_tensors(tmp_path):
    ctx = mp.get_context("spawn")
    ready = ctx.Barrier(1)  # named: an unnamed Barrier in args is gone before the spawned child rebuilds it (ENOENT)
    p = ctx.Process(target=dp._rank_main, args=(_nccl_one_rank, 0, dp.free_port(), str(tmp_path), ready))
    p.start()
    p.join(120)
    if p.is_alive():
        p.kill()
    (r,) = dp.load_results(tmp_path, n=1)
    assert p.exitcode == 0
    assert r["backend"] == "nccl" and r["device"] == "cuda" and r["cpu_refused"]
    assert r["sums"] == [2 ** 60, 1] and r["range"] == ([2 ** 60 + 1, 7], [2 ** 60 + 1, 7])
    assert torch.equal(r["rows"], torch.tensor([[3.0, 4.0]])) and r["broadcast_kept"]
    assert r["steps"] >= 1 and r["count"] == dp.B * dp.T  # the normalizer's gather ran on the GPU


# --- 2 data-parallel ranks sharing one GPU (gloo: NCCL refuses two ranks on one GPU) -----------------------------

def _cuda_steps_rank(rank, port, out_dir):
    init_learner_group(dp.world(rank, port), "cpu", timeout_sec=60)  # gloo; the models live on the GPU
    cfg, model, exp = dp.setup(2 * dp.B * dp.STEPS, normalize_input=True, normalize_returns=True)
    model.cuda()
    share_normalizer_statistics(model)
    hook = GradientAllReduce(model.parameters())
    appo = APPO(model, cfg, "cuda", grad_hook=hook)
    shas = []
    for step in range(dp.STEPS):
        chunk = 2 * step + rank
        part = dp.trajectories(exp, chunk * dp.B, (chunk + 1) * dp.B)
        appo.train(on_gpu(part), policy_version=step)
        shas.append(weights_sha256(model))
    torch.save({"shas": shas, "identical": check_identical_weights(model), "buffer": str(hook.buffer.device),
                "params": str(next(model.parameters()).device)}, os.path.join(out_dir, f"rank{rank}.pt"))


def test_two_ranks_on_one_gpu_stay_bitwise_identical(tmp_path):
    """Models on the GPU, the group on gloo: the gradient buffer, broadcasts and normalizer moments go through host
    memory (collective_device("gloo") is the CPU), and the ranks stay bitwise identical step after step."""
    codes = dp.run_ranks(_cuda_steps_rank, tmp_path, timeout=180)
    r0, r1 = dp.load_results(tmp_path)
    assert codes == [0, 0]
    assert r0["shas"] == r1["shas"] and len(set(r0["shas"])) == dp.STEPS
    assert r0["identical"] and r1["identical"]
    assert r0["buffer"] == "cpu" and r0["params"].startswith("cuda")


# --- torchrun: 2 ranks, NCCL, one GPU each ---------------------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.doom
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank (it refuses two ranks on one GPU: "
                                                          "'Duplicate GPU detected'); this machine has fewer than 2")
def test_torchrun_two_ranks_on_nccl_train_doom_basic_to_identical_weights(tmp_path):
    pytest.importorskip("vizdoom")
    from test_distributed_e2e import args, digests, run_to_the_end
    text = run_to_the_end(args(tmp_path, "doom_basic", "--train_for_env_steps", "8000", "--device", "cuda"),
                          tmp_path / "log.txt")
    final = digests(text)
    assert set(final) == {0, 1} and final[0] == final[1], text[-3000:]
    assert re.search(r"\[rank 1\]\[INFO\] Experiment .*device cuda:1", text), text[-3000:]


# --- hts on CUDA: the same seed gives the same weights ---------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.doom
def test_hts_on_cuda_same_seed_same_weights(entry, tmp_path):
    """Two runs: the same digest (deterministic kernels: sf.seeding.deterministic_kernels; an op without a
    deterministic CUDA kernel would stop the run instead)."""
    pytest.importorskip("vizdoom")
    from test_sync_modes import run
    first, out = run(entry, tmp_path, "a", "hts", 5, 2, 4, "--device", "cuda")
    assert "device cuda" in out
    assert run(entry, tmp_path, "b", "hts", 5, 2, 4, "--device", "cuda")[0] == first


@pytest.mark.e2e
@pytest.mark.doom
def test_hts_on_cuda_same_weights_across_layouts(entry, tmp_path):
    """As on CPU: 4 workers x 2 envs train the same weights as 2 x 4 (the policy worker infers in fixed chunks)."""
    pytest.importorskip("vizdoom")
    from test_sync_modes import run
    first, _ = run(entry, tmp_path, "a", "hts", 5, 2, 4, "--device", "cuda")
    assert run(entry, tmp_path, "w4x2", "hts", 5, 4, 2, "--device", "cuda")[0] == first


# --- CUDA shared weights across processes --------------------------------------------------------------------------

def _reader(weights, ready, done, results):
    """Another process: load every version it sees into its own CUDA model; each must be whole (every entry equal to
    the version)."""
    from test_shared_weights import _model
    model = _model(-1.0).cuda()
    have, reads, torn = -1, 0, []
    ready.set()
    while not done.is_set() or weights.version > have:
        version = weights.load_into(model, have)
        if version > have:
            values = {float(p.min()) for p in model.parameters()} | {float(p.max()) for p in model.parameters()}
            if values != {float(version)}:
                torn.append((version, sorted(values)))
            have, reads = version, reads + 1
    results.put((have, reads, torn, str(next(model.parameters()).device)))


@pytest.mark.e2e
def test_cuda_shared_weights_reach_another_process_whole(tmp_path):
    """The learner's side publishes versions 1..N (every entry = the version) into CUDA shared memory while a spawned
    process reads them: every read is one whole version (the sequence lock waits for the asynchronous copies), and the
    last one arrives."""
    from sf.buffers.shared_weights import SharedWeights
    from test_shared_weights import _model
    writer = _model(0.0).cuda()
    weights = SharedWeights(writer, "cuda")
    weights.publish(writer, 0)
    ctx = mp.get_context("spawn")
    ready, done, results = ctx.Event(), ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_reader, args=(weights, ready, done, results))
    reader.start()
    try:
        assert ready.wait(120), "the reader did not start"
        last, deadline = 0, time.monotonic() + 2.0
        while time.monotonic() < deadline:
            last += 1
            with torch.no_grad():
                for p in writer.parameters():
                    p.fill_(float(last))
            weights.publish(writer, last)
            # a publish every ~1 ms, 25x the H100 learner's rate (a step of the paper's model takes 25 ms there): back
            # to back, the sequence lock's reader retries nearly every copy and completed 4 reads in 2 s
            time.sleep(0.001)
        done.set()
        have, reads, torn, device = results.get(timeout=60)
    finally:
        done.set()
        reader.join(30)
        if reader.is_alive():
            reader.kill()
    assert device.startswith("cuda") and all(t.is_cuda for t in weights.tensors.values())
    assert torn == [] and have == last and reads >= 5


# --- a short training run on the GPU --------------------------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.doom
def test_doom_basic_trains_on_cuda(entry, tmp_path):
    pytest.importorskip("vizdoom")
    res = entry("train.py", "--env", "doom_basic", "--experiment", "cuda", "--train_dir", tmp_path, "--device", "cuda",
                "--num_workers", "2", "--num_envs_per_worker", "4", "--train_for_env_steps", "20000", timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "device cuda" in out and re.search(r"Final weights sha256: [0-9a-f]{64}", out), out[-3000:]
    assert list((tmp_path / "cuda" / "checkpoint_p0").glob("checkpoint_*.pth"))
    from sf.utils.trained import check_trained
    ok, why = check_trained(out, tmp_path / "cuda")  # exit 0 with every step skipped on the device would not do
    assert ok, f"the run did not train: {why}"


# --- action sampling from noise on CUDA (hts/ppo), in deterministic mode ----------------------------------------------

def test_noise_sampling_on_cuda_runs_in_deterministic_mode_and_matches_cpu():
    """hts/ppo draw actions by inverse CDF from per-env noise; deterministic mode refuses torch.cumsum on CUDA floats,
    so CUDA sums the probabilities elementwise: it runs, and picks the CPU's actions (but where a noise value lies
    within rounding of a boundary of the cumulative probabilities)."""
    import numpy as np
    from gymnasium import spaces

    from sf.model.action_spaces import action_distribution
    space = spaces.MultiDiscrete([3, 8, 21])
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4096, 32, generator=g)
    noise = torch.rand(4096, 3, generator=g)
    on_cpu = action_distribution(space, logits).sample(noise)
    torch.use_deterministic_algorithms(True)
    try:
        on_gpu = action_distribution(space, logits.cuda()).sample(noise.cuda()).cpu()
        again = action_distribution(space, logits.cuda()).sample(noise.cuda()).cpu()
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(on_gpu, again)
    assert (on_gpu != on_cpu).any(-1).float().mean() < 1e-3
    assert np.array_equal(on_gpu.shape, on_cpu.shape)
