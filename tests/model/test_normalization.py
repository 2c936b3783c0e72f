"""sf.model.normalization.PixelMeanStd, the per-pixel normalizer of raw frames, against naive float64 oracles of
Sample Factory's definition: statistics of the preprocessed frames p = (x - subtract) / scale, merged batch by batch
(parallel Welford), and normalize(x) = clamp((p - mean) / sqrt(var + eps), -5, 5)."""
import torch

from sf.model.normalization import PixelMeanStd, RunningMeanStd

SHAPE = (3, 4, 5)


def frames(n, seed=0):
    """[n, 3, 4, 5] uint8 with the hard cases: a pixel always 255 (the largest squares), one always 0, one constant
    mid-grey (variance exactly 0), the rest uniform."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, *SHAPE), dtype=torch.uint8, generator=g)
    x[:, 0, 0, 0], x[:, 1, 1, 1], x[:, 2, 3, 4] = 255, 0, 77
    return x


def naive_moments(x, subtract, scale):
    p = (x.double() - subtract) / scale
    return p.mean(0), p.var(0, unbiased=False)


def test_batch_moments_of_uint8_frames_are_exact_beyond_one_chunk():
    """700 frames: three float32 chunks (256, 256, 188) summed in float64 give the float64 oracle's moments to
    rounding (the generic path's float32 conversion would not), and a constant pixel's variance exactly 0."""
    norm = PixelMeanStd(SHAPE, subtract=10.0, scale=100.0)
    x = frames(700)
    mean, var = norm._batch_moments(x)
    ref_mean, ref_var = naive_moments(x, 10.0, 100.0)
    torch.testing.assert_close(mean, ref_mean, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(var, ref_var, rtol=1e-11, atol=1e-15)
    assert var[2, 3, 4] == 0.0 and mean[0, 0, 0] == (255 - 10) / 100


def test_updates_match_a_running_mean_std_fed_preprocessed_frames():
    """Batches [B, T, C, H, W] with a validity mask: the same buffers (and state_dict keys) as RunningMeanStd fed
    the preprocessed valid frames; float frames take the generic path to the same result."""
    pix, ref, pix_float = PixelMeanStd(SHAPE, 0.0, 255.0), RunningMeanStd(SHAPE), PixelMeanStd(SHAPE, 0.0, 255.0)
    assert pix.state_dict().keys() == ref.state_dict().keys()
    for seed in range(3):
        x = frames(6 * 7, seed).reshape(6, 7, *SHAPE)
        valid = torch.rand(6, 7, generator=torch.Generator().manual_seed(seed)) > 0.3
        pix.update(x, valid)
        pix_float.update(x.float(), valid)
        ref.update(x.double() / 255.0, valid)
    for a in (pix, pix_float):
        torch.testing.assert_close(a.mean, ref.mean, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(a.var, ref.var, rtol=1e-5, atol=1e-7)
        assert float(a.count) == float(ref.count)


def test_normalize_raw_frames_as_the_definition():
    """One multiply-add per element equals (p - mean) / sqrt(var + eps), clamped at ±5, to float32 rounding of x * a
    (up to ~1e-4 where the variance is near 0 and 1 / sqrt(var + eps) near 316; preprocessing in float32, then
    normalizing, errs as much); the caller's tensor is not modified (a float32 input is copied, not normalized in
    place)."""
    norm = PixelMeanStd(SHAPE, subtract=10.0, scale=100.0)
    norm.update(frames(300))
    x = frames(50, seed=1)
    p = (x.double() - 10.0) / 100.0
    want = ((p - norm.mean.double()) / torch.sqrt(norm.var.double() + 1e-5)).clamp(-5, 5)
    torch.testing.assert_close(norm(x).double(), want, rtol=0, atol=1e-4)
    assert norm(x)[:, 2, 3, 4].abs().max() <= 5.0  # (variance 0: clamped, not inf)
    xf = x.float()
    before = xf.clone()
    torch.testing.assert_close(norm(xf), norm(x))
    assert torch.equal(xf, before)


def test_data_parallel_ranks_merge_pixel_moments_to_the_union_batch():
    """With gather_moments (sf.learning.collectives'; here an in-process stand-in returning both ranks' rows in rank
    order), each rank sends its own batch's row, and both ranks end bitwise alike and equal to one normalizer fed the
    union batch; a rank whose batch is all invalid sends a zero-count row and still merges the other's."""
    halves = [frames(40, seed=3), frames(24, seed=4)]

    def row(x):
        mean, var = PixelMeanStd(SHAPE, 0.0, 255.0)._batch_moments(x)
        return torch.cat([torch.tensor([float(x.shape[0])], dtype=torch.float64), mean.reshape(-1), var.reshape(-1)])
    both = torch.stack([row(h) for h in halves])
    ranks = [PixelMeanStd(SHAPE, 0.0, 255.0) for _ in halves]
    for r, (norm, half) in enumerate(zip(ranks, halves)):
        def gather(mine, r=r):
            assert torch.equal(mine, both[r])
            return both
        norm.gather_moments = gather
        norm.update(half)
    union = PixelMeanStd(SHAPE, 0.0, 255.0)
    union.update(torch.cat(halves))
    for k in ("mean", "var", "count"):
        assert torch.equal(getattr(ranks[0], k), getattr(ranks[1], k)), k
        torch.testing.assert_close(getattr(ranks[0], k), getattr(union, k), rtol=1e-6, atol=1e-7)
    ranks[0].gather_moments = lambda mine: torch.stack([mine, both[1]])
    ranks[0].update(halves[0], valid=torch.zeros(40, dtype=torch.bool))
    assert float(ranks[0].count) == 64 + 24
