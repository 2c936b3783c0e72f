"""Every CUDA process and thread binds its device first, and no CUDA process is forked from one that may have
initialized CUDA. Read from fakes on this CPU machine (torch.cuda.set_device recorded; the bound process stops right
there): the learner's and the policy worker's entries and the learner's batch-copy thread bind the run's device (a rank
>= 1 or cuda:1 trains on another GPU than 0, where every CUDA call naming no device would otherwise go), the CPU binds
nothing, a process forked from a CUDA parent is refused in one line, and `--num_workers auto`'s measuring child is
started with spawn (forked from the runner, whose device check may have initialized CUDA, it could not use CUDA:
"Cannot re-initialize CUDA in forked subprocess"). tests/gpu/test_gpu_path.py runs these paths on a GPU."""
import multiprocessing
import threading

import pytest
import torch

from sf.cfg import parse_cfg
from sf.cfg.context import RunContext
from sf.learning.learner import run_learner
from sf.processes.control import bind_device, device_thread
from sf.sampling.policy_worker import run_policy_worker


class Bound(Exception):
    """Raised by the fake set_device: the process under test stops once it bound its device."""


@pytest.fixture
def bound(monkeypatch):
    """The (thread name, device) of each torch.cuda.set_device call; the call raises Bound."""
    calls = []

    def set_device(device):
        calls.append((threading.current_thread().name,
                      torch.device("cuda", device) if isinstance(device, int) else torch.device(device)))
        raise Bound

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)
    return calls


@pytest.mark.parametrize("entry,others", [(run_learner, 4), (run_policy_worker, 7)], ids=["learner", "policy_worker"])
def test_a_cuda_process_binds_its_device_before_anything_else(bound, entry, others):
    """The entry binds its run context's cuda:1 first: the fake stops it before it touches anything else (the
    context's other fields and the entry's other arguments are all None here)."""
    run = RunContext(*[None] * 6, device="cuda:1", exp_dir=None, frameskip=None)
    with pytest.raises(Bound):
        entry(run, *[None] * others)
    assert bound == [(threading.current_thread().name, torch.device("cuda", 1))]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # (the fake stops the thread)
def test_the_batch_copy_thread_binds_the_learners_device(bound):
    """CUDA's current device is per thread: the learner's batcher thread (device_thread) binds it itself."""
    ran = []
    thread = device_thread(lambda: ran.append(1), "cuda:1", "batcher")
    thread.start()
    thread.join(10)
    assert bound == [("batcher", torch.device("cuda", 1))] and ran == []  # (the fake stopped it at the binding)
    plain = device_thread(lambda: ran.append(1), "cpu", "batcher")
    plain.start()
    plain.join(10)
    assert ran == [1] and len(bound) == 1  # on the CPU: nothing bound, the target ran


def test_cuda_without_an_index_binds_gpu_0(bound):
    """resolve_device's "cuda" (one process per GPU, no torchrun) means the current device, which a new thread's is not
    unless bound: GPU 0, the device of the process's other threads (torch.cuda.set_device refuses "cuda" itself)."""
    with pytest.raises(Bound):
        bind_device("cuda")
    assert bound == [(threading.current_thread().name, torch.device("cuda", 0))]


def test_the_cpu_binds_nothing(bound):
    bind_device("cpu")
    bind_device(torch.device("cpu"))
    assert bound == []


def test_a_process_forked_from_a_cuda_parent_is_refused_in_one_line(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)  # what torch says in such a child
    with pytest.raises(RuntimeError, match=r"^process \d+ cannot use cuda:0: it was forked from a process that had "
                                           r"initialized CUDA: CUDA processes must be started by the fork server or "
                                           r"with spawn$"):
        bind_device("cuda:0")
    assert calls == []


class Started(Exception):
    pass


def test_the_measuring_child_of_num_workers_auto_is_spawned(tmp_path, monkeypatch):
    """No cached layout: sf.autolayout measures one in a child process, which must be a fresh interpreter (spawn),
    never a fork of the runner. The context asked for is recorded and the start stopped there."""
    from sf import autolayout
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing cached
    cfg = parse_cfg(["--env", "test_corridor", "--experiment", "auto", "--train_dir", str(tmp_path), "--device", "cpu"])
    asked = []
    real = multiprocessing.get_context

    def get_context(method=None):
        asked.append(method)
        ctx = real(method)
        if method != "spawn":  # a fork would have been started: stop it
            raise Started(method)
        monkeypatch.setattr(ctx, "Process", lambda *a, **kw: (_ for _ in ()).throw(Started(method)))
        return ctx

    monkeypatch.setattr(multiprocessing, "get_context", get_context)
    with pytest.raises(Started):
        autolayout.resolve_auto(cfg)
    assert asked == ["spawn"]
