"""Helpers shared by the benchmark scripts: machine description, running train.py, reading its output."""
from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FPS_RE = re.compile(r"Fps is \(10 sec: ([\d.na]+), 60 sec: ([\d.na]+), 300 sec: ([\d.na]+)\)")
LAG_RE = re.compile(r"Policy lag \(min: ([\d.na-]+), avg: ([\d.na-]+), max: ([\d.na-]+)\)")


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except ImportError:
        gpu = "torch missing"
    return f"{os.cpu_count()} cores, {cpu}, {gpu}, Python {platform.python_version()}"


def header(title: str) -> None:
    print(f"# {title}")
    print(f"machine: {machine()}")
    print(f"command: {' '.join([Path(sys.executable).name] + sys.argv)}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M:%S')}\n")


def run_train(args: list[str], train_dir: str, timeout: float) -> dict:
    """Run train.py; return the FPS (10 s windows, after the first report), lag and the last reward seen."""
    cmd = [sys.executable, str(ROOT / "train.py"), "--train_dir", train_dir, "--restart_behavior", "overwrite",
           "--report_interval_sec", "5", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT).stdout
    fps = [float(m.group(1)) for m in FPS_RE.finditer(out) if m.group(1) != "nan"][1:]
    lags = [float(m.group(2)) for m in LAG_RE.finditer(out) if m.group(2) != "nan"]
    rss = re.findall(r"rss", out)
    return {"fps_median": statistics.median(fps) if fps else float("nan"), "fps_samples": fps,
            "lag_avg": statistics.mean(lags) if lags else float("nan"), "log": out, "rss": rss}


def table(rows: list[list], headers: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    fmt = " | ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers), "-|-".join("-" * w for w in widths)]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(lines)
