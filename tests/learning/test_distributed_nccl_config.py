"""sf.learning.collectives' NCCL configuration, checked without a GPU: torch.distributed's init_process_group and
collectives are replaced by recorders, torch.cuda.set_device by a no-op, so nothing touches CUDA. What it shows: the
NCCL group is created in TORCH_NCCL_BLOCKING_WAIT mode unless the user chose otherwise, and every collective on it is
waited for in the calling thread with the group's timeout, its failure a one-line DistributedError. That such a wait
really raises in time when a peer dies, and leaves the GPU usable, needs two GPUs: tests/gpu/test_nccl_dead_peer.py.
"""
from __future__ import annotations

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

from sf.learning import collectives
from sf.learning.collectives import BLOCKING_WAIT_VARS, DistributedError, GradientAllReduce, init_learner_group
from sf.processes.ranks import World

TIMEOUT = 7.0
WORLD = World(rank=0, world_size=2, local_rank=0, local_world_size=2, master_addr="127.0.0.1", master_port=29555)


@pytest.fixture
def fake_init(monkeypatch):
    """init_process_group records its kwargs and the blocking-wait variables as they were when it was called; the
    variables init_learner_group may write are restored (or removed) after the test, as is the module's timeout."""
    for var in (*BLOCKING_WAIT_VARS, "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(var, "")  # recorded by monkeypatch, so restored even if the code under test sets it
        monkeypatch.delenv(var)
    monkeypatch.setattr(collectives, "_group_timeout", None)
    monkeypatch.setattr(collectives, "_stop_requested", None)
    calls = []

    def init_process_group(**kwargs):
        calls.append((kwargs, {var: os.environ.get(var) for var in BLOCKING_WAIT_VARS}))
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    devices = []
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    return calls, devices


def test_the_nccl_group_is_created_in_blocking_wait_mode(fake_init):
    calls, devices = fake_init
    init_learner_group(WORLD, "cuda", timeout_sec=TIMEOUT)
    (kwargs, env), = calls
    assert kwargs["backend"] == "nccl" and kwargs["timeout"] == datetime.timedelta(seconds=TIMEOUT)
    assert kwargs["device_id"] == torch.device("cuda", 0) and devices == [torch.device("cuda", 0)]
    # set before the group is created (torch reads it then): the wait blocks and raises instead of NCCL's watchdog
    # tearing the process down
    assert env == {"TORCH_NCCL_BLOCKING_WAIT": "1", "NCCL_BLOCKING_WAIT": None}


@pytest.mark.parametrize("var", BLOCKING_WAIT_VARS)
def test_a_blocking_wait_setting_of_the_user_is_kept(fake_init, monkeypatch, var):
    """Either name counts as the user's choice: setting the new one would override the deprecated one in torch."""
    calls, _ = fake_init
    monkeypatch.setenv(var, "0")
    init_learner_group(WORLD, "cuda:0", timeout_sec=TIMEOUT)
    (_, env), = calls
    assert env == {name: ("0" if name == var else None) for name in BLOCKING_WAIT_VARS}


def test_the_gloo_group_leaves_the_nccl_variables_alone(fake_init):
    calls, devices = fake_init
    init_learner_group(WORLD, "cpu", timeout_sec=TIMEOUT)
    (kwargs, env), = calls
    assert kwargs["backend"] == "gloo" and "device_id" not in kwargs and devices == []
    assert env == {name: None for name in BLOCKING_WAIT_VARS}


class FakeWork:
    """A NCCL collective's work: completes after `polls` calls of is_completed (None: never, a dead peer's)."""

    def __init__(self, log: list, error: str | None, polls: int | None = 0):
        self.log, self.error, self.polls = log, error, polls

    def is_completed(self) -> bool:
        if self.polls is None:
            return False
        self.polls -= 1
        return self.polls < 0

    def wait(self, timeout=None):
        self.log.append(("wait", timeout))
        if self.error:
            raise RuntimeError(self.error)
        return True


@pytest.fixture
def fake_nccl_group(fake_init, monkeypatch):
    """A formed 2-rank nccl group whose collectives record how they were called and return a FakeWork (its wait
    raises `failure[0]` when set); tensors stay on the CPU."""
    init_learner_group(WORLD, "cuda", timeout_sec=TIMEOUT)
    log, failure, polls = [], [None], [0]
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(collectives, "collective_device", lambda backend: torch.device("cpu"))

    def collective(name):
        def op(*args, group=None, async_op=False, **kwargs):
            log.append((name, async_op))
            if name == "all_gather":
                for part in args[0]:
                    part.copy_(args[1])
            return FakeWork(log, failure[0], polls[0]) if async_op else None
        return op
    for name in ("all_reduce", "all_gather", "broadcast"):
        monkeypatch.setattr(dist, name, collective(name))
    return log, failure, polls


def test_every_nccl_collective_is_waited_for_with_the_group_timeout(fake_nccl_group):
    log, _, _ = fake_nccl_group
    assert collectives.agree([3, 4]) == [3, 4]
    collectives.agree_range([5])
    collectives.gather_rows(torch.tensor([1.0, 2.0]))
    collectives.broadcast_state(torch.nn.Linear(2, 2))
    params = [torch.nn.Parameter(torch.zeros(3))]
    params[0].grad = torch.ones(3)
    GradientAllReduce(params)()
    timeout = datetime.timedelta(seconds=TIMEOUT)
    names = ["all_reduce", "all_reduce", "all_gather", "broadcast", "all_reduce"]
    # issued async (a synchronous NCCL call returns once the kernel is queued), then waited for in this thread
    assert log == [entry for name in names for entry in ((name, True), ("wait", timeout))]


def test_a_failed_nccl_wait_is_a_one_line_error_naming_the_timeout_flag(fake_nccl_group):
    _, failure, _ = fake_nccl_group
    failure[0] = ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, "
                  "NumelIn=4, NumelOut=4, Timeout(ms)=7000) ran for 7001 milliseconds before timing out.\n"
                  "Exception raised from checkTimeout at ProcessGroupNCCL.cpp:1 (most recent call first):")
    params = [torch.nn.Parameter(torch.zeros(3))]
    params[0].grad = torch.ones(3)
    with pytest.raises(DistributedError) as e:
        GradientAllReduce(params)()
    message = str(e.value)
    assert message.startswith("gradient all-reduce failed on rank 0/2") and "\n" not in message
    assert "--distributed_timeout_sec 7" in message and "ran for 7001 milliseconds" in message
    assert torch.equal(params[0].grad, torch.ones(3))  # nothing half-reduced reaches the optimizer


def test_a_nccl_wait_is_given_up_once_the_rank_was_asked_to_stop(fake_nccl_group, monkeypatch):
    """torchrun stops a machine's other ranks soon after one exits, long before the group's timeout: a collective whose
    dead peer never completes it is aborted STOP_ABORT_SEC after this rank was asked to stop (torch's wait with a
    timeout already past aborts the communicator and raises), so that the learner writes its final checkpoint in
    time."""
    log, failure, polls = fake_nccl_group
    monkeypatch.setattr(collectives, "STOP_ABORT_SEC", 0.05)
    stop = [False]
    collectives.abort_waits_on_stop(lambda: stop[0])
    polls[0] = 20  # a healthy collective: done after some polls, waited for with the group's timeout
    assert collectives.agree([1]) == [1]
    assert log == [("all_reduce", True), ("wait", datetime.timedelta(seconds=TIMEOUT))]
    log.clear()
    polls[0], stop[0] = None, True  # a dead peer: never done; this rank was asked to stop
    failure[0] = "[Rank 0] Work WorkNCCL(SeqNum=3, OpType=ALLREDUCE) timed out in blocking wait"
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match=r"^the learners' per-batch agreement failed on rank 0/2 .*timed out"):
        collectives.agree([1])
    assert 0.05 <= time.monotonic() - t0 < 5.0
    assert log == [("all_reduce", True), ("wait", datetime.timedelta(milliseconds=1))]


def test_a_nccl_wait_runs_to_the_timeout_while_no_stop_was_asked(fake_nccl_group, monkeypatch):
    log, _, polls = fake_nccl_group
    monkeypatch.setattr(collectives, "STOP_ABORT_SEC", 0.0)
    collectives.abort_waits_on_stop(lambda: False)
    polls[0] = 200
    assert collectives.agree([2]) == [2]
    assert log == [("all_reduce", True), ("wait", datetime.timedelta(seconds=TIMEOUT))]
