#!/usr/bin/env python
"""Chaos benchmark (self-healing): a run whose processes die or hang at random still trains to its budget.

For each signal, two train.py runs with the same flags (doom_basic, the default layout, --train_for_seconds
minutes x 60) train side by side in this invocation: the disturbed one gets, every --interval seconds from its learner's
first training step until --interval seconds before the end of its budget, SIGKILL (a crash) or SIGSTOP (a hung
process: the run's stall watchdog must kill and replace it after --stall_timeout_sec) sent to one random process of a
kind, kinds coming in shuffled rounds of (rollout worker, policy worker, learner); the calm one is the yardstick.
Checks, one table per signal, each PASS or FAIL:
  1. both runs exit with code 0 (the budget reached);
  2. restarts = signals sent, kind by kind: the disturbed run's `Restarted` lines, its final `Faults:` line and its
     faults/restarts_* TensorBoard series agree with the schedule (and the calm run restarted nothing);
  3. frames/s of the disturbed run (its `Done:` line) >= 0.85 of the calm run's;
  4. no orphan: no process of either run alive once both exited;
  5. /dev/shm: no entry left behind;
  6. the disturbed run's average reward (TensorBoard reward/reward, over a full window of 100 episodes) reaches 0.75
     within 1M env frames.
Exit code 0 only if every check of every experiment passed.

    python benchmarks/chaos.py                                    # SIGKILL, then SIGSTOP, 10 minutes each
    python benchmarks/chaos.py --signal STOP --train_dir /tmp/chaos   # keep the experiment directories

Processes of a run are recognised by a tag in their environment, which every descendant inherits (workers, the fork
server, VizDoom engines), not by parent links, which a death rewires; the machine may be shared, so a process or a
/dev/shm entry of somebody else's is never taken for a run's.
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import FPS_RE, header, table  # noqa: E402
from learning_doom_basic import REPORT_RE  # noqa: E402
from sf.runner.stats import read_event_scalars  # noqa: E402

KINDS = ("rollout_worker", "policy_worker", "learner")  # the process kinds of a run, as its process names begin
SIGNALS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP}
FPS_RATIO_MIN = 0.85
REWARD_TARGET, REWARD_WITHIN = 0.75, 1_000_000
FULL_WINDOW = 100  # episodes: train.py's default --stats_avg, the window of reward/reward
TAG_VAR = "CHAOS_RUN_TAG"
SETTLE_S = 10.0  # after a run exits: time for its last engines to go and their shared memory to be unlinked

STARTED_RE = re.compile(r"\bStarted (\S+) \(pid (\d+)\)")
RESTARTED_RE = re.compile(r"\bRestarted (\S+) \(pid (\d+)\) after it (.+?): restart \d+ of")
FAULTS_RE = re.compile(r"\bFaults: (\d+) restarts \(rollout workers (\d+), policy workers (\d+), learners (\d+)\), "
                       r"(\d+) env frames lost")
DONE_RE = re.compile(r"\bDone: (\d+) env frames in (.+?) \(([\d.]+) frames/s\)")


def kind_of(name: str) -> str | None:
    """'rollout_worker_3' -> 'rollout_worker', 'policy_worker_0' -> 'policy_worker', 'learner' -> 'learner'."""
    return next((k for k in KINDS if name == k or name.startswith(k + "_")), None)


def by_kind(counts: dict[str, int | None]) -> str:
    """'a / b / c' in the order of KINDS; '-' for a figure the run did not give."""
    return " / ".join("-" if counts.get(k) is None else str(counts[k]) for k in KINDS)


def tagged_processes(tags: set[str]) -> list[tuple[psutil.Process, str]]:
    """Live processes (zombies excluded) whose environment carries one of `tags`, with the tag. Processes whose
    environment cannot be read (another user's) are skipped: they are not ours."""
    found = []
    for p in psutil.process_iter():
        try:
            tag = p.environ().get(TAG_VAR)
            if tag in tags and p.status() != psutil.STATUS_ZOMBIE:
                found.append((p, tag))
        except psutil.Error:
            continue
    return found


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm"))


def wait_until(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


@dataclass
class Disturbance:
    t: float  # seconds since the disturbed run was launched
    kind: str
    name: str | None  # None: no live, running process of the kind at that moment (nothing sent)
    pid: int | None


class Run:
    """One train.py run. Its console is followed line by line in a thread (a pipe nobody drains would block the run's
    logging), keeping the lines and the pid of each process's current incarnation from the `Started` lines."""

    def __init__(self, name: str, flags: list[str], train_dir: str):
        self.name = name
        self.tag = f"{name}-{uuid.uuid4().hex}"
        self.exp_dir = Path(train_dir) / name
        self.lines: list[str] = []
        self.pids: dict[str, int] = {}
        self.lock = threading.Lock()
        self.trained = threading.Event()  # the first FPS figure: the learner has trained on a batch
        self.rc: int | str | None = None
        env = dict(os.environ, PYTHONUNBUFFERED="1", **{TAG_VAR: self.tag})
        self.t0 = time.monotonic()
        # a session of its own: a timeout can stop the whole process group, and Ctrl-C here stops the runs in `abort`
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), "--experiment", name, "--train_dir", train_dir, *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1, cwd=ROOT,
            env=env, start_new_session=True)
        self.reader = threading.Thread(target=self._follow, name=f"follow_{name}", daemon=True)
        self.reader.start()

    def _follow(self) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            m = STARTED_RE.search(line) or RESTARTED_RE.search(line)
            with self.lock:
                self.lines.append(line)
                if m:
                    self.pids[m.group(1)] = int(m.group(2))
            m = FPS_RE.search(line)
            if m and m.group(1) != "nan":
                self.trained.set()

    def text(self) -> str:
        with self.lock:
            return "\n".join(self.lines)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_one(self, kind: str, sig: signal.Signals, rng: random.Random) -> Disturbance:
        """Sends `sig` to a random live, running process of `kind` and says which. One already stopped (SIGSTOP, its
        watchdog not yet come), dead and not yet replaced, or a pid no longer the run's is not a candidate."""
        with self.lock:
            candidates = sorted((n, p) for n, p in self.pids.items() if kind_of(n) == kind)
        candidates = [(n, p) for n, p in candidates if self._running(p)]
        t = time.monotonic() - self.t0
        if not candidates:
            return Disturbance(t, kind, None, None)
        name, pid = rng.choice(candidates)
        os.kill(pid, sig)
        return Disturbance(t, kind, name, pid)

    def _running(self, pid: int) -> bool:
        try:
            p = psutil.Process(pid)
            return p.environ().get(TAG_VAR) == self.tag and p.status() not in (
                psutil.STATUS_ZOMBIE, psutil.STATUS_STOPPED, psutil.STATUS_DEAD)
        except psutil.Error:
            return False

    def finish(self, deadline: float) -> None:
        """Waits for the exit until `deadline` (monotonic); past it, the run is stopped (`abort`) and its exit code
        reads 'timeout'."""
        try:
            self.rc = self.proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            self.abort()
            self.rc = "timeout"
        self.reader.join(timeout=SETTLE_S)  # an orphan holding the pipe would keep it open: not forever

    def abort(self) -> None:
        """A run still alive: SIGINT (an ordered stop: final checkpoint, children stopped), SIGKILL to its process group
        if that takes more than 30 s."""
        if not self.alive():
            return
        print(f"stopping {self.name} (pid {self.proc.pid})", flush=True)
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass


def disturb(run: Run, sig: signal.Signals, interval: float, budget: float, rng: random.Random) -> list[Disturbance]:
    """The schedule: from the learner's first training step (start-up is not what is being tested), a disturbance every
    `interval` s until `interval` s before the end of the budget, so the last one too has time to heal before the run
    stops. Kinds come in shuffled rounds of KINDS: each about equally often, all three within any round."""
    while not run.trained.wait(1.0):
        if not run.alive() or time.monotonic() > run.t0 + budget:  # died, or never trained: nothing to disturb
            return []
    # --train_for_seconds counts from train.py's own start, a little after the launch: this stops early, never late
    stop_at = run.t0 + budget - interval
    done: list[Disturbance] = []
    kinds: list[str] = []
    next_at = time.monotonic()
    while run.alive() and next_at <= stop_at:
        if time.monotonic() < next_at:
            time.sleep(min(next_at - time.monotonic(), 1.0))  # a second at a time: notice the run's end
            continue
        if not kinds:
            kinds = list(KINDS)
            rng.shuffle(kinds)
        d = run.signal_one(kinds.pop(), sig, rng)
        done.append(d)
        what = f"{d.name} (pid {d.pid})" if d.name else f"no running {d.kind}: skipped"
        print(f"  {d.t:6.1f} s  {sig.name} {what}", flush=True)
        next_at += interval
    return done


# --- figures from a finished run ---

def restart_counts(run: Run) -> dict[str, int]:
    """The run's `Restarted` lines, by kind."""
    counts = collections.Counter(kind_of(m.group(1)) for m in RESTARTED_RE.finditer(run.text()))
    return {k: counts[k] for k in KINDS}


def restart_causes(run: Run) -> str:
    """'SIGKILL 3, stall 1': what the `Restarted` lines give as causes. A stall restart in a SIGKILL experiment, or in
    the calm run, is one no signal of ours explains (a --stall_timeout_sec too short for the machine's load, say)."""
    def short(cause: str) -> str:
        if cause.startswith("gave no sign of life"):
            return "stall"
        return cause.removeprefix("was killed by ")
    counts = collections.Counter(short(m.group(3)) for m in RESTARTED_RE.finditer(run.text()))
    return ", ".join(f"{c} {n}" for c, n in counts.most_common()) or "none"


def faults_line(run: Run) -> tuple[dict[str, int], int] | None:
    """(restarts by kind, env frames lost) from the run's final `Faults:` line; None without one."""
    found = FAULTS_RE.findall(run.text())
    if not found:
        return None
    _, rollout, policy, learner, lost = map(int, found[-1])
    return dict(zip(KINDS, (rollout, policy, learner))), lost


def tensorboard_faults(scalars: dict) -> tuple[dict[str, int | None], int | None]:
    """(restarts by kind, env frames lost) from the faults/ series: running totals, so the last point is the total.
    None for a series the run did not write."""
    def last(tag):
        points = scalars.get(tag)
        return int(points[-1][1]) if points else None
    return {k: last(f"faults/restarts_{k}") for k in KINDS}, last("faults/lost_frames")


def done_fps(run: Run) -> tuple[int, float] | None:
    """(env frames, frames/s) from the run's `Done:` line."""
    found = DONE_RE.findall(run.text())
    return (int(found[-1][0]), float(found[-1][2])) if found else None


def starved_names(run: Run) -> str:
    """The processes the watchdog found silent past --stall_timeout_sec but waiting for a CPU (it warns once each)."""
    names = sorted(set(re.findall(r"\] (\w+) gave no sign of life for \d+ s but is waiting for a CPU", run.text())))
    return ", ".join(names) or "none"


def median_fps10(run: Run) -> float:
    """Median of the 10-s FPS windows of the report lines, the first (start-up inside its window) left out."""
    fps = [float(m.group(1)) for m in FPS_RE.finditer(run.text()) if m.group(1) != "nan"][1:]
    return statistics.median(fps) if fps else float("nan")


def reward_figures(run: Run, scalars: dict) -> tuple[int | None, tuple[int, float] | None]:
    """(env frames of the first reward/reward >= REWARD_TARGET over a full window of episodes, or None; (env frames,
    value) of the last point). reward/reward averages the last FULL_WINDOW episodes, or as many as there were so far:
    the first lucky episode alone can reach the target (it did at 160 env frames in a trial). So a point counts only
    from the first report line averaging over a full window (as in learning_doom_basic.first_reached); the report's
    `Total num frames` is the same count as the TensorBoard step."""
    full_from = next((int(m.group(1)) for m in REPORT_RE.finditer(run.text()) if int(m.group(3)) >= FULL_WINDOW), None)
    points = scalars.get("reward/reward", [])
    first = None if full_from is None else next(
        (step for step, value in points if step >= full_from and value >= REWARD_TARGET), None)
    return first, (points[-1] if points else None)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# --- one experiment ---

def experiment(args, sig_name: str, train_dir: str) -> tuple[bool, list]:
    """Both runs of one signal, the schedule, the checks; prints the details and the table. Returns (all passed, the
    summary row)."""
    sig = SIGNALS[sig_name]
    budget = int(round(args.minutes * 60))
    print(f"\n## SIG{sig_name}: a process every {args.interval:g} s, {budget} s budget")
    flags = ["--env", args.env, "--train_for_seconds", str(budget), "--seed", str(args.seed),
             "--restart_behavior", "overwrite", "--report_interval_sec", "5",
             "--stall_timeout_sec", f"{args.stall_timeout_sec:g}", "--max_restarts_per_hour",
             str(args.max_restarts_per_hour)]
    shm_before, pids_before, start = shm_entries(), set(psutil.pids()), time.time()
    disturbed = calm = None
    try:
        disturbed = Run(f"chaos_{sig_name.lower()}_disturbed", flags, train_dir)
        calm = Run(f"chaos_{sig_name.lower()}_calm", flags, train_dir)
        print(f"runs: {disturbed.exp_dir} (disturbed), {calm.exp_dir} (calm); disturbances (s since launch):",
              flush=True)
        schedule = disturb(disturbed, sig, args.interval, budget, random.Random(args.seed))
        deadline = disturbed.t0 + budget + 180 + 0.25 * budget  # start-up, final checkpoint, a loaded machine
        for run in (disturbed, calm):
            run.finish(deadline)
    finally:  # an error or Ctrl-C here: no run left training on a shared machine
        for run in (disturbed, calm):
            if run is not None:
                run.abort()
    runs = (disturbed, calm)

    for run in runs:
        if run.rc != 0:
            print(f"\n{run.name} ended with exit code {run.rc}; its last lines:")
            print("\n".join("  " + line for line in run.lines[-8:]))

    sent = [d for d in schedule if d.name]
    print(f"\n### Schedule: {len(sent)} signals sent, {len(schedule) - len(sent)} skipped")
    print(table([[f"{d.t:.1f}", d.kind, d.name or "-", d.pid or "-", f"SIG{sig_name}" if d.name else "skipped"]
                 for d in schedule], ["t (s)", "kind", "process", "pid", "signal"]))
    for run in runs:
        restarted = [line for line in run.lines if RESTARTED_RE.search(line)]
        print(f"\n### Restarted lines of {run.name}: {len(restarted)}")
        print("\n".join(restarted) if restarted else "(none)")

    # 4. orphans: processes that carry a run's tag, after a moment to go; other processes created since the start are
    # only counted (on a shared machine, somebody else's)
    tags = {run.tag: run for run in runs}
    wait_until(lambda: not tagged_processes(set(tags)), SETTLE_S)
    left = tagged_processes(set(tags))
    orphans = collections.defaultdict(list)
    for p, tag in left:
        orphans[tags[tag]].append(p)
    ours = {p.pid for p, _ in left} | {os.getpid()}
    others = sum(1 for p in psutil.process_iter(["create_time"])
                 if p.pid not in pids_before and p.pid not in ours and (p.info["create_time"] or 0) >= start)
    print(f"\n### Processes: {len(left)} of the runs alive after their exit; {others} other processes created since "
          "the start (without the runs' tag: somebody else's, not counted)")
    for run, procs in orphans.items():
        for p in procs:
            try:
                print(f"  orphan of {run.name}: pid {p.pid} {p.status()} {' '.join(p.cmdline())[:200]}")
                p.kill()  # found and reported: not left on a shared machine, nor in the next experiment's way
            except psutil.Error:
                pass

    # 5. /dev/shm: entries added since the start and still there after a moment (a run's engines unlink theirs as they
    # close); entries removed are listed too, though on a shared machine another user's run may have removed them
    wait_until(lambda: shm_entries() <= shm_before, SETTLE_S)
    shm_after = shm_entries()
    added, removed = sorted(shm_after - shm_before), sorted(shm_before - shm_after)
    print(f"\n### /dev/shm: {len(added)} entries added, {len(removed)} removed")
    for n in added:
        print(f"  + {n}")
    for n in removed:
        print(f"  - {n} (gone since the start: not a leak; on a shared machine, likely somebody else's)")

    # the figures
    kills = {k: sum(d.kind == k for d in sent) for k in KINDS}
    scalars = {run: read_event_scalars(run.exp_dir) for run in runs}
    lines_r = {run: restart_counts(run) for run in runs}
    faults = {run: faults_line(run) for run in runs}
    tb = {run: tensorboard_faults(scalars[run]) for run in runs}
    done = {run: done_fps(run) for run in runs}
    reward = {run: reward_figures(run, scalars[run]) for run in runs}
    expected = {disturbed: kills, calm: dict.fromkeys(KINDS, 0)}

    def agrees(counts: dict) -> bool:
        """counts: run -> restarts by kind, None (or a kind missing) where the run gave no figure: zero, which is
        right only where none was expected (a run that restarted nothing need not write a faults/ series)."""
        return all(((counts[run] or {}).get(k) or 0) == expected[run][k] for run in runs for k in KINDS)

    fps = {run: done[run][1] if done[run] else float("nan") for run in runs}
    ratio = fps[disturbed] / fps[calm] if fps[calm] > 0 else float("nan")
    first_hit = reward[disturbed][0]

    def fmt_reward(run):
        hit, last = reward[run]
        return f"{hit if hit is not None else 'never'}" + (f" (last {last[1]:.3f} at {last[0]})" if last else
                                                           " (no reward/reward)")

    rows = [
        ["exit code", disturbed.rc, calm.rc, "0 and 0", verdict(disturbed.rc == 0 and calm.rc == 0)],
        ["signals sent: rollout / policy / learner", by_kind(kills), "-", "every kind >= 1",
         verdict(all(kills[k] >= 1 for k in KINDS))],
        ["Restarted lines", by_kind(lines_r[disturbed]), by_kind(lines_r[calm]), "= signals sent; calm 0",
         verdict(agrees(lines_r))],
        ["restart causes (Restarted lines)", *(restart_causes(run) for run in runs), "", ""],
        ["silent past the limit, waiting for a CPU (left alone)", *(starved_names(run) for run in runs), "", ""],
        ["Faults: line", *(by_kind(faults[run][0]) if faults[run] else "no line" for run in runs),
         "= signals sent; calm 0",
         verdict(faults[disturbed] is not None and agrees({run: faults[run] and faults[run][0] for run in runs}))],
        ["TensorBoard faults/restarts_*", *(by_kind(tb[run][0]) for run in runs), "= signals sent; calm 0",
         verdict(agrees({run: tb[run][0] for run in runs}))],
        ["env frames lost: Faults: line / TensorBoard",
         *(f"{faults[run][1] if faults[run] else '-'} / {'-' if tb[run][1] is None else tb[run][1]}" for run in runs),
         "", ""],
        ["frames/s (Done: line)", *(f"{fps[run]:.0f}" for run in runs),
         f"disturbed / calm = {ratio:.3f} >= {FPS_RATIO_MIN}", verdict(ratio >= FPS_RATIO_MIN)],
        ["median 10-s FPS", *(f"{median_fps10(run):.0f}" for run in runs), "", ""],
        ["env frames (Done: line)", *(done[run][0] if done[run] else "no line" for run in runs), "", ""],
        ["processes alive after the exit", *(len(orphans.get(run, [])) for run in runs), "none",
         verdict(not orphans)],
        ["/dev/shm entries added (both runs)", len(added), "", "none", verdict(not added)],
        [f"env frames to reward/reward >= {REWARD_TARGET} (full window)", fmt_reward(disturbed), fmt_reward(calm),
         f"disturbed <= {REWARD_WITHIN}", verdict(first_hit is not None and first_hit <= REWARD_WITHIN)],
    ]
    print(f"\n### SIG{sig_name}: checks")
    print(table(rows, ["check", disturbed.name, calm.name, "requirement", "result"]))
    verdicts = [r[-1] for r in rows if r[-1]]
    passed = all(v == "PASS" for v in verdicts)
    print(f"\nSIG{sig_name}: {verdicts.count('PASS')} of {len(verdicts)} checks passed")
    return passed, [f"SIG{sig_name}", len(sent), sum(lines_r[disturbed].values()), f"{ratio:.3f}",
                    first_hit if first_hit is not None else "never",
                    f"{verdicts.count('PASS')}/{len(verdicts)}", verdict(passed)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--signal", choices=["KILL", "STOP", "both"], default="both",
                    help="SIGKILL (a crash), SIGSTOP (a hang, for the stall watchdog), or both, SIGKILL first")
    ap.add_argument("--minutes", type=float, default=10, help="the training budget of every run")
    ap.add_argument("--interval", type=float, default=30, help="seconds between disturbances")
    ap.add_argument("--seed", type=int, default=1, help="of both runs, and of the schedule")
    ap.add_argument("--stall_timeout_sec", type=float, default=3,
                    help="passed to both runs: a hung process is replaced after it")
    ap.add_argument("--max_restarts_per_hour", type=int, default=10, help="passed to both runs (the default)")
    ap.add_argument("--train_dir", default=None, help="keep the experiment directories here (chaos_<signal>_disturbed, "
                    "chaos_<signal>_calm); default: a temporary directory")
    ap.add_argument("--env", default="doom_basic")
    args = ap.parse_args()
    signals = ["KILL", "STOP"] if args.signal == "both" else [args.signal]
    header(f"Chaos: {args.env}, " + " then ".join(f"SIG{s}" for s in signals) +
           f" every {args.interval:g} s for {args.minutes:g} min, beside an undisturbed run")
    results = []
    with tempfile.TemporaryDirectory(prefix="chaos_", ignore_cleanup_errors=True) as tmp:
        for s in signals:
            results.append(experiment(args, s, args.train_dir or tmp))
    if len(results) > 1:
        print("\n## Summary")
        print(table([row for _, row in results], ["signal", "signals sent", "restarts", "frames/s ratio",
                                                  f"frames to {REWARD_TARGET}", "checks", "result"]))
    sys.exit(0 if all(ok for ok, _ in results) else 1)


if __name__ == "__main__":
    main()
