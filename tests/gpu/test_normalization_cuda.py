"""sf.model.normalization.PixelMeanStd on the device (the learner updates it there; policy workers normalize there):
its moments come from exact integer sums, so the device's statistics equal the CPU's bit for bit, whatever the device's
reduction order; its normalization agrees to float32 rounding. CPU oracle: tests/model/test_normalization.py."""
import pytest
import torch

from sf.model.normalization import PixelMeanStd

pytestmark = pytest.mark.gpu


@pytest.mark.any_device
def test_pixel_statistics_on_the_device_equal_the_cpus_bitwise(device):
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (n, 3, 72, 128), dtype=torch.uint8, generator=g) for n in (700, 64)]
    cpu, dev = PixelMeanStd((3, 72, 128), 0.0, 255.0), PixelMeanStd((3, 72, 128), 0.0, 255.0).to(device)
    for x in batches:
        cpu.update(x)
        dev.update(x.to(device), valid=torch.ones(x.shape[0], dtype=torch.bool, device=device))
    for k in ("mean", "var", "count"):
        assert getattr(dev, k).device.type == torch.device(device).type
        assert torch.equal(getattr(dev, k).cpu(), getattr(cpu, k)), k
    x = batches[1]
    torch.testing.assert_close(dev(x.to(device)).cpu(), cpu(x), rtol=0, atol=1e-4)
