"""Data-parallel learners on torch.distributed (issue 19): the rank's place in the world, the learners' process
group, and the gradient all-reduce that keeps every rank's weights identical.

Launched with torchrun, every rank runs a whole single-machine stack (samplers, policy workers, one learner per
policy); only the learners talk across ranks. After `loss.backward()` of every SGD step, `GradientAllReduce`
replaces each rank's gradients by their average over the ranks, so gradient clipping and the optimizer step see
the same numbers everywhere and, starting from the same weights and optimizer state, every rank applies the same
update: no weight broadcast is ever needed.

    world = world_from_env()                          # RANK, WORLD_SIZE, ... as torchrun sets them
    init_learner_group(world, device, timeout_sec=60)  # gloo on CPU, nccl on CUDA; no-op with one rank
    appo = APPO(model, cfg, device, grad_hook=GradientAllReduce(model.parameters()))

The average of per-rank gradients equals the gradient over the union of the ranks' minibatches when the loss is
a mean over the same number of (valid) samples on every rank. Where it is not, the ranks still stay identical but
the step is not exactly the union batch's: policy-lag masking can make the valid counts differ (each rank's
samples then weigh 1 / (world size x its own valid count)), and advantage normalization uses each rank's own
minibatch statistics. What gradients do not cover, and the caller must keep equal across ranks: the input and
returns normalizers' statistics (buffers updated from each rank's own batch: the ranks' state_dicts drift apart)
and the number of SGD steps (a rank that skips one, e.g. every sample too old, leaves the others waiting in the
all-reduce until the timeout).

A rank that dies closes its sockets: gloo raises on the other ranks at once (connection closed or reset by
peer); a rank that is alive but stuck makes the others raise after the group's timeout (measured:
tests/learning/test_distributed.py). NCCL is not tested here (no GPUs): its watchdog aborts a collective past the timeout
with TORCH_NCCL_ASYNC_ERROR_HANDLING (on by default in recent torch).
"""
from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

import torch
import torch.distributed as dist

from sf.learning.checkpoint import weights_sha256

# torchrun's variables: https://pytorch.org/docs/stable/elastic/run.html#environment-variables
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT = "127.0.0.1", 29500  # torchrun's defaults


@dataclass(frozen=True)
class World:
    """This process's place among the data-parallel ranks (one rank: rank 0 of 1)."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0  # rank among the ranks of this machine (which GPU to use)
    local_world_size: int = 1
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def world_from_env(env: Optional[Mapping[str, str]] = None) -> World:
    """The World torchrun describes in `env` (default os.environ): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT. Without RANK and WORLD_SIZE: a single rank (World()). LOCAL_RANK / LOCAL_WORLD_SIZE
    default to RANK / WORLD_SIZE (one machine) for launchers that set only those. ValueError (one line) if a
    variable is not an integer, only one of RANK and WORLD_SIZE is set, or the ranks are out of range."""
    env = os.environ if env is None else env
    given = [k for k in ("RANK", "WORLD_SIZE") if env.get(k, "") != ""]
    if not given:
        return World()
    if len(given) == 1:
        missing = "WORLD_SIZE" if given == ["RANK"] else "RANK"
        raise ValueError(f"{given[0]} is set but {missing} is not: launch with torchrun, which sets both")
    rank, world_size = _env_int(env, "RANK", 0), _env_int(env, "WORLD_SIZE", 1)
    local_rank = _env_int(env, "LOCAL_RANK", rank)
    local_world_size = _env_int(env, "LOCAL_WORLD_SIZE", world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} WORLD_SIZE={world_size}: need WORLD_SIZE >= 1 and 0 <= RANK < WORLD_SIZE")
    if not 1 <= local_world_size <= world_size or not 0 <= local_rank < local_world_size:
        raise ValueError(f"LOCAL_RANK={local_rank} LOCAL_WORLD_SIZE={local_world_size}: need "
                         f"1 <= LOCAL_WORLD_SIZE <= WORLD_SIZE ({world_size}) and 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE")
    port = _env_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT)
    if not 0 < port < 65536:
        raise ValueError(f"MASTER_PORT={port} is not a TCP port")
    return World(rank, world_size, local_rank, local_world_size, env.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR, port)


class DistributedError(RuntimeError):
    """A collective of the learners' group failed: a peer rank died or is stuck. A replacement learner could not rejoin
    the group (its size is fixed at start), so this stops the run (self-healing does not apply)."""
    stops_the_run = True


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


def init_learner_group(world: World, device, timeout_sec: float = 60.0) -> None:
    """Join the learners of all ranks into torch.distributed's default process group: nccl when `device` is CUDA,
    gloo otherwise; rendezvous env:// at world.master_addr:world.master_port (torchrun's MASTER_ADDR/MASTER_PORT,
    written back to os.environ, where env:// reads them). `timeout_sec` bounds the rendezvous and, with gloo, every
    later collective (a stuck peer raises instead of hanging). With one rank: nothing (no group is needed).

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
        kwargs["device_id"] = torch.device("cuda", device.index if device.index is not None else world.local_rank)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = world.master_addr, str(world.master_port)
    try:
        dist.init_process_group(backend=backend, init_method="env://", rank=world.rank, world_size=world.world_size,
                                timeout=datetime.timedelta(seconds=timeout_sec), **kwargs)
    except Exception as e:  # DistNetworkError, DistStoreError, ...: C++ text of several lines
        raise RuntimeError(f"rank {world.rank}/{world.world_size}: could not form the learners' {backend} group at "
                           f"MASTER_ADDR:MASTER_PORT {world.master_addr}:{world.master_port} within {timeout_sec:g} s "
                           f"({type(e).__name__}: {_first_line(e)})") from e


def _group_size(group) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


class GradientAllReduce:
    """`hook()` replaces the `.grad` of every parameter by its average over the ranks of `group` (default: the
    default group): meant as APPO's grad_hook, between backward and gradient clipping.

    One collective per call: the gradients are copied into one preallocated flat buffer
    `[sum of numel + num_params]` (the trailing `num_params` entries flag which parameters had a gradient on this
    rank), all-reduced with SUM (gloo has no AVG) and divided by the world size, then copied back. Many small
    all-reduces would pay the network latency once per parameter tensor. A parameter without a gradient on a rank
    contributes zeros there; it gets the averaged gradient on every rank if any rank had one, and stays None
    everywhere otherwise (Adam then skips it on every rank alike).

    With a world of one rank the hook does nothing (no buffer, no process group needed). `seconds_total` and
    `calls` count the all-reduces made (host time: on CUDA, NCCL runs asynchronously on the stream, so the time
    is that of queuing the work unless the caller synchronizes)."""

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
        try:
            dist.all_reduce(self.buffer, op=dist.ReduceOp.SUM, group=self.group)
        except Exception as e:  # a peer died (at once) or is stuck (after the group's timeout): one line
            raise DistributedError(f"gradient all-reduce failed on rank {dist.get_rank()}/{self.world_size} (a peer "
                                   f"learner died or is stuck): {_first_line(e)}") from e
        self.buffer.div_(self.world_size)  # the same operation on the same sums: identical results on every rank
        # the flags (a device sync) are only needed where this rank had no gradient: every rank decides alike
        had_any = self._flags[missing].gt(0).tolist() if missing else []
        for p, view in zip(self.params, self._views):
            if p.grad is not None:
                p.grad.copy_(view.view_as(p.grad))
        for i, any_rank in zip(missing, had_any):
            if any_rank:
                p = self.params[i]
                p.grad = self._views[i].view_as(p).clone()
        self.seconds_total += time.perf_counter() - start
        self.calls += 1


def check_identical_weights(model: torch.nn.Module, group=None) -> bool:
    """True if `model`'s state_dict (weights and normalizer buffers) is bitwise identical on every rank of `group`
    (weights_sha256 digests, 32 bytes each, all-gathered as [world, 32] uint8). A collective: every rank must call
    it. Always True with one rank. For tests and a debug check, not for every step (hashes all the weights)."""
    world_size = _group_size(group)
    if world_size == 1:
        return True
    nccl = dist.get_backend(group) == "nccl"  # NCCL collectives take CUDA tensors only
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    mine = torch.tensor(list(bytes.fromhex(weights_sha256(model))), dtype=torch.uint8, device=device)  # [32]
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine, group=group)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def agree(values: list[float]) -> list[float]:
    """Sum `values` (a few floats: a stop flag, frame counters) over the ranks; every rank gets the same sums. The
    learners call it once per training batch, which keeps them in step: they stop at the same batch boundary."""
    t = torch.tensor(values, dtype=torch.float64)
    try:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    except Exception as e:
        raise DistributedError(f"rank {dist.get_rank()}: the learners' per-batch agreement failed (a peer learner died "
                               f"or is stuck): {_first_line(e)}") from e
    return t.tolist()


def broadcast_state(model: torch.nn.Module, src: int = 0, buffers_only: bool = False) -> None:
    """Copy rank `src`'s weights and buffers (or, with buffers_only, its buffers: input and returns normalizers, which
    each rank updates from its own batch) into `model` on every rank: one flat broadcast."""
    tensors = list(model.buffers() if buffers_only else model.state_dict().values())
    if not tensors:
        return
    try:
        for dtype in sorted({t.dtype for t in tensors}, key=str):  # one flat tensor per dtype
            group = [t for t in tensors if t.dtype == dtype]
            flat = torch.cat([t.detach().reshape(-1) for t in group])
            dist.broadcast(flat, src=src)
            with torch.no_grad():
                for t, part in zip(group, torch.split(flat, [t.numel() for t in group])):
                    t.copy_(part.view_as(t))
    except Exception as e:
        raise DistributedError(f"rank {dist.get_rank()}: broadcast of rank {src}'s weights failed: "
                               f"{_first_line(e)}") from e
