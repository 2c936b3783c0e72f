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
TORN_WAIT_SEC) until its replacement publishes, which first makes `seq` even again.
"""
from __future__ import annotations

import time

import torch

TORN_WAIT_SEC = 0.05  # a publish takes well under a millisecond: an odd seq for longer means the writer died

class SharedWeights:
    """Shared copy of a model's state_dict plus `[seq, version]` counters in shared CPU memory."""

    def __init__(self, model: torch.nn.Module, device: str = "cpu"):
        # On CUDA the tensors are CUDA tensors shared through torch.multiprocessing (CUDA IPC handles).
        self.tensors = {k: v.detach().to(device).clone() for k, v in model.state_dict().items()}
        for t in self.tensors.values():
            t.share_memory_()
        self.counters = torch.tensor([0, -1], dtype=torch.int64).share_memory_()  # seq, published version
        self._counters_np = self.counters.numpy()

    def __getstate__(self) -> dict:  # the numpy view is rebuilt in the receiving process (pickled, it would be a copy)
        return {k: v for k, v in self.__dict__.items() if k != "_counters_np"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._counters_np = self.counters.numpy()

    @property
    def version(self) -> int:
        return int(self._counters_np[1])

    def publish(self, model: torch.nn.Module, version: int) -> None:
        if int(self._counters_np[0]) % 2:  # a writer died half-way (self-healing: we are its replacement)
            self.counters[0] += 1
        self.counters[0] += 1  # odd: writing
        with torch.no_grad():
            for k, v in model.state_dict().items():
                self.tensors[k].copy_(v, non_blocking=True)
        if any(t.is_cuda for t in self.tensors.values()):
            torch.cuda.synchronize()  # the copies must land before readers see the new version
        self.counters[1] = version
        self.counters[0] += 1

    def load_into(self, model: torch.nn.Module, have_version: int) -> int:
        """Copy the weights into `model` if newer than `have_version`; returns the version now held."""
        counters = self._counters_np  # read before every policy batch: numpy, not torch indexing
        torn_since = None
        while True:
            seq = int(counters[0])
            version = int(counters[1])
            if version <= have_version or version < 0:
                return have_version
            if seq % 2:
                now = time.monotonic()
                torn_since = torn_since or now
                if now - torn_since > TORN_WAIT_SEC:  # the learner died writing: keep what we have
                    return have_version
                time.sleep(0.0001)
                continue
            self._copy_from_shared(model)
            if int(counters[0]) == seq:
                return version

    def _copy_from_shared(self, model: torch.nn.Module) -> None:
        """Copy the shared tensors into `model`; returns once every copy has completed (see the module docstring)."""
        with torch.no_grad():
            waits = {_issue_copy(v, self.tensors[k]) for k, v in model.state_dict().items()}
        for wait in waits:
            wait()


def _issue_copy(dst: torch.Tensor, src: torch.Tensor):
    """Start copying src into dst; returns a function that waits until the copy has landed (CUDA copies run
    asynchronously to the host; CPU copies are done on return)."""
    dst.copy_(src, non_blocking=True)
    return torch.cuda.synchronize if dst.is_cuda or src.is_cuda else _done


def _done() -> None:
    pass
