"""Data-parallel learners on torch.distributed: the learners' process group and the collectives that keep every rank's
weights identical (the rank's place in the world: sf/processes/ranks.py).

Launched with torchrun, every rank runs a whole single-machine stack (samplers, policy workers, one learner per
policy); only the learners talk across ranks. A population (--num_policies N > 1) is placed instead: policy p on rank
p mod world size alone (`World.policies`), whose learner trains it like a single machine's and writes its checkpoints
into that rank's experiment directory; nothing below applies to it. After `loss.backward()` of every SGD step,
`GradientAllReduce` replaces each rank's gradients by their average over the ranks, so gradient clipping and the
optimizer step see the same numbers everywhere and, starting from the same weights and optimizer state, every rank
applies the same update: no weight broadcast is ever needed after the start.

    world = world_from_env()                          # RANK, WORLD_SIZE, ... as torchrun sets them
    init_learner_group(world, device, timeout_sec=60)  # gloo on CPU, nccl on CUDA; no-op with one rank
    appo = APPO(model, cfg, device, grad_hook=GradientAllReduce(model.parameters()))
    share_normalizer_statistics(model)                # every rank normalizes with the union batch's statistics

The average of per-rank gradients equals the gradient over the union of the ranks' minibatches when the loss is
a mean over the same number of (valid) samples on every rank. Where it is not, the ranks still stay identical but
the step is not exactly the union batch's: policy-lag masking can make the valid counts differ (each rank's
samples then weigh 1 / (world size x its own valid count)), and advantage normalization uses each rank's own
minibatch statistics. The input and returns normalizers (buffers, which gradients do not cover) merge every rank's
batch moments at each update (`share_normalizer_statistics`): every rank holds the union batch's statistics, bit for
bit alike, from the first forward of a batch on and whether or not any SGD step follows. The caller must keep the
number of SGD steps equal: a rank that skipped one would leave the others waiting in the all-reduce until the timeout
(APPO goes through every step in data-parallel runs; none of the ranks steps if no rank had a gradient).

Devices: NCCL collectives take CUDA tensors only, gloo's every collective takes CPU tensors (it takes CUDA ones for a
few ops only). Every collective here goes through `collective_device` (nccl: this rank's GPU, which
init_learner_group makes the current device; any other backend: the CPU) and copies its tensors there and back, so a
model on a GPU also works with gloo (through host memory). NCCL refuses two ranks on one GPU ("Duplicate GPU
detected"): on CUDA each local rank needs a GPU of its own (cuda:LOCAL_RANK).

Failures: every collective raises a one-line DistributedError in the calling thread, so the learner can still write
its final checkpoint. With gloo, a rank that dies closes its sockets and the others raise at once (connection closed
or reset by peer); a rank alive but stuck makes them raise after the group's timeout (measured:
tests/learning/test_distributed.py). NCCL returns from a collective as soon as its kernel is queued: a peer that died
leaves the kernel spinning, the next host synchronization hangs, and NCCL's watchdog thread tears the whole process
down past the timeout (TORCH_NCCL_ASYNC_ERROR_HANDLING, which torchrun sets to 1), with no checkpoint. So on nccl every
collective here is issued async and waited for in the calling thread (`_collective`), in TORCH_NCCL_BLOCKING_WAIT
mode, which init_learner_group turns on: past the timeout, counted from the call, the wait aborts the communicator
(which ends the spinning kernel, leaving the GPU usable) and raises, within the timeout + NCCL_ABORT_MARGIN_SEC; torch
starts no watchdog thread in that mode (before 2.6 it ran one that tore nothing down), so the process lives on. The
price: the CPU waits for every collective (it no longer queues gradient clipping and Adam behind the all-reduce).
The timeout comes too late on one machine, where torchrun stops the other ranks soon after one of them exits: there
a wait is also given up STOP_ABORT_SEC after the rank was asked to stop (abort_waits_on_stop;
docs/distributed.md#faults).
"""
from __future__ import annotations

import datetime
import functools
import io
import os
import time
from typing import Callable, Iterable, Optional, Sequence

import torch
import torch.distributed as dist

from sf.learning.checkpoint import weights_sha256
from sf.model.normalization import RunningMeanStd
from sf.processes.ranks import World
from sf.utils.files import first_line

# torch reads either name when it creates a NCCL group (the first wins); the second is the deprecated one
BLOCKING_WAIT_VARS = ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")
# A NCCL collective whose peer died or hangs raises at most this long after the group's timeout: the time NCCL takes to
# abort its communicator (asserted by tests/gpu/test_nccl_dead_peer.py). Well below the stall watchdog's grace for a
# learner waiting on its peers (sf/runner/health/watchdog.py, 30 s), which must also cover writing the final checkpoint.
NCCL_ABORT_MARGIN_SEC = 10.0
# The learners' group's timeout (set by init_learner_group): how long a NCCL wait lasts, and named in failures
_group_timeout: Optional[datetime.timedelta] = None
# A NCCL collective still waiting this long after this rank was asked to stop is given up (abort_waits_on_stop): a
# learner blocked in it shows no progress, and after a SIGTERM the final checkpoint must be written within the grace
# period (sf/runner/health/stopping.py). Healthy peers asked to stop at the same time (a Ctrl-C to the job, torchrun
# stopping a machine's ranks, the budget reached at the same batch boundary) meet in the next collective well within it.
STOP_ABORT_SEC = 3.0
# Whether this rank was asked to stop (the learner's SharedState.stopping; None: NCCL waits run to the timeout)
_stop_requested: Optional[Callable[[], bool]] = None




class DistributedError(RuntimeError):
    """A collective of the learners' group failed: a peer rank died or is stuck. A replacement learner could not rejoin
    the group (its size is fixed at start), so this stops the run (self-healing does not apply)."""
    stops_the_run = True


def init_learner_group(world: World, device, timeout_sec: float = 60.0) -> None:
    """Join the learners of all ranks into torch.distributed's default process group: nccl when `device` is CUDA,
    gloo otherwise; rendezvous env:// at world.master_addr:world.master_port (torchrun's MASTER_ADDR/MASTER_PORT,
    written back to os.environ, where env:// reads them). `timeout_sec` (--distributed_timeout_sec) bounds the
    rendezvous and every later collective here: a dead or stuck peer raises DistributedError instead of hanging. With
    nccl, `device` (default cuda:LOCAL_RANK) becomes this process's current CUDA device (collective_device("nccl") is
    that GPU), and TORCH_NCCL_BLOCKING_WAIT=1 is put in os.environ before the group is created, which is when torch
    reads it, unless the user set it or NCCL_BLOCKING_WAIT: an explicit 0 is kept, and then NCCL's watchdog thread
    may tear the process down after a timeout before the final checkpoint is written (see the module docstring).
    With one rank: nothing (no group is needed).

    Raises RuntimeError with a one-line message naming MASTER_ADDR:MASTER_PORT if the group cannot be formed
    (master unreachable, a rank missing) within about the timeout (a client retries once: up to ~2x)."""
    if not world.distributed:
        return
    if not timeout_sec > 0:
        raise ValueError(f"timeout_sec must be > 0 (got {timeout_sec})")
    if dist.is_initialized():
        raise RuntimeError("the process group is already initialized")
    device = torch.device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {}
    if backend == "nccl":  # bind the communicator to this rank's GPU at once (else: lazily, on a guessed device)
        gpu = torch.device("cuda", device.index if device.index is not None else world.local_rank)
        torch.cuda.set_device(gpu)  # torch.device("cuda") (collective_device) means this rank's GPU from here on
        kwargs["device_id"] = gpu
        if not any(name in os.environ for name in BLOCKING_WAIT_VARS):
            os.environ[BLOCKING_WAIT_VARS[0]] = "1"
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = world.master_addr, str(world.master_port)
    try:
        dist.init_process_group(backend=backend, init_method="env://", rank=world.rank, world_size=world.world_size,
                                timeout=datetime.timedelta(seconds=timeout_sec), **kwargs)
    except Exception as e:  # DistNetworkError, DistStoreError, ...: C++ text of several lines
        raise RuntimeError(f"rank {world.rank}/{world.world_size}: could not form the learners' {backend} group at "
                           f"MASTER_ADDR:MASTER_PORT {world.master_addr}:{world.master_port} within {timeout_sec:g} s "
                           f"({type(e).__name__}: {first_line(e)})") from e
    global _group_timeout
    _group_timeout = datetime.timedelta(seconds=timeout_sec)


def _group_size(group) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def collective_device(backend: str) -> torch.device:
    """Where the tensors of a collective of `backend` must be: NCCL takes CUDA tensors only (torch.device("cuda"): the
    current device, which init_learner_group set to this rank's GPU); gloo (and any other backend) CPU tensors."""
    return torch.device("cuda") if _is_nccl(backend) else torch.device("cpu")


def _is_nccl(backend) -> bool:
    return str(backend).lower() == "nccl"


def _group_device(group=None) -> torch.device:
    return collective_device(dist.get_backend(group))


def _failed(what: str, e: BaseException) -> DistributedError:
    """One line: which collective failed on which rank, and the backend's first line (a peer died: at once with gloo;
    a peer stuck, or dead under NCCL: after the group's timeout)."""
    flag = "--distributed_timeout_sec" + (f" {_group_timeout.total_seconds():g}" if _group_timeout else "")
    return DistributedError(f"{what} failed on rank {dist.get_rank()}/{dist.get_world_size()} (a peer learner died, or "
                            f"was stuck past {flag}): {first_line(e)}")


def abort_waits_on_stop(stop_requested: Optional[Callable[[], bool]]) -> None:
    """From now on a NCCL collective of this process that is still waiting STOP_ABORT_SEC after `stop_requested()`
    became true is aborted and raises (DistributedError), so that the learner writes its final checkpoint before it is
    killed: on one machine, torchrun stops the other ranks soon after one exits, long before the group's timeout (a dead
    peer's kernel never completes). None: no such check."""
    global _stop_requested
    _stop_requested = stop_requested


def _wait_nccl(work) -> None:
    """Wait for a NCCL collective's `work` in this thread: up to the group's timeout, or, with abort_waits_on_stop,
    until this rank has been asked to stop for STOP_ABORT_SEC. A wait given up aborts the communicator and raises
    (torch's wait with a timeout already past: it counts from the collective's start)."""
    if _stop_requested is not None:
        stop_since = None
        while not work.is_completed():  # (also true once NCCL reported an error: the wait below raises it)
            if _stop_requested():
                stop_since = stop_since or time.monotonic()
                if time.monotonic() - stop_since >= STOP_ABORT_SEC:
                    work.wait(datetime.timedelta(milliseconds=1))
                    return  # (it completed after all)
            time.sleep(0.0005)
    if _group_timeout is None:  # a group formed elsewhere: its own timeout, in the mode it was made with
        work.wait()
    else:
        work.wait(_group_timeout)


def _collective(what: str, fn, /, *args, group=None, **kwargs) -> None:
    """`fn(*args, group=group, **kwargs)`, a torch.distributed collective, done when this returns; a failure is a
    one-line DistributedError naming `what`. On nccl the collective is issued async and waited for here, in this
    thread: a synchronous NCCL call returns once the kernel is queued, so a dead peer would only show as a hang at the
    next host synchronization. In TORCH_NCCL_BLOCKING_WAIT mode (init_learner_group) the wait blocks until the kernel
    is done; past the group's timeout, counted from the call, it aborts the communicator and raises. The timeout is
    also passed explicitly: in recent torch that alone makes the wait block, so the mode turned off by a user still
    raises in time (but NCCL's watchdog then runs too)."""
    try:
        if _is_nccl(dist.get_backend(group)):
            _wait_nccl(fn(*args, group=group, async_op=True, **kwargs))
        else:
            fn(*args, group=group, **kwargs)
    except Exception as e:  # a peer died (gloo: at once) or is stuck (after the group's timeout)
        raise _failed(what, e) from e


class GradientAllReduce:
    """`hook()` replaces the `.grad` of every parameter by its average over the ranks of `group` (default: the
    default group): meant as APPO's grad_hook, between backward and gradient clipping.

    One collective per call: the gradients are copied into one preallocated flat buffer
    `[sum of numel + num_params]` (the trailing `num_params` entries flag which parameters had a gradient on this
    rank), all-reduced with SUM (gloo has no AVG) and divided by the world size, then copied back. Many small
    all-reduces would pay the network latency once per parameter tensor. A parameter without a gradient on a rank
    contributes zeros there; it gets the averaged gradient on every rank if any rank had one, and stays None
    everywhere otherwise (Adam then skips it on every rank alike).

    The buffer lives on the group's collective_device: with nccl the parameters' GPU (no copy but the flat one); with
    gloo the CPU, also for parameters on a GPU (gloo reduces CUDA tensors through host memory anyway, and only for a
    few ops: the copies are explicit here). With a world of one rank the hook does nothing (no buffer, no process
    group needed). `seconds_total` and `calls` count the all-reduces made (host time; with nccl the hook waits for the
    all-reduce, see `_collective`, so it includes the backward kernels still queued before it)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], group=None, world_size: Optional[int] = None):
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.world_size = int(world_size) if world_size is not None else _group_size(group)
        self.seconds_total, self.calls = 0.0, 0
        self.buffer: Optional[torch.Tensor] = None
        if self.world_size == 1 or not self.params:
            return
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) != 1:
            raise ValueError(f"parameters of one dtype and device expected (one flat buffer), "
                             f"got {sorted(map(str, kinds))}")
        dtype, device = kinds.pop()
        if dist.is_initialized():
            device = _group_device(group)
        self.numels = [p.numel() for p in self.params]
        self.num_elements = sum(self.numels)
        self.buffer = torch.empty(self.num_elements + len(self.params), dtype=dtype, device=device)
        # views of the buffer, made once: [numel] gradient slices, then [num_params] flags
        self._views = list(torch.split(self.buffer[:self.num_elements], self.numels))
        self._flags = self.buffer[self.num_elements:]

    @property
    def nbytes(self) -> int:
        """Bytes all-reduced per call (0 with one rank)."""
        return 0 if self.buffer is None else self.buffer.numel() * self.buffer.element_size()

    def __call__(self) -> None:
        if self.buffer is None:
            return
        start = time.perf_counter()
        missing = []
        for i, (p, view) in enumerate(zip(self.params, self._views)):
            if p.grad is None:
                view.zero_()
                missing.append(i)
            else:
                view.copy_(p.grad.reshape(-1))
        self._flags.fill_(1.0)
        if missing:
            self._flags[missing] = 0.0
        _collective("gradient all-reduce", dist.all_reduce, self.buffer, op=dist.ReduceOp.SUM, group=self.group)
        self.buffer.div_(self.world_size)  # the same operation on the same sums: identical results on every rank
        # the flags (a device sync) are only needed where this rank had no gradient: every rank decides alike
        had_any = self._flags[missing].gt(0).tolist() if missing else []
        for p, view in zip(self.params, self._views):
            if p.grad is not None:
                p.grad.copy_(view.view_as(p.grad))
        for i, any_rank in zip(missing, had_any):
            if any_rank:
                p = self.params[i]
                p.grad = self._views[i].view_as(p).to(p.device, copy=True)
        self.seconds_total += time.perf_counter() - start
        self.calls += 1


def check_identical_weights(model: torch.nn.Module, group=None) -> bool:
    """True if `model`'s state_dict (weights and normalizer buffers) is bitwise identical on every rank of `group`
    (weights_sha256 digests, 32 bytes each, all-gathered as [world, 32] uint8). A collective: every rank must call
    it. Always True with one rank. For tests and a debug check, not for every step (hashes all the weights)."""
    world_size = _group_size(group)
    if world_size == 1:
        return True
    mine = torch.tensor(list(bytes.fromhex(weights_sha256(model))), dtype=torch.uint8)  # [32]
    digests = gather_rows(mine, group, what="the weight digest comparison")  # [world, 32]
    return bool((digests == digests[0]).all())


def _int64(values: Sequence[int], device: torch.device) -> torch.Tensor:
    if any(isinstance(v, float) or not -2**63 < int(v) < 2**63 for v in values):
        raise ValueError(f"agree takes int64 values (counters, flags), got {list(values)}")
    return torch.tensor([int(v) for v in values], dtype=torch.int64, device=device)


def agree(values: Sequence[int], group=None) -> list[int]:
    """Sum `values` (a few integers: a stop flag, frame counters) over the ranks, exactly (int64, not floats: a float64
    sum is exact only below 2^53); every rank gets the same sums. The learners call it once per training batch, which
    keeps them in step: they stop at the same batch boundary."""
    t = _int64(values, _group_device(group))
    _collective("the learners' per-batch agreement", dist.all_reduce, t, op=dist.ReduceOp.SUM, group=group)
    return t.tolist()


def agree_range(values: Sequence[int], group=None) -> tuple[list[int], list[int]]:
    """(minimums, maximums) of each of `values` (integers) over the ranks, exact: every rank holds the same value iff
    its minimum equals its maximum. One all-reduce MAX of [values, -values] (gloo and nccl have MAX)."""
    t = _int64(values, _group_device(group))
    both = torch.cat([t, -t])
    _collective("the learners' start-up agreement", dist.all_reduce, both, op=dist.ReduceOp.MAX, group=group)
    n = len(values)
    out = both.tolist()
    return [-v for v in out[n:]], out[:n]


def gather_rows(t: torch.Tensor, group=None, what: str = "the normalizer statistics gather") -> torch.Tensor:
    """`[world, *t.shape]`: every rank's `t` (same shape and dtype on every rank), in rank order, on t's device. A
    collective: every rank must call it. Without a process group: t[None]. `what`: the collective, for its error."""
    if not (dist.is_available() and dist.is_initialized()):
        return t.detach().unsqueeze(0).clone()
    world_size = dist.get_world_size(group)
    mine = t.detach().to(_group_device(group)).contiguous()
    parts = [torch.empty_like(mine) for _ in range(world_size)]
    _collective(what, dist.all_gather, parts, mine, group=group)
    return torch.stack(parts).to(t.device)


def share_normalizer_statistics(model: torch.nn.Module, group=None) -> int:
    """Make every running mean/std normalizer of `model` (sf.model.normalization.RunningMeanStd: input and returns
    normalizers) merge the batch moments of every rank of `group` at each update, in rank order: every rank then holds
    the union batch's statistics, bitwise alike, and the ranks' updates stay collectives in the same order (each rank
    updates the same normalizers the same number of times). Returns how many normalizers it set."""
    normalizers = [m for m in model.modules() if isinstance(m, RunningMeanStd)]
    for m in normalizers:
        m.gather_moments = functools.partial(gather_rows, group=group)
    return len(normalizers)


def broadcast_state(model: torch.nn.Module, src: int = 0, group=None) -> None:
    """Copy rank `src`'s state_dict (weights and normalizer buffers) into `model` on every rank: one flat broadcast
    per dtype, on the group's collective_device."""
    tensors = list(model.state_dict().values())
    if not tensors:
        return
    device = _group_device(group)
    for dtype in sorted({t.dtype for t in tensors}, key=str):  # one flat tensor per dtype
        same = [t for t in tensors if t.dtype == dtype]
        flat = torch.cat([t.detach().reshape(-1) for t in same]).to(device)
        _collective(f"broadcast of rank {src}'s weights", dist.broadcast, flat, src=src, group=group)
        with torch.no_grad():
            for t, part in zip(same, torch.split(flat, [t.numel() for t in same])):
                t.copy_(part.view_as(t))


def broadcast_object(obj, src: int = 0, group=None, what: str = "the broadcast of rank 0's checkpoint"):
    """Rank `src`'s `obj` (anything torch.save takes: a checkpoint's state with its tensors) on every rank, through the
    process group itself: no rank reads another's files. Two broadcasts, the byte count then the bytes (uint8, on the
    group's collective_device); tensors arrive on the CPU. The peer is one of this run's ranks: its bytes are loaded
    as torch.load loads our own checkpoints' content."""
    device = _group_device(group)
    if _rank(group) == src:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8).to(device)
        size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    else:
        size = torch.zeros(1, dtype=torch.int64, device=device)
    _collective(what, dist.broadcast, size, src=src, group=group)
    if _rank(group) != src:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _collective(what, dist.broadcast, data, src=src, group=group)
    if _rank(group) == src:
        return obj
    return torch.load(io.BytesIO(data.cpu().numpy().tobytes()), map_location="cpu", weights_only=False)


def _rank(group) -> int:
    return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0
