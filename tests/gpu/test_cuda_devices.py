"""CUDA waits name their stream and their device: a publish of the learner's weights waits for its own copies, not for
the whole GPU (the next batch's copy on the side stream, GatherStaging's, goes on meanwhile); a policy worker's read
waits for its copies on the GPU that holds them; and a process bound to cuda:1 makes no context on GPU 0 (its threads
included). The CPU tests of the same (tests/runner/test_cuda_processes.py, tests/buffers/test_shared_weights.py) read
fakes; these run on the GPU."""
import multiprocessing as mp
import time

import pytest
import torch

from sf.buffers.shared_weights import SharedWeights
from test_shared_weights import _model  # tests/buffers

pytestmark = pytest.mark.gpu

BUSY_SECONDS = 1.0


def _busy_side_stream(seconds: float) -> torch.cuda.Event:
    """Queue `seconds` of work on a new stream of the current GPU (torch.cuda._sleep spins for a number of clock
    cycles: their rate measured first); returns an event recorded after it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles_per_second = 10_000_000 / (start.elapsed_time(end) / 1e3)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(int(seconds * cycles_per_second))
    done = torch.cuda.Event()
    done.record(side)
    return done


def test_a_publish_and_a_read_wait_for_their_copies_not_for_the_whole_gpu():
    torch.cuda.set_device(0)
    model = _model(1.0).cuda()
    weights = SharedWeights(model, "cuda")
    weights.publish(model, 0)
    reader = _model(0.0).cuda()
    torch.cuda.synchronize()
    side_done = _busy_side_stream(BUSY_SECONDS)  # (the learner's next batch on its way to the GPU)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(2.0)  # the SGD step: queued on the current stream, before the publish's copies
    t0 = time.perf_counter()
    weights.publish(model, 1)
    published = time.perf_counter() - t0
    assert weights.load_into(reader, 0) == 1
    read = time.perf_counter() - t0
    assert not side_done.query(), "the side stream's work finished before the publish returned: no proof either way"
    assert published < BUSY_SECONDS / 4 and read < BUSY_SECONDS / 4, (published, read)
    assert all(bool((p == 2.0).all()) for p in reader.parameters())  # the read holds the step's weights, whole
    side_done.synchronize()


def _bound_to_gpu1(results, done) -> None:
    """A process as a learner on cuda:1 is: bound there, shared weights and a pinned gather staging made and used
    from its main thread and from a batcher thread."""
    from sf.processes.control import bind_device, device_thread
    bind_device("cuda:1")
    model = _model(1.0).to("cuda:1")
    weights = SharedWeights(model, "cuda:1")
    weights.publish(model, 1)
    out = []

    def batcher():  # what GatherStaging does on the learner's batcher thread
        side = torch.cuda.Stream(torch.device("cuda:1"))
        host = torch.ones(1024).pin_memory()
        with torch.cuda.stream(side):
            dev = host.to("cuda:1", non_blocking=True)
        event = torch.cuda.Event()
        event.record(side)
        event.synchronize()
        out.append((torch.cuda.current_device(), float(dev.sum())))

    thread = device_thread(batcher, "cuda:1", "batcher")
    thread.start()
    thread.join(60)
    results.put((torch.cuda.current_device(), out, weights.version))
    done.wait(60)  # (alive, its contexts held, until the parent has read GPU 0's memory)


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (a process bound to cuda:1 must make no "
                                                          "context on GPU 0); this machine has fewer")
def test_a_process_bound_to_the_second_gpu_makes_no_context_on_the_first():
    """GPU 0's used memory (NVML, as nvidia-smi shows it: every process's contexts) while the child lives and after it
    ended: a context of its own there would take hundreds of MiB (NVML's process list is no proof inside a container,
    whose process ids it does not know)."""
    ctx = mp.get_context("spawn")
    results, done = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_bound_to_gpu1, args=(results, done))
    child.start()
    try:
        device, out, version = results.get(timeout=120)
        used_alive = torch.cuda.device_memory_used(0)
        done.set()
        child.join(60)
        used_after = torch.cuda.device_memory_used(0)
    finally:
        if child.is_alive():
            child.kill()
    assert device == 1 and out == [(1, 1024.0)] and version == 1 and child.exitcode == 0
    assert used_alive - used_after < 100 * 2**20, \
        f"GPU 0: {(used_alive - used_after) / 2**20:.0f} MiB held by the child"
