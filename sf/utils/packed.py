"""Many named tensors in one shared storage, so that a process receiving them gets one file descriptor, not one each.

Workers are started from a fork server (sf/runner/supervision.worker_context), which hands a new process every file
descriptor its arguments carry in one message of at most MAX_FDS_SENT; torch shares each CPU storage as one descriptor
(the file_descriptor strategy). Before packing, a learner of a population received every policy's weights tensor by
tensor (a recurrent Doom model has 35 state_dict entries: 8 policies made 288 descriptors) and could not be started.

    flat          [B]  uint8   the storage: CPU shared memory (one descriptor) or CUDA memory (one IPC handle, no
                               descriptor), B = the tensors' bytes, each rounded up to ALIGN
    views[name]   any          a view of `flat` with the tensor's dtype and shape, at an ALIGN-aligned byte offset
"""
from __future__ import annotations

import torch

ALIGN = 64  # bytes: every tensor starts on its own cache line, and at an offset any dtype can be viewed at


class PackedTensors:
    """Named tensors (any dtype and shape, each copied in; a meta tensor gives its shape and dtype only, its view is
    left uninitialised) as views of one flat byte tensor on `device`, in shared memory on CPU. Pickled (for a child
    process), only the flat tensor and the layout travel; the views are rebuilt."""

    def __init__(self, tensors: dict[str, torch.Tensor], device: str | torch.device = "cpu"):
        self.layout, offset = [], 0  # (name, dtype, shape, byte offset)
        for name, t in tensors.items():
            self.layout.append((name, t.dtype, tuple(t.shape), offset))
            offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        self.flat = torch.empty(max(offset, ALIGN), dtype=torch.uint8, device=device)  # a 0-byte storage is not shared
        if self.flat.device.type == "cpu":
            self.flat.share_memory_()  # before the views are taken: they must see the shared memory
        self.views = self._views()
        with torch.no_grad():
            for name, t in tensors.items():
                if not t.is_meta:
                    self.views[name].copy_(t)

    def _views(self) -> dict[str, torch.Tensor]:
        views = {}
        for name, dtype, shape, offset in self.layout:
            size = torch.Size(shape).numel() * dtype.itemsize
            views[name] = self.flat[offset:offset + size].view(dtype).view(shape)
        return views

    def __getstate__(self) -> dict:
        return {"flat": self.flat, "layout": self.layout}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.views = self._views()
