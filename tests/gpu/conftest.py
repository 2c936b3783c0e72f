"""tests/gpu: the CUDA paths (marker `gpu`; `make test-gpu` runs them). Every test here is marked gpu and, where torch
sees no CUDA device, skipped with the reason (pytest -ra lists it): the default run collects them and skips them.

SF_GPU_TESTS_DEVICE=cpu runs the tests marked `any_device` (their logic holds on either device: they take the fixture
`device`) on the CPU, so that they are checked on every machine and do not rot between the rare runs on a GPU; the
others are skipped ("CUDA only")."""
import os
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
for helpers in (HERE.parent / "runner", HERE.parent / "learning", HERE.parent / "buffers",
                HERE.parent / "model"):  # the CPU tests' helpers
    if str(helpers) not in sys.path:
        sys.path.insert(0, str(helpers))

DEVICE_VAR = "SF_GPU_TESTS_DEVICE"


def _on_cpu() -> bool:
    value = os.environ.get(DEVICE_VAR, "")
    if value not in ("", "cpu", "cuda"):  # a typo would otherwise run the CUDA tests, or skip them all, unnoticed
        raise pytest.UsageError(f"{DEVICE_VAR}={value!r}: expected cpu, cuda or unset")
    return value == "cpu"


@pytest.fixture(scope="session")
def device() -> str:
    """The device the `any_device` tests run on: cuda, or cpu under SF_GPU_TESTS_DEVICE=cpu."""
    return "cpu" if _on_cpu() else "cuda"


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config, items):
    on_cpu = _on_cpu()
    built = f"with CUDA {torch.version.cuda}" if torch.version.cuda else "without CUDA"
    no_cuda = None if on_cpu or torch.cuda.is_available() else pytest.mark.skip(
        reason=f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, built {built})")
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if on_cpu and item.get_closest_marker("any_device") is None:
                item.add_marker(pytest.mark.skip(reason="CUDA only"))
            elif no_cuda is not None:
                item.add_marker(no_cuda)
