"""Helpers for the tests that run the real multi-process system (train.py, torchrun) in subprocesses: the repository
root, tiny-budget flags, starting a run and waiting on its log, its children's pids, leftover shared memory, a free
TCP port for a process group's rendezvous, a skip where an env cannot run here, and a fixture's directory made once
for the session's parallel processes."""
import contextlib
import datetime
import fcntl
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent

SMALL = ["--rollout", "8", "--recurrence", "8", "--batch_size", "64", "--rnn_size", "32", "--hidden_size", "32",
         "--encoder_mlp_layers", "32", "--num_envs_per_worker", "4", "--report_interval_sec", "1",
         "--experiment_summaries_interval", "1", "--device", "cpu"]


def train_args(tmp_path, env="test_corridor", *extra):
    return ["--env", env, "--experiment", "e2e", "--train_dir", str(tmp_path), *SMALL, *extra]


def start_train(args, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "w")
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=f"{ROOT / 'tests' / 'runner'}:{ROOT}")
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], stdout=log, stderr=subprocess.STDOUT,
                            cwd=ROOT, env=env)


def log_time(line: str) -> float:
    """The time of a run's console line, from its [YYYY-MM-DD HH:MM:SS] prefix (to the second)."""
    return datetime.datetime.strptime(line[1:20], "%Y-%m-%d %H:%M:%S").timestamp()


def tagged(tag: str) -> list[int]:
    """Live processes (zombies excluded) whose environment carries SF_TEST_RUN_TAG=tag (every process of a run)."""
    needle = f"SF_TEST_RUN_TAG={tag}".encode()
    found = []
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read() and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    found.append(pid)
        except (OSError, psutil.Error):
            pass
    return found


def trained_frames(text: str) -> int:
    """A data-parallel run's frames trained, as rank 0 of 2 last reported them (0 before its first report)."""
    found = re.findall(r"All 2 ranks: \d+ env frames collected \([\d.]+ frames/s\), (\d+) trained", text)
    return int(found[-1]) if found else 0


def wait_for(pred, timeout: float, what: str, log: Path | None = None):
    """Polls `pred` until it holds; on timeout fails with the end of the run's `log`, if given (what it was doing)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.2)
    tail = "\n" + log.read_text()[-6000:] if log is not None and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}{tail}")


def child_pids(log_path: Path) -> dict:
    pids = {}
    for line in log_path.read_text().splitlines():
        if "Started " in line and "(pid " in line:
            name = line.split("Started ")[1].split(" (pid")[0]
            pids[name] = int(line.split("(pid ")[1].rstrip(")"))
    return pids


def shm_files(vizdoom: bool = False) -> set:
    """/dev/shm's entries; VizDoom engines' ones only with `vizdoom` (a non-Doom run makes none, so those present are
    other runs' on a shared machine: the Doom tests check their own engines' files by instance id)."""
    return {n for n in os.listdir("/dev/shm") if vizdoom or not n.startswith("ViZDoom")}


def shm_left_behind(before: set, vizdoom: bool = False, settle: float = 20.0) -> set:
    """/dev/shm files (VizDoom engines' too with `vizdoom`) that appeared since `before` and that no live process holds,
    still there after up to `settle` seconds: once a run's processes are all gone, such a file is one it left behind.
    The files of tests running beside it (make test runs four at once) and of other users of the machine are held by
    their processes; a killed process's multiprocessing semaphores (sem.mp-*) are unlinked by its resource tracker
    once the last process sharing that tracker has exited, which under load can come seconds later."""
    from sf_envs.doom.engine_shm import mapped_or_open

    def unheld():
        new = shm_files(vizdoom) - before
        return {n for n in new - mapped_or_open(new) if os.path.exists(os.path.join("/dev/shm", n))} if new else set()
    deadline = time.time() + settle
    left = unheld()
    while left and time.time() < deadline:
        time.sleep(0.5)
        left = unheld()
    return left


def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """A directory that `make(dir)` fills (a trained experiment, say), made once for the whole session and copied for
    each caller. make test runs tests in 4 processes (pytest-xdist), each with module fixtures of its own: without
    this, an expensive fixture would be made again in every process that runs one of its module's tests. The first
    process to ask makes it under a file lock, the others wait for it; each gets a private copy, which its tests may
    change. Run alone (no pytest-xdist), it is made in this session's own temporary directory."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's directory, above each worker's own
    made = base / f"made_once_{name}"
    with open(base / f"made_once_{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (made / ".made").exists():
            shutil.rmtree(made, ignore_errors=True)  # a process whose make() failed halfway
            made.mkdir()
            make(made)
            (made / ".made").touch()
    copy = tmp_path_factory.mktemp(name)
    shutil.copytree(made, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".made"))
    return copy


def engine_files(engines: list) -> set:
    """The /dev/shm names of these VizDoom engine processes (psutil), from the instance ids on their command lines."""
    from sf_envs.doom.engine_shm import engine_shm_files
    names = set()
    for e in engines:
        names |= {f.name for f in engine_shm_files(e.cmdline())}
    return names


@contextlib.contextmanager
def cpu_hogs(n: int):
    """`n` CPU-bound processes beside the test (a busy shared machine), killed at the end."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield hogs
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def skip_if_unavailable(env: str):
    """Skips the test, with the reason, where `env` cannot run here (a package or its scenario data missing)."""
    from sf.cfg import default_cfg
    from sf_envs.registry import EnvUnavailableError, check_env_available
    try:
        check_env_available(default_cfg(env=env))
    except EnvUnavailableError as e:
        pytest.skip(str(e))
