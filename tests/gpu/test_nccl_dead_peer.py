"""A data-parallel learner whose NCCL peer dies still writes its final checkpoint: 2 ranks, NCCL, one GPU each, rank 1
SIGKILLed while rank 0 waits in the gradient all-reduce. Rank 0 must raise DistributedError in its own thread within
--distributed_timeout_sec + NCCL_ABORT_MARGIN_SEC, not be torn down by NCCL's watchdog, and still copy CUDA tensors to
the host (what the learner's `except DistributedError: self.save(final=True)` does). What this depends on without a GPU
(blocking-wait mode, every collective waited for): tests/learning/test_distributed_nccl_config.py. Reuses
tests/learning/test_distributed.py's helpers, as tests/gpu/test_cuda.py does."""
import os
import signal
import time

import pytest
import torch

import test_distributed as dp  # tests/learning/test_distributed.py
from sf.learning.collectives import BLOCKING_WAIT_VARS, NCCL_ABORT_MARGIN_SEC, GradientAllReduce, init_learner_group

pytestmark = pytest.mark.gpu

TIMEOUT = 15.0  # the group's timeout (seconds): also bounds the rendezvous and NCCL's eager communicator set-up
N = 1 << 20  # floats all-reduced: 4 MiB


def _dead_peer_rank(rank, port, out_dir):
    for var in BLOCKING_WAIT_VARS:  # the configuration under test is sf.learning.collectives', not this machine's
        os.environ.pop(var, None)
    init_learner_group(dp.world(rank, port), "cuda", timeout_sec=TIMEOUT)  # cuda:rank
    params = [torch.nn.Parameter(torch.zeros(N, device="cuda"))]
    hook = GradientAllReduce(params)
    params[0].grad = torch.ones(N, device="cuda")
    hook()  # both alive: the communicator works
    weights = torch.arange(1000, dtype=torch.float32, device="cuda")  # stands for the model in the final checkpoint
    if rank == 1:
        time.sleep(2.0)  # rank 0 is in the all-reduce by now, its kernel waiting for this rank
        os.kill(os.getpid(), signal.SIGKILL)
    params[0].grad.fill_(2.0)
    outcome, seconds = dp.timed_outcome(hook)
    path = os.path.join(out_dir, f"rank{rank}.pt")
    result = {"outcome": outcome, "seconds": seconds, "blocking_wait": os.environ.get("TORCH_NCCL_BLOCKING_WAIT")}
    torch.save(result, path)  # first: a copy below that hangs still leaves the outcome to read
    result["grad_kept"] = torch.equal(params[0].grad.cpu(), torch.full((N,), 2.0))  # not half-reduced
    result["copied"] = torch.equal(weights.cpu(), torch.arange(1000, dtype=torch.float32))
    result["computes"] = float((weights * 2).sum()) == 999_000.0  # the GPU still runs new kernels
    torch.save(result, path)


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank (it refuses two ranks on one GPU: "
                                                          "'Duplicate GPU detected'); this machine has fewer than 2")
def test_a_dead_nccl_peer_makes_the_all_reduce_raise_in_time_and_the_gpu_stays_usable(tmp_path):
    codes = dp.run_ranks(_dead_peer_rank, tmp_path, timeout=4 * TIMEOUT + NCCL_ABORT_MARGIN_SEC + 60)
    error = tmp_path / "error0.txt"
    assert not error.exists(), error.read_text()
    assert codes[1] == -signal.SIGKILL, codes
    r = torch.load(tmp_path / "rank0.pt")
    assert r["blocking_wait"] == "1", r
    assert r["outcome"].startswith("gradient all-reduce failed on rank 0/2"), r
    assert "\n" not in r["outcome"] and f"--distributed_timeout_sec {TIMEOUT:g}" in r["outcome"], r
    # the timeout counts from the call; NCCL may also see the peer's death earlier (an async error), never later
    assert r["seconds"] < TIMEOUT + NCCL_ABORT_MARGIN_SEC, r
    assert "copied" in r, (f"rank 0 did not get past the copies to the host (exit code {codes[0]}: -6 is NCCL's "
                           f"watchdog tearing it down, -9 the test's kill after a hang): {r}")
    assert r["grad_kept"] and r["copied"] and r["computes"], r
    assert codes[0] == 0, (codes, r)  # it exited on its own
