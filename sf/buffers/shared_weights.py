"""Learner -> policy workers weight publishing through shared memory (CUDA memory on GPU).

The learner copies its state_dict (parameters and normalizer buffers) into one shared copy after every
SGD step and bumps a version counter; policy workers compare the counter with their own before each
batch and copy the weights when it changed (the paper: well under a millisecond for its models).

Torn reads are prevented with a sequence lock: `seq` is odd while the learner writes; a reader that saw
an odd or changed `seq` around its copy simply retries. Readers never block the learner. The re-check of
`seq` must come after the copy has *landed*, not after it was issued: a CUDA copy is asynchronous, and a
publish that starts between an early re-check and the copy's execution would tear it unnoticed. Readers
therefore wait for their copies (`_copy_from_shared` returns only when they are done) before the re-check.

A learner killed while writing leaves `seq` odd: readers then keep the weights they have (they stop waiting after
TORN_WAIT_SEC) until its replacement publishes, which first makes `seq` even again. On a loaded machine a live learner
can also be descheduled half-way through a publish for longer than that: a reader cannot tell the two apart, so a
policy worker copies into a spare model and acts with it only once a copy came whole (ActingModels), never with a mix.
"""
from __future__ import annotations

import copy
import time

import torch

from sf.utils.packed import PackedTensors

TORN_WAIT_SEC = 0.05  # a publish takes well under a millisecond: an odd seq for longer means the writer died
COUNTERS = "\0counters"  # their name in the packed storage: no state_dict key starts with a NUL


class SharedWeights:
    """Shared copy of a model's state_dict plus `[seq, version]` counters in shared CPU memory.

    tensors[k]  the state_dict's shapes and dtypes, views of one packed storage (sf.utils.packed): a process receiving
                the weights gets one file descriptor on CPU, where the counters share the storage, and on CUDA one
                CUDA IPC handle for the tensors plus the counters' descriptor
    counters    [2] int64, CPU: seq (odd while the learner writes), published version (-1: none yet)
    """

    def __init__(self, model: torch.nn.Module, device: str = "cpu"):
        tensors = {k: v.detach() for k, v in model.state_dict().items()}
        counters = {COUNTERS: torch.tensor([0, -1], dtype=torch.int64)}
        if torch.device(device).type == "cpu":
            self._packed = [PackedTensors({**tensors, **counters})]
        else:  # the readers poll the counters through numpy on the host: they stay in CPU memory
            self._packed = [PackedTensors(tensors, device), PackedTensors(counters)]
        self._views()

    def _views(self) -> None:
        views = {k: v for packed in self._packed for k, v in packed.views.items()}
        self.counters = views.pop(COUNTERS)
        self.tensors = views
        self._counters_np = self.counters.numpy()

    def __getstate__(self) -> dict:  # the views are rebuilt in the receiving process (pickled, numpy's would be a copy)
        return {"_packed": self._packed}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._views()

    @property
    def version(self) -> int:
        return int(self._counters_np[1])

    def publish(self, model: torch.nn.Module, version: int) -> None:
        if int(self._counters_np[0]) % 2:  # a writer died half-way (self-healing: we are its replacement)
            self.counters[0] += 1
        self.counters[0] += 1  # odd: writing
        # the copies must land before readers see the new version
        _copy_and_wait((self.tensors[k], v) for k, v in model.state_dict().items())
        self.counters[1] = version
        self.counters[0] += 1

    def load_into(self, model: torch.nn.Module, have_version: int) -> int:
        """Copy the weights into `model` if newer than `have_version`; returns the version now held: `have_version`
        when nothing newer could be read whole (the model untouched), -1 when a copy was overwritten half-way by a
        writer that then died (the model holds no published version; a later call with -1 takes the next publish)."""
        counters = self._counters_np  # read before every policy batch: numpy, not torch indexing
        torn_since = None
        touched = False  # a copy into `model` was made and found torn: `have_version` is no longer what it holds
        while True:
            seq = int(counters[0])
            version = int(counters[1])
            if version <= have_version or version < 0:
                return -1 if touched else have_version
            if seq % 2:
                now = time.monotonic()
                torn_since = torn_since or now
                if now - torn_since > TORN_WAIT_SEC:  # the learner died writing: keep what we have
                    return -1 if touched else have_version
                time.sleep(0.0001)
                continue
            self._copy_from_shared(model)
            if int(counters[0]) == seq:
                return version
            touched = True

    def _copy_from_shared(self, model: torch.nn.Module) -> None:
        """Copy the shared tensors into `model`; returns once every copy has completed (see the module docstring)."""
        _copy_and_wait((v, self.tensors[k]) for k, v in model.state_dict().items())


def _copy_and_wait(pairs) -> None:
    """Copy each (dst, src) of `pairs`; return once every copy has landed (see _issue_copy)."""
    with torch.no_grad():
        waits = [_issue_copy(dst, src) for dst, src in pairs]
    for wait in dict.fromkeys(waits):  # (one wait per CUDA stream: its waits are equal)
        wait()


def _issue_copy(dst: torch.Tensor, src: torch.Tensor):
    """Start copying src into dst; returns a function that waits until the copy has landed. CPU copies are done on
    return; a CUDA copy is queued on the current stream of the GPU it runs on (dst's, or src's for a copy to the host)
    and runs asynchronously to the host: its wait is for that stream alone, up to the moment of the wait (an event
    recorded then: every copy queued there before). Not for the whole device (the learner's next batch, copied to the
    device on a side stream meanwhile, or other processes' work), and on the tensors' GPU whatever this thread's
    current device is."""
    dst.copy_(src, non_blocking=True)
    if not (dst.is_cuda or src.is_cuda):
        return _done
    return _StreamWait(torch.cuda.current_stream(dst.device if dst.is_cuda else src.device))


def _done() -> None:
    pass


class _StreamWait:
    """Called: waits for the work `stream` holds at that moment. Equal for one stream (one wait covers its copies)."""

    def __init__(self, stream):
        self.stream = stream

    def __eq__(self, other) -> bool:
        return isinstance(other, _StreamWait) and self.stream == other.stream

    def __hash__(self) -> int:
        return hash(self.stream)

    def __call__(self) -> None:
        landed = torch.cuda.Event()
        landed.record(self.stream)
        landed.synchronize()


class ActingModels:
    """A reader's two copies of one model: `active` acts while `spare` receives the next published version, and they
    swap only when the copy came whole. A copy torn by a writer that stalled or died half-way (load_into's -1) stays
    in the spare: the reader goes on acting with the whole version it had, and labels its actions with that version
    (acting with a torn copy would label them -1: samples masked as older than --max_policy_lag, lag stats skewed)."""

    def __init__(self, model: torch.nn.Module):
        self.active = model
        self.spare = copy.deepcopy(model)  # (its casts and attributes too: built like `model`)
        self.version = -1  # the version `active` holds (-1: none yet)

    def refresh(self, weights: SharedWeights) -> int:
        """Take the newest whole version published in `weights`, if newer; returns the version `active` now holds."""
        got = weights.load_into(self.spare, self.version)
        if got > self.version:
            self.active, self.spare = self.spare, self.active
            self.version = got
        return self.version
