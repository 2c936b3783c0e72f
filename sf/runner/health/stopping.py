"""The run's stop (Runner.stop_processes): every process asked at once; each learner given the time its final checkpoint
takes while it shows progress; the others a bounded time; after a SIGTERM, all of it within --sigterm_grace_sec.

    learners    waited for until they finished their final save (SharedState: FINISHED) for as long as they beat: after
                every SGD step of the batch they are finishing, and as the checkpoint's bytes go out (ProgressFile: a
                slow disk, a big model, a network filesystem, a loaded machine). One the stall watchdog finds stuck
                (the same judgement as while training: silent past --stall_timeout_sec while it sleeps or is stopped;
                a learner that computes or waits for a CPU is given longer) is killed, its stack in the log; the run's
                last checkpoint is then the one written before (checkpoints are written atomically), which the Done
                line names (checkpoint_note)
    others      STOP_TIMEOUT_SEC from the stop request (rollout workers close their engines), then killed: they hold
                nothing that a checkpoint needs
    SIGTERM     Slurm's scancel and torchrun's stop send SIGKILL --sigterm_grace_sec after it (Slurm's KillWait and
                torchrun's shutdown timeout are 30 s by default): whatever has not stopped is killed a margin before
                that (sigterm_deadline), so that the runner's own exit (the last summaries, the Done line) fits too;
                its own last disk write, TensorBoard's fsync, is given what is left of the grace (time_left_to_exit)
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Optional

from sf.learning.checkpoint_store import CheckpointManager
from sf.processes.control import kill_tree
from sf.processes.shared_state import FINISHED

log = logging.getLogger("sf")
STOP_TIMEOUT_SEC = 8.0  # processes other than the learners: then killed
# a learner that finished its final save, to exit (before: a kill would be harmless, but noise)
AFTER_FINAL_SAVE_SEC = 2.0
SIGTERM_MARGIN_SEC = 5.0  # of --sigterm_grace_sec, for the runner's own exit (at most a quarter of the grace)
WAIT_NOTE_SEC = 10.0  # a console line this often while a learner's final save goes on
# of --sigterm_grace_sec, after the runner's last disk write (TensorBoard's close): the queues, the Done line, the
# interpreter's exit (measured: under 1 s beside ten CPU-bound processes on 2 cores)
SIGTERM_EXIT_SEC = 1.5


def sigterm_deadline(sigterm_at: Optional[float], grace_sec: float) -> Optional[float]:
    """The time.monotonic() by which every process must be gone after a SIGTERM received at `sigterm_at` (None: no
    SIGTERM, or --sigterm_grace_sec 0: no deadline)."""
    if sigterm_at is None or grace_sec <= 0:
        return None
    return sigterm_at + grace_sec - min(SIGTERM_MARGIN_SEC, grace_sec / 4)


def time_left_to_exit(sigterm_at: Optional[float], grace_sec: float, cap: float) -> float:
    """How long the runner's own closing writes (TensorBoard's final fsync) may take: `cap`, or less after a SIGTERM,
    so that the runner is gone SIGTERM_EXIT_SEC before the grace ends (its SIGKILL)."""
    if sigterm_at is None or grace_sec <= 0:
        return cap
    return max(0.0, min(cap, sigterm_at + grace_sec - SIGTERM_EXIT_SEC - time.monotonic()))


def stop_processes(procs: dict, state, learners: dict[str, int], drain: Callable[[], None],
                   stuck: Callable[[str], Optional[str]], deadline: Callable[[], Optional[float]]) -> list[str]:
    """Stop every process of `procs` (name -> process): learners (name -> policy) waited for while they make progress,
    the others STOP_TIMEOUT_SEC. drain: reads the report queue (the learners' checkpoint lines); stuck(name): why a
    learner is stuck, or None (StallWatchdog.stuck_in_stop); deadline(): sigterm_deadline now (a SIGTERM may come
    during the stop). Returns the learners killed before their final checkpoint."""
    state.request_stop()
    start = time.monotonic()
    waiting = {name: p for name, p in learners.items() if name in procs}
    killed, note_at = [], start + WAIT_NOTE_SEC
    while True:
        drain()
        waiting = {n: p for n, p in waiting.items() if procs[n].is_alive() and state.learner[p, FINISHED] == 0}
        if not waiting:
            break
        now, hard = time.monotonic(), deadline()
        for name in list(waiting):
            why = ("has not finished its final checkpoint within --sigterm_grace_sec after SIGTERM"
                   if hard is not None and now >= hard else stuck(name))
            if why:
                log.error("%s %s; killing it: its final checkpoint is not written", name, why)
                kill_tree(procs[name])
                procs[name].join(timeout=2)
                killed.append(name)
                del waiting[name]
        if waiting and now >= note_at:
            log.info("Waiting for the final checkpoint of %s: %.0f s since the stop, still progressing (Ctrl-C again "
                     "exits at once; the last checkpoint written stays)", ", ".join(waiting), now - start)
            note_at = now + WAIT_NOTE_SEC
        time.sleep(0.05)
    others_by = max(start + STOP_TIMEOUT_SEC, time.monotonic() + AFTER_FINAL_SAVE_SEC)
    hard = deadline()
    if hard is not None:
        others_by = min(others_by, hard)
    for p in procs.values():
        p.join(timeout=max(0.1, others_by - time.monotonic()))
    stragglers = [(name, p) for name, p in procs.items() if p.is_alive()]
    for name, p in stragglers:  # all killed first, then reaped: the SIGTERM deadline holds however many they are
        log.warning("%s did not stop in time; killing it", name)
        kill_tree(p)
    for _, p in stragglers:
        p.join(timeout=2)
    return killed


def checkpoint_note(exp_dir: Path, policies: list[int], finals: set[str]) -> str:
    """The Done line's account of the checkpoints on disk, as they are: each policy's final checkpoint (`finals`: the
    paths its learner reported as final), or the latest one kept when the final save did not happen (killed), or that
    there is none."""
    parts = []
    for p in policies:
        manager = CheckpointManager(exp_dir, policy_id=p, read_only=True)
        final = next((Path(f) for f in finals if Path(f).parent == manager.dir), None)
        kept = None if final is not None else next(iter(manager.latest()), None)
        parts.append((p, manager.dir, "final" if final is not None else "kept", final or kept))
    if len(policies) == 1:
        _, folder, what, path = parts[0]
        if what == "final":
            return f"Final checkpoint: {path}"
        return (f"No final checkpoint; the last one kept: {path}" if path is not None else
                f"No checkpoint written: {folder} holds none")
    return f"Checkpoints in {exp_dir}: " + ", ".join(
        f"policy {p} final {path.parent.name}/{path.name}" if what == "final" else
        f"policy {p} no final (kept {path.parent.name}/{path.name})" if path is not None else f"policy {p} none written"
        for p, _, what, path in parts)
