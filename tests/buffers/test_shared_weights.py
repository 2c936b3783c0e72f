"""Weight publishing: the sequence lock never hands a policy worker a torn mix of two versions, even when its copies
land after a delay (a CUDA copy is asynchronous to the host: the protocol is checked here on CPU with copies that land
late, in threads)."""
import threading
import time

import torch

import sf.buffers.shared_weights as shared_weights
from sf.buffers.shared_weights import SharedWeights


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
                values |= {float(p.detach().min()) for p in reader.parameters()} | {float(p.detach().max()) for p in reader.parameters()}
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
