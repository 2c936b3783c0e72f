"""The fork server every worker is forked from must never initialize CUDA: a worker forked from a process that did
cannot use it (on an H100: "Cannot re-initialize CUDA in forked subprocess", then "CUDA error: initialization error"
at the first CUDA tensor a learner or policy worker received). CUDA cannot be initialized on a CPU build of torch, so
this test makes every call that initializes it on a CUDA build fail, imports the fork server's module as the fork server
does, and checks that none was made. tests/gpu/test_cuda.py runs the real thing where a GPU exists."""
import subprocess
import sys

import pytest

from e2e_helpers import ROOT

PROBE = r"""
import os, sys
import torch

calls = []
def forbid(name):
    def call(*args, **kwargs):
        calls.append(name)
        raise RuntimeError(f"{name} initializes CUDA on a CUDA build of torch")
    return call

# what initializes the CUDA driver or a context: the autograd engine's first backward (it asks each device type for
# its device count), the runtime's device count behind torch.cuda.is_available() (unless NVML is asked), and an
# optimizer's graph-capture check (it reads the current CUDA stream)
torch.autograd.backward = forbid("torch.autograd.backward")
torch.Tensor.backward = forbid("Tensor.backward")
torch.accelerator.current_stream = forbid("torch.accelerator.current_stream")
torch.accelerator.current_accelerator = forbid("torch.accelerator.current_accelerator")
torch.cuda.current_stream = forbid("torch.cuda.current_stream")
real_is_available = torch.cuda.is_available
def is_available():
    if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1":
        calls.append("torch.cuda.is_available without NVML")
    return real_is_available()
torch.cuda.is_available = is_available

import sf.runner.fork_server  # noqa: F401  (runs the warm-up)
torch.cuda.is_available()
assert not calls, calls
print("clean", os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"])
"""


@pytest.mark.e2e
def test_fork_server_warm_up_touches_nothing_that_initializes_cuda():
    res = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # (the module moves itself into a process group of its own: setpgid)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["clean", "1"]
