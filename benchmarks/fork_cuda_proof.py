"""Proof that a worker forked from the runner's fork server can train on the device (gpu_check.sh's first stage).

    python benchmarks/fork_cuda_proof.py --device cuda --env doom_battle
    python benchmarks/fork_cuda_proof.py --device cpu --env doom_basic      # the same path on the CPU (CI's dry-run)

Does what the runner does before it starts a learner (sf/runner/runner.py): resolves the env's config, makes one env
in this process to learn which modules it imports (preflight.probe_env), starts the fork server with them preloaded
(supervision.worker_context), and forks a worker through supervision.child_main, the entry point of every worker.
That worker runs forward, backward and Adam steps of a small conv net on the device and sends back its losses.

Why: a fork server that initialized CUDA (while importing torch, the env or the workers' modules, or in its warm-up)
hands a broken CUDA to every worker it forks ("Cannot re-initialize CUDA in forked subprocess"); only a worker forked
from the real fork server, with the real preload, shows it. Prints one line with the device, the worker's process
name and the losses; exit status 0 when the loss fell, 1 (one line saying why) otherwise.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from queue import Empty

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STEPS = 20


def train_steps(device: str, results) -> None:
    """In the forked worker: STEPS Adam steps of a conv net on a fixed batch of Doom-sized frames on `device`."""
    import psutil
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    dev = torch.device(device)
    model = torch.nn.Sequential(  # the paper's convnet_simple shape, narrower: the device is the point, not the speed
        torch.nn.Conv2d(3, 16, 8, stride=4), torch.nn.ELU(), torch.nn.Conv2d(16, 32, 4, stride=2), torch.nn.ELU(),
        torch.nn.Flatten(), torch.nn.LazyLinear(64), torch.nn.ELU(), torch.nn.Linear(64, 7)).to(dev)
    frames = torch.randint(0, 256, (64, 3, 72, 128), dtype=torch.uint8, device=dev)
    targets = torch.randint(0, 7, (64,), device=dev)
    model(frames[:1].float())  # materializes LazyLinear before the optimizer takes the parameters
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(STEPS):
        loss = F.cross_entropy(model(frames.float() / 255.0), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # a device-to-host copy each step: an asynchronous CUDA error surfaces here
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "host"
    results.put({"pid": os.getpid(), "parent": os.getppid(),
                 "preloaded": "sf.runner.startup.fork_server" in sys.modules,
                 "name": psutil.Process().name(), "device": str(next(model.parameters()).device), "where": where,
                 "first": losses[0], "last": losses[-1]})


def env_modules(env: str | None) -> list[str]:
    """The modules the runner's fork server would preload for `env` (none without one)."""
    if not env:
        return []
    from sf.cfg.parse import parse_cfg
    from sf.runner.startup.preflight import probe_env
    with tempfile.TemporaryDirectory() as td:  # a fresh train_dir: no saved config is layered in
        cfg = parse_cfg(["--env", env, "--train_dir", td, "--experiment", "fork_proof", "--num_workers", "1"])
        return probe_env(cfg)[3]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: cuda)")
    ap.add_argument("--env", default=None, help="probe this env first, as the runner does, and preload its modules "
                                                "in the fork server (default: none)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the worker (default: 120)")
    args = ap.parse_args()
    # as train.py: torch.cuda.is_available() asks NVML instead of initializing CUDA in this process
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    from sf.ipc import Queue
    from sf.runner.startup.supervision import child_main, worker_context
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"fork proof: FAIL: --device {args.device} but torch {torch.__version__} sees no CUDA device")
        return 1
    start = time.monotonic()
    try:
        modules = env_modules(args.env)
    except Exception as e:  # noqa: BLE001 - one line: the env (vizdoom, scenario data) is not usable here
        print(f"fork proof: FAIL: env {args.env} cannot be made: {str(e).splitlines()[0] if str(e) else repr(e)}")
        return 1
    print(f"fork proof: fork server preloads {', '.join(modules) or 'no env modules'}; forking a worker that trains "
          f"on {args.device}", flush=True)
    ctx = worker_context(modules)
    # the runner's own queue (the C++ shared-memory queue, sf.ipc): a put is done when it returns, so a worker's
    # traceback arrives even though child_main exits at once after it
    report, results = Queue(), Queue()
    p = ctx.Process(target=child_main, args=("learner", report, os.getpid(), False, train_steps, args.device, results),
                    name="learner", daemon=False)
    p.start()
    r, deadline = None, time.monotonic() + args.timeout
    while r is None and time.monotonic() < deadline:
        try:
            r = results.get(timeout=0.5)
        except Empty:
            if not p.is_alive():
                break
    p.join(10)
    hung = p.is_alive()
    if hung:
        p.kill()
        p.join(5)
    if r is None:
        why = f"no result within {args.timeout:.0f} s" if hung else f"exit code {p.exitcode}"
        try:  # child_main sends the worker's traceback to the runner's report queue; its last line says why
            while True:
                msg = report.get(timeout=0.5)
                if msg[0] == "error":
                    why = msg[2].strip().splitlines()[-1]
                    break
        except Empty:
            pass
        print(f"fork proof: FAIL: the forked worker did not train on {args.device}: {why}")
        return 1
    import multiprocessing.forkserver
    server = multiprocessing.forkserver._forkserver._forkserver_pid  # private, stable since Python 3.4
    forked = r["parent"] == server and r["preloaded"]  # a child of the fork server, with its preload
    ok = (p.exitcode == 0 and forked and r["last"] < r["first"]
          and r["device"].split(":")[0] == args.device.split(":")[0])
    origin = "forked from the fork server" if forked else f"NOT a child of the fork server (pid {server})"
    print(f"fork proof: {'PASS' if ok else 'FAIL'}: worker {r['name']} (pid {r['pid']}, {origin}) "
          f"trained on {r['device']} ({r['where']}): loss {r['first']:.3f} -> {r['last']:.3f} in {STEPS} Adam steps, "
          f"exit code {p.exitcode}, {time.monotonic() - start:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
