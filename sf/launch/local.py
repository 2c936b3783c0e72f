"""The local backend: the sweep's runs on this machine, up to --max_parallel at once, the machine's cores divided
between them.

Cores. The cores this process may use (os.sched_getaffinity) are split into --max_parallel contiguous shares (fewer
when fewer runs are left to start); a run is started with its CPU affinity set to its share, which every process of
train.py inherits: the rollout workers pin themselves round-robin within it (sf.processes.control.set_affinity) and
the learner sizes its threads from it. Unless the sweep gives --num_workers, a run gets one rollout worker per core of
its share. With more runs at once than cores, shares are single cores, shared round-robin.

Files. Each run's stdout and stderr go to <exp_dir>/launch.log (appended: a resumed run's lines follow the earlier
ones); <exp_dir>/launch.json records its state (sf.launch.state). <train_dir>/.launch/local.json names the launcher
(pid) and .launch/local.lock keeps a second launcher of the same sweep from starting the same runs twice.

Stopping. The first SIGINT (Ctrl-C) or SIGTERM is forwarded as SIGINT to every train.py, which writes a final
checkpoint and exits; no new run starts, and the launcher waits for them. A second one is forwarded again (train.py
then exits at once, ending its workers), a third kills them. The runs are in sessions of their own, so a terminal's
Ctrl-C reaches them only through the launcher (once), and each dies with SIGINT if the launcher itself is killed.

Again. Launching the same sweep again skips the runs that are done (sf.launch.state: from their files, without
starting them) and resumes the others from their latest checkpoint (train.py's --restart_behavior resume).
"""
from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from sf.launch.state import LAUNCH_DIR, LAUNCH_LOG, checkpoint_frames, last_line, process_start, read_launch, \
    run_state, write_launch
from sf.launch.sweep import Run, Sweep, SweepError, train_command
from sf.processes.control import StopRequests, die_with_parent
from sf.utils.files import write_json_atomic


def available_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def default_max_parallel(cores: int) -> int:
    """Runs at once when --max_parallel is not given: one per two cores (a learner and a rollout worker each)."""
    return max(1, cores // 2)


def core_shares(cores: list[int], n: int) -> list[list[int]]:
    """`cores` split into n contiguous shares as equal as possible; with n > len(cores), one core each, round-robin."""
    if n <= len(cores):
        return [cores[k * len(cores) // n:(k + 1) * len(cores) // n] for k in range(n)]
    return [[cores[k % len(cores)]] for k in range(n)]


def run_command(run: Run, share: list[int]) -> list[str]:
    """The command line of `run` on the cores `share`: train.py's arguments, with --num_workers fitted to the share
    unless the sweep gives it."""
    argv = list(run.argv)
    if "num_workers" not in run.explicit:
        argv += ["--num_workers", str(len(share))]
    return train_command() + argv


def _child_setup(share: list[int]) -> None:
    """In the child before exec: its cores (inherited by all of train.py's processes), and SIGINT when the launcher
    dies, so that a killed launcher leaves no run behind (each stops with its final checkpoint)."""
    os.sched_setaffinity(0, share)
    die_with_parent(signal.SIGINT)


class LocalLauncher:
    def __init__(self, sweep: Sweep, max_parallel: int, out=None):
        self.sweep, self.max_parallel, self.out = sweep, max_parallel, out
        self.procs: dict[str, tuple[subprocess.Popen, Run, int]] = {}  # name -> (process, run, slot)
        self.stop_requests = StopRequests()  # SIGINT/SIGTERM requests counted (signals)
        self.failed: list[str] = []
        self.interrupted: list[str] = []
        self.finished: list[str] = []

    def say(self, text: str) -> None:
        print(text, file=self.out or sys.stdout, flush=True)

    # --- plan ---
    def plan(self) -> tuple[list[Run], list[tuple[Run, str]]]:
        """(the runs to start, in order; [(run, why)] of those skipped: done, or running under another backend)."""
        todo, skipped = [], []
        for r in self.sweep.runs:
            st = run_state(r, read_events=False)
            if st.state == "done":
                skipped.append((r, f"done ({st.frames} frames)"))
            elif st.state in ("running", "queued"):
                skipped.append((r, f"{st.state} ({read_launch(r.exp_dir).get('backend', 'another launcher')})"))
            else:
                todo.append(r)
        return todo, skipped

    def dry_run(self) -> int:
        todo, skipped = self.plan()
        for r, why in skipped:
            self.say(f"skip {r.name}: {why}")
        n = min(self.max_parallel, len(todo))
        shares = core_shares(available_cores(), n) if n else []
        for i, r in enumerate(todo):
            share = shares[i % n]
            self.say(f"[cores {','.join(map(str, share))}] {shlex.join(run_command(r, share))}")
        self.say(f"{len(todo)} to run ({n} at once), {len(skipped)} skipped; nothing started (--dry_run)")
        return 0

    # --- run ---
    @property
    def signals(self) -> int:
        """Stop requests received so far (a signal repeated at once counts once: StopRequests)."""
        return self.stop_requests.count

    def _on_signal(self, signum, frame) -> None:
        if not self.stop_requests.receive(signum):  # the same request again (timeout: to the process and its group)
            return
        if self.signals == 1:
            self.say(f"{signal.Signals(signum).name}: stopping {len(self.procs)} run(s) (final checkpoints); "
                     "again to stop at once, a third time to kill")
        for p, _, _ in self.procs.values():
            try:
                os.kill(p.pid, signal.SIGINT if self.signals < 3 else signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _start(self, run: Run, share: list[int], slot: int) -> None:
        cmd = run_command(run, share)
        before = read_launch(run.exp_dir)
        wall_before = float(before.get("wall_before") or 0.0)
        if before.get("started") is not None and before.get("ended") is not None:
            wall_before += max(0.0, float(before["ended"]) - float(before["started"]))
        run.exp_dir.mkdir(parents=True, exist_ok=True)
        log = open(run.exp_dir / LAUNCH_LOG, "ab")
        try:
            env = dict(os.environ, **{str(k): str(v) for k, v in run.env_vars.items()})
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True, preexec_fn=lambda: _child_setup(share))
        finally:
            log.close()
        try:  # the affinity the process really has (set by _child_setup before exec), as a record to check
            cores = sorted(os.sched_getaffinity(p.pid))
        except OSError:  # it has exited already
            cores = share
        write_launch(run.exp_dir, backend="local", state="running", rc=None, job_id=None, pid=p.pid,
                     pid_start=process_start(p.pid), host=socket.gethostname(), started=time.time(), ended=None,
                     wall_before=wall_before, cores=cores,
                     num_workers=None if "num_workers" in run.explicit else len(share), command=cmd)
        self.procs[run.name] = (p, run, slot)
        if self.signals:  # a signal came while it started: it stops too
            os.kill(p.pid, signal.SIGINT)
        self.say(f"start {run.name} on cores {','.join(map(str, share))}: log {run.exp_dir / LAUNCH_LOG}")

    def _ended(self, name: str, rc: int) -> None:
        p, run, _ = self.procs.pop(name)
        budget_reached = run.budget is not None and checkpoint_frames(run.exp_dir, run.num_policies) >= run.budget
        if rc == 0 and (not self.signals or budget_reached):
            state = "done"
            self.finished.append(name)
            self.say(f"done {name}")
        elif self.signals and rc in (0, 130, -signal.SIGINT, -signal.SIGKILL):
            state = "interrupted"
            self.interrupted.append(name)
            self.say(f"interrupted {name} (exit code {rc}); launch the sweep again to resume it")
        else:
            state = "failed"
            self.failed.append(name)
            self.say(f"FAILED {name} (exit code {rc}): {last_line(run.exp_dir, failure=True)}")
        write_launch(run.exp_dir, state=state, rc=rc, ended=time.time())

    def _wait_any(self) -> None:
        """Block until a run's process exits (signals are handled meanwhile), then reap every one that did."""
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        for name, (p, _, _) in list(self.procs.items()):
            rc = p.poll()
            if rc is not None:
                self._ended(name, rc)

    def run(self) -> int:
        todo, skipped = self.plan()
        for r, why in skipped:
            self.say(f"skip {r.name}: {why}")
        n = min(self.max_parallel, len(todo))
        if not n:
            self.say(f"nothing to run: {len(skipped)} run(s) skipped")
            return 0
        shares = core_shares(available_cores(), n)
        self.say(f"{len(todo)} run(s), {n} at once on cores {','.join(map(str, available_cores()))}; "
                 f"{len(skipped)} skipped; Ctrl-C stops them all (final checkpoints)")
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        start = time.time()
        try:
            queue = list(todo)
            while queue or self.procs:
                while queue and not self.signals and len(self.procs) < n:
                    busy = {slot for _, _, slot in self.procs.values()}
                    slot = next(k for k in range(n) if k not in busy)
                    self._start(queue.pop(0), shares[slot], slot)
                if not self.procs:
                    break  # stopped before the queue emptied
                self._wait_any()
        finally:
            for p, _, _ in self.procs.values():  # an error of the launcher's own: leave nothing running
                try:
                    os.kill(p.pid, signal.SIGINT)
                    p.wait()
                except (ProcessLookupError, OSError):
                    pass
            for s, h in old.items():
                signal.signal(s, h)
        not_started = len(todo) - len(self.finished) - len(self.failed) - len(self.interrupted)
        self.say(f"{len(self.finished)} done, {len(self.failed)} failed, {len(self.interrupted)} interrupted, "
                 f"{not_started} not started, {len(skipped)} skipped, in {time.time() - start:.0f} s"
                 + (f"; failed: {', '.join(self.failed)}" if self.failed else ""))
        if self.failed:
            return 1
        return 130 if self.signals else 0


class SweepLock:
    """<train_dir>/.launch/local.lock held while a launcher runs the sweep; local.json names it (for --cancel)."""

    def __init__(self, sweep: Sweep):
        self.dir = sweep.train_dir / LAUNCH_DIR
        self.fd: Optional[int] = None

    def __enter__(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.dir / "local.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            other = launcher_record(self.dir.parent)
            raise SweepError(f"the sweep in {self.dir.parent} is being run by another launcher (pid "
                             f"{other.get('pid', '?')}); --status shows it, --cancel stops it") from None
        write_json_atomic(self.dir / "local.json", {"pid": os.getpid(), "pid_start": process_start(os.getpid()),
                                                     "host": socket.gethostname(), "started": time.time()})
        return self

    def __exit__(self, *exc):
        try:
            (self.dir / "local.json").unlink()
        except OSError:
            pass
        os.close(self.fd)


def launcher_record(train_dir: Path) -> dict:
    try:
        return json.loads((Path(train_dir) / LAUNCH_DIR / "local.json").read_text())
    except (OSError, ValueError):
        return {}


def launch(sweep: Sweep, max_parallel: int, dry_run: bool = False, out=None) -> int:
    """Run the sweep (or print what would run); returns the exit code: 0 all done, 1 a run failed, 130 stopped by a
    signal."""
    launcher = LocalLauncher(sweep, max_parallel, out)
    if dry_run:
        return launcher.dry_run()
    with SweepLock(sweep):
        return launcher.run()


def cancel(sweep: Sweep, out=None) -> int:
    """Stop the local launcher running this sweep (SIGTERM: its runs stop after their final checkpoints)."""
    rec = launcher_record(sweep.train_dir)
    pid = rec.get("pid")
    if not isinstance(pid, int) or rec.get("host") != socket.gethostname() or \
            process_start(pid) != rec.get("pid_start"):
        print(f"no local launcher is running the sweep in {sweep.train_dir}", file=out or sys.stdout)
        return 0
    os.kill(pid, signal.SIGTERM)
    print(f"sent SIGTERM to the launcher (pid {pid}): its runs stop after their final checkpoints",
          file=out or sys.stdout)
    return 0
