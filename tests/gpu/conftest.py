"""tests/gpu: the CUDA paths (marker `gpu`; `make test-gpu` runs them). Every test here is marked gpu and, where torch
sees no CUDA device, skipped with the reason (pytest -ra lists it): the default run collects them and skips them."""
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
for helpers in (HERE.parent / "runner", HERE.parent / "learning", HERE.parent / "buffers",
                HERE.parent / "model"):  # the CPU tests' helpers
    if str(helpers) not in sys.path:
        sys.path.insert(0, str(helpers))


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config, items):
    built = f"with CUDA {torch.version.cuda}" if torch.version.cuda else "without CUDA"
    no_cuda = None if torch.cuda.is_available() else pytest.mark.skip(
        reason=f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, built {built})")
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if no_cuda is not None:
                item.add_marker(no_cuda)
