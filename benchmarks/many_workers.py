#!/usr/bin/env python
"""The paper's 72 workers on this machine: `train.py --env doom_battle --num_workers 72`, measured as a user sees it.

For each system (ours, and Sample Factory 2.1.1 as the baseline when its interpreter is given), in one invocation:
seconds to the first collected frames, frames/s after two minutes (mean over the console's 60-s window at that point),
peak PSS of the whole process tree (PSS: shared pages split among the processes that share them, so the sum is the
memory the run really takes), and after SIGINT to the process group (what Ctrl-C in a terminal does): seconds until
the run exited, its exit code, whether a traceback was printed, and what was left (processes, /dev/shm files).

    python benchmarks/many_workers.py --minutes 2.5
    python benchmarks/many_workers.py --sf_python /work/sfbaseline/bin/python      # with the baseline beside it
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from common import header, table  # noqa: E402

# Ours: "Fps is (10 sec: ..., 60 sec: ...). Total num frames: N."; Sample Factory 2.1.1: "Fps is (10 sec: ..., 60 sec:
# ..., 300 sec: ...). Total num frames: N."
FPS60_RE = re.compile(r"Fps is \(10 sec: [\d.na]+, 60 sec: ([\d.na]+).*?Total num frames: (\d+)")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")  # Sample Factory colours its console lines, also into a file


def read_log(path: Path) -> str:
    return ANSI_RE.sub("", path.read_text(errors="replace"))


def tree_pss(tag: str) -> int:
    """Sum of PSS (bytes) over every live process whose environment carries the run's tag."""
    needle, total = f"SF_BENCH_TAG={tag}".encode(), 0
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
        except OSError:
            pass
    return total


def tagged(tag: str) -> list[int]:
    needle = f"SF_BENCH_TAG={tag}".encode()
    out = []
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read() and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
        except (OSError, psutil.Error):
            pass
    return out


def measure(name: str, cmd: list[str], cwd: str, seconds: float) -> dict:
    tag = uuid.uuid4().hex
    shm_before = set(os.listdir("/dev/shm"))
    log_path = Path(tempfile.mkdtemp()) / f"{name}.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", SF_BENCH_TAG=tag)
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                         start_new_session=True)
    first, peak, fps_at = None, 0, float("nan")
    while time.time() - t0 < seconds and p.poll() is None:
        peak = max(peak, tree_pss(tag))
        reports = FPS60_RE.findall(read_log(log_path))
        if first is None and any(int(frames) > 0 for _, frames in reports):
            first = time.time() - t0
        time.sleep(2.0)
    reports = FPS60_RE.findall(read_log(log_path))
    if reports and reports[-1][0] != "nan":
        fps_at = float(reports[-1][0])
    t_stop = time.time()
    try:
        os.killpg(p.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = "hung"
    stop_s = time.time() - t_stop
    time.sleep(3.0)  # what is still there a few seconds after the run's own exit
    left = tagged(tag)
    shm_left = set(os.listdir("/dev/shm")) - shm_before
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    text = read_log(log_path)
    return {"system": name, "first_frames_s": "never" if first is None else f"{first:.0f}",
            "fps_at_end": f"{fps_at:.0f}", "peak_pss_gib": f"{peak / 2**30:.1f}", "stop_s": f"{stop_s:.1f}",
            "exit": rc, "traceback": "yes" if "Traceback" in text else "no",
            "left": f"{len(left)} proc, {len(shm_left)} shm", "log": str(log_path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=2.5, help="how long each system trains before Ctrl-C")
    parser.add_argument("--num_workers", type=int, default=72)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--sf_python", default=None, help="python of a Sample Factory 2.1.1 install (the baseline)")
    args = parser.parse_args()
    header(f"{args.num_workers} rollout workers on this machine: "
           f"train.py --env {args.env} --num_workers {args.num_workers}")
    seconds = args.minutes * 60
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        ours = [sys.executable, str(ROOT / "train.py"), "--env", args.env, "--num_workers", str(args.num_workers),
                "--train_dir", tmp, "--experiment", "many_workers"]
        runs.append(measure("ours", ours, str(ROOT), seconds))
        if args.sf_python:
            sf = [args.sf_python, "-m", "sf_examples.vizdoom.train_vizdoom", f"--env={args.env}",
                  f"--num_workers={args.num_workers}", "--device=cpu", f"--train_dir={tmp}/sf",
                  "--experiment=many_workers", "--restart_behavior=overwrite"]
            runs.append(measure("sample_factory_2.1.1", sf, tmp, seconds))
    keys = ["system", "first_frames_s", "fps_at_end", "peak_pss_gib", "stop_s", "exit", "traceback", "left"]
    print(table([[r[k] for k in keys] for r in runs], keys))
    if len(runs) == 2 and runs[1]["fps_at_end"] != "nan":
        print(f"\nframes/s ratio ours / Sample Factory: "
              f"{float(runs[0]['fps_at_end']) / float(runs[1]['fps_at_end']):.2f}; "
              f"peak PSS ratio: {float(runs[0]['peak_pss_gib']) / max(float(runs[1]['peak_pss_gib']), 1e-9):.2f}")
    print("\nlogs: " + ", ".join(r["log"] for r in runs))


if __name__ == "__main__":
    main()
