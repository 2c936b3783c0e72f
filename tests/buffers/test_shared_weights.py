"""Weight publishing: the sequence lock never hands a policy worker a torn mix of two versions, even when its copies
land after a delay (a CUDA copy is asynchronous to the host: the protocol is checked here on CPU with copies that land
late, in threads)."""
import threading
import time

import pytest
import torch

import sf.buffers.shared_weights as shared_weights
from sf.buffers.shared_weights import ActingModels, SharedWeights


def _model(value: float) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return model


def _delayed_copy(dst, src):
    """A copy that lands 5 ms after it was issued, as an asynchronous device copy does; the returned wait joins it."""
    def copy():
        time.sleep(0.005)
        dst.copy_(src)
    thread = threading.Thread(target=copy)
    thread.start()
    return thread.join


def test_reader_never_sees_a_torn_copy_when_copies_land_late(monkeypatch):
    monkeypatch.setattr(shared_weights, "_issue_copy", _delayed_copy)
    writer_model = _model(0.0)
    weights = SharedWeights(writer_model)
    weights.publish(writer_model, 0)
    stop = threading.Event()

    def publish_forever():  # version v: every parameter equals v
        v = 0
        while not stop.is_set():
            v += 1
            with torch.no_grad():
                for p in writer_model.parameters():
                    p.fill_(float(v))
            weights.publish(writer_model, v)
            time.sleep(0.01)

    writer = threading.Thread(target=publish_forever)
    writer.start()
    reader, have, reads = _model(-1.0), -1, 0
    try:
        deadline = time.time() + 3.0
        while time.time() < deadline:
            version = weights.load_into(reader, have)
            if version > have:
                values = {float(x) for p in reader.parameters() for x in p.detach().flatten()[:1]}
                values |= ({float(p.detach().min()) for p in reader.parameters()}
                           | {float(p.detach().max()) for p in reader.parameters()})
                assert values == {float(version)}, f"torn read: version {version} holds {sorted(values)}"
                have, reads = version, reads + 1
    finally:
        stop.set()
        writer.join()
    assert reads >= 5  # the reader did get through while the writer kept publishing


def test_copies_on_cpu_are_complete_on_return():
    model = _model(3.0)
    weights = SharedWeights(model)
    weights.publish(model, 4)
    reader = _model(0.0)
    assert weights.load_into(reader, -1) == 4
    assert all(bool((p == 3.0).all()) for p in reader.parameters())
    assert weights.load_into(reader, 4) == 4  # nothing newer: nothing copied


def test_a_copy_torn_by_a_writer_that_then_died_is_not_reported_as_the_old_version(monkeypatch):
    """A reader copies version 1 while a learner starts publishing version 2 and is killed half-way: the reader's model
    is a mix, so load_into must not answer 'you still hold version 0' but -1 (no published version held)."""
    monkeypatch.setattr(shared_weights, "TORN_WAIT_SEC", 0.01)
    writer_model = _model(1.0)
    weights = SharedWeights(writer_model)
    weights.publish(writer_model, 1)
    reader = _model(0.0)
    real_copy = weights._copy_from_shared

    def copy_then_writer_dies(model):
        real_copy(model)
        with torch.no_grad():  # the writer starts version 2 (seq odd), writes one tensor, and is killed
            weights.counters[0] += 1
            next(iter(weights.tensors.values())).fill_(2.0)

    monkeypatch.setattr(weights, "_copy_from_shared", copy_then_writer_dies)
    assert weights.load_into(reader, 0) == -1
    monkeypatch.setattr(weights, "_copy_from_shared", real_copy)
    assert weights.load_into(reader, -1) == -1  # still torn (nobody published since): nothing whole to take
    weights.publish(writer_model, 3)  # the replacement learner publishes: whole again
    assert weights.load_into(reader, -1) == 3
    assert all(bool((p == 1.0).all()) for p in reader.parameters())


def test_a_policy_worker_never_acts_with_a_torn_copy(monkeypatch):
    """The same tear seen by a policy worker (ActingModels): a live learner descheduled half-way through publishing
    version 2 for longer than TORN_WAIT_SEC looks like a dead one. The worker goes on acting with version 1, whole, and
    labels its actions 1 (not -1: samples masked as too old); the learner's next publish swaps the models."""
    monkeypatch.setattr(shared_weights, "TORN_WAIT_SEC", 0.01)
    writer_model = _model(1.0)
    weights = SharedWeights(writer_model)
    weights.publish(writer_model, 1)
    acting = ActingModels(_model(0.0))
    assert acting.refresh(weights) == 1 and all(bool((p == 1.0).all()) for p in acting.active.parameters())
    real_copy = weights._copy_from_shared

    def copy_then_writer_stalls(model):
        real_copy(model)
        with torch.no_grad():  # version 2 begins (seq odd), one tensor written, then the writer is descheduled
            weights.counters[0] += 1
            weights.counters[1] = 2
            next(iter(weights.tensors.values())).fill_(2.0)

    with torch.no_grad():
        writer_model[0].weight.fill_(2.0)
    weights.publish(writer_model, 2)  # a version the reader has not taken: its copy is the one torn
    monkeypatch.setattr(weights, "_copy_from_shared", copy_then_writer_stalls)
    assert acting.refresh(weights) == 1
    assert all(bool((p == 1.0).all()) for p in acting.active.parameters()), "acted with a torn copy"
    monkeypatch.setattr(weights, "_copy_from_shared", real_copy)
    with torch.no_grad():
        for p in writer_model.parameters():
            p.fill_(3.0)
    weights.publish(writer_model, 3)  # the writer runs again and finishes a publish
    assert acting.refresh(weights) == 3 and all(bool((p == 3.0).all()) for p in acting.active.parameters())
    assert acting.refresh(weights) == 3  # nothing newer: no copy, no swap
    assert all(bool((p == 3.0).all()) for p in acting.active.parameters())


class _ManyEntries(torch.nn.Module):
    """A state_dict of 43 entries of several dtypes and shapes (a recurrent Doom model has 35): 20 layers, an int64
    count buffer, a 0-dim float64 buffer, a bool mask."""

    def __init__(self, value: float):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(3, 3) for _ in range(20))
        self.register_buffer("count", torch.tensor([7, 8], dtype=torch.int64))
        self.register_buffer("scale", torch.tensor(0.5, dtype=torch.float64))
        self.register_buffer("mask", torch.tensor([True, False, True]))
        with torch.no_grad():
            for p in self.parameters():
                p.fill_(value)


def test_weights_travel_to_a_process_as_one_descriptor():
    """Every tensor and the counters in one shared storage: one descriptor however many state_dict entries (before:
    one per entry plus the counters, 44 here, and a learner gets every policy's weights)."""
    from sf.processes.fds import fds_sent
    assert fds_sent(SharedWeights(_ManyEntries(1.0))) == 1
    assert fds_sent([SharedWeights(_ManyEntries(1.0)) for _ in range(8)]) == 8


@pytest.mark.e2e
def test_a_child_process_reads_each_published_version():
    """A policy worker's view from another process (started from a fork server, as the runner starts them): each
    version published is read whole, every dtype and shape as published."""
    import torch.multiprocessing
    from sf.ipc import Queue
    writer = _ManyEntries(1.0)
    weights, results = SharedWeights(writer), Queue()
    weights.publish(writer, 1)
    child = torch.multiprocessing.get_context("forkserver").Process(target=_read_versions, args=(weights, results))
    child.start()
    try:
        for version in (1, 2):
            got, state = results.get(timeout=120)
            assert got == version
            assert state == {k: (str(v.dtype), v.tolist()) for k, v in writer.state_dict().items()}
            with torch.no_grad():  # the next version: other values everywhere
                for p in writer.parameters():
                    p.fill_(2.0)
                writer.count += 1
                writer.scale.fill_(-1.0)
                writer.mask.logical_not_()
            weights.publish(writer, 2)
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


def _read_versions(weights: SharedWeights, results) -> None:
    reader, have = _ManyEntries(0.0), -1
    for version in (1, 2):
        deadline = time.monotonic() + 60
        while have < version and time.monotonic() < deadline:
            have = weights.load_into(reader, have)
        results.put((have, {k: (str(v.dtype), v.tolist()) for k, v in reader.state_dict().items()}))
