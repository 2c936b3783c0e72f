"""Per-pixel input normalization (--normalize_input_keys obs): milliseconds per batch of Doom frames, one torch
thread, sf.model.normalization.PixelMeanStd (fed raw uint8 frames) against the generic RunningMeanStd fed
preprocessed float32 frames (this project's path before 2026-11-28, the same definition as Sample Factory's).

    python benchmarks/pixel_normalization.py                 # [1024, 3, 72, 128], 7 repeats, medians
    python benchmarks/pixel_normalization.py --frames 2048 --repeats 11

Rows: `update` (merge a batch's statistics: the learner, once per batch) and `normalize` (the learner's forward, once
per minibatch and epoch, and every policy worker's inference batch). The generic path includes the preprocessing
(x / 255 in float32) it needs first.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from common import header, table  # noqa: E402
from sf.model.normalization import PixelMeanStd, RunningMeanStd  # noqa: E402

SHAPE = (3, 72, 128)  # the Doom presets' screen


def median_ms(fn, repeats: int) -> float:
    fn()  # (warm-up: allocator, first-touch pages)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    if args.frames < 1 or args.repeats < 1:
        p.error("--frames and --repeats: at least 1")
    torch.set_num_threads(1)
    header(f"Per-pixel normalization of {args.frames} frames {list(SHAPE)}, one thread")
    x = torch.randint(0, 256, (args.frames, *SHAPE), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    generic, pixel = RunningMeanStd(SHAPE), PixelMeanStd(SHAPE, 0.0, 255.0)
    pre = lambda: x.to(torch.float32) * (1.0 / 255.0)  # noqa: E731  (the generic path's input)
    generic.update(pre())
    pixel.update(x)
    rows = []
    for name, old, new in [("update", lambda: generic.update(pre()), lambda: pixel.update(x)),
                           ("normalize", lambda: generic.normalize(pre()), lambda: pixel.normalize(x))]:
        a, b = median_ms(old, args.repeats), median_ms(new, args.repeats)
        rows.append([name, f"{a:.1f}", f"{b:.1f}", f"{a / b:.2f}x"])
    print(table(rows, ["step", "generic ms (baseline)", "PixelMeanStd ms", "speed-up"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
