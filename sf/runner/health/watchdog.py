"""The stall watchdog: finds a process of the run that is alive but stuck in a call that never returns (an env engine
that hangs, a deadlock, a stopped process), logs its Python stack, and has it killed.

Every process beats (SharedState's heartbeats). One silent for half its stall limit is watched (supervision.Silence):
from then on, its state tells stuck from busy (computing without a beat: given longer) or starved (waiting for a CPU
other work holds: left alone, with a warning, since killing it would not give it one). Past its limit, a stuck process
is killed and replaced (self-healing), or the run stops with exit code 1.

A rank under torchrun also watches its launcher: when torchrun dies (SIGKILLed, say), its ranks are orphaned and would
train on unseen to their budget; the rank stops instead, with its final checkpoint and exit code 1 (launcher_gone).
"""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Callable

from sf.processes.control import kill_tree
from sf.runner.health.healing import process_kind
from sf.runner.startup.supervision import Silence, read_stack

if TYPE_CHECKING:
    from sf.cfg.config import Config

log = logging.getLogger("sf")
# A process still starting (making and resetting its envs: a VizDoom engine took > 5 s to start on a loaded 2-core VM)
# is stuck only after this long, even with a shorter --stall_timeout_sec
STARTUP_STALL_SEC = 60.0
# A silent process found runnable in this share of the looks at it is not stuck (supervision.Silence): one that ran
# (computing without a beat: a long step, or a loop that never ends) gets up to BUSY_GRACE x the timeout; one that
# did not run (starved by other work) is left alone, with a warning: killing it would not give it a CPU
BUSY_SHARE, BUSY_GRACE = 0.25, 6.0
# A data-parallel learner blocked in a collective waits for a slow peer up to --distributed_timeout_sec (at start, in
# the rendezvous, up to twice that: its store client retries once); then the collective raises and the learner stops the
# run itself. It is stuck only this long after that
PEER_WAIT_GRACE_SEC = 30.0


class StallWatchdog:
    def __init__(self, cfg: Config, state, world, procs: dict, stack_files: dict[str, int], causes: dict[str, str],
                 drain_reports: Callable[[], None]):
        """The runner's: procs (name -> process), stack_files (name -> descriptor of its stack-dump file, filled by
        drain_reports, which reads the report queue) and causes (name -> how it failed, for its restart line)."""
        self.cfg, self.state, self.world = cfg, state, world
        self.procs, self.stack_files, self.causes, self.drain_reports = procs, stack_files, causes, drain_reports
        self.last_watch = time.monotonic()  # the last look
        self.silence: dict[str, Silence] = {}  # processes silent for half their stall limit
        self.starved_warned: set[str] = set()  # processes found waiting for a CPU past their limit (warned once)
        # a rank's launcher (torchrun's agent, whose child the rank is): when it dies, the rank's parent changes
        self.launcher = os.getppid() if world is not None and world.distributed else None

    def launcher_gone(self) -> bool:
        """Whether this rank's launcher died (logged once, then the runner stops the rank)."""
        if self.launcher is None or os.getppid() == self.launcher:
            return False
        log.error("This rank's launcher (pid %d, torchrun) is gone: stopping this rank (final checkpoint)",
                  self.launcher)
        self.launcher = None
        self.state.request_stop()
        return True

    def check(self, healing: bool) -> bool:
        """A process that gave no sign of life for --stall_timeout_sec is alive but stuck in a call that never returns
        (an env engine that hangs, say): its Python stack goes to the log, then it is killed (with its engines) and
        replaced (healing: self-healing, once the learners are ready); without healing, False and a stop (the stop kills
        it after the others have stopped and the learner saved a final checkpoint)."""
        timeout = self.cfg.stall_timeout_sec
        if timeout <= 0 or self.state.stopping():
            return True
        self._look()
        for name, p in self.procs.items():
            stuck = self._judge(name, p, timeout)
            if stuck is not None and not self._stuck(name, p, *stuck, healing):
                return False
        return True

    def stuck_in_stop(self, name: str) -> str | None:
        """While the run stops: why `name` (a learner finishing its batch and writing its final checkpoint, which beats
        as its bytes go out) is stuck, by the same judgement as while training (a slow disk or a starved learner is
        waited for), its stack logged; None while it is not (or --stall_timeout_sec 0: never)."""
        timeout = self.cfg.stall_timeout_sec
        if timeout <= 0:
            return None
        self._look()
        stuck = self._judge(name, self.procs[name], timeout)
        if stuck is None:
            return None
        idle, limit, allowed, busy, silence = stuck
        why = self._why(limit, allowed, busy)
        log.error("%s gave no sign of life for %.0f s while stopping (%s): it is stuck. %s. Its stack:\n%s", name, idle,
                  why, silence.describe(idle), read_stack(self.procs[name].pid, self.stack_files.get(name)))
        return f"gave no sign of life for {idle:.0f} s ({why})"

    def _look(self) -> None:
        now = time.monotonic()
        # the runner itself was stopped (Ctrl-Z, then fg) or starved: all silence so far is nobody's fault
        if now - self.last_watch > 5.0:
            self.state.beat_all()
        self.last_watch = now

    def _judge(self, name: str, p, timeout: float) -> tuple[float, float, str, bool, Silence] | None:
        """(idle, limit, allowed, busy, silence) if `name` is stuck; None if it beat lately, is silent for less than its
        limit, computes within its grace, or waits for a CPU (starved: warned once)."""
        idle = self.state.seconds_since_beat(name)
        if idle < timeout / 2:
            self.silence.pop(name, None)
            return None
        silence = self.silence.get(name)
        if silence is None:  # half-way: from here on, its state tells stuck from busy or starved
            self.silence[name] = Silence(p.pid, idle)
            return None
        silence.sample()
        limit, allowed = self._limit(name, silence, timeout)
        if idle <= limit or not p.is_alive():
            return None
        runnable, ran = silence.shares(idle)
        if runnable > BUSY_SHARE and ran < BUSY_SHARE and not silence.stopped:
            if name not in self.starved_warned:
                self.starved_warned.add(name)
                log.warning("%s gave no sign of life for %.0f s but is waiting for a CPU, not stuck: the machine is "
                            "oversubscribed (other runs or jobs?); not repeated for this process. %s", name, idle,
                            silence.describe(idle))
            return None
        busy = (runnable > BUSY_SHARE or ran > BUSY_SHARE) and not silence.stopped
        if busy and idle < BUSY_GRACE * limit:
            return None  # computing without a beat: a long step, maybe
        return idle, limit, allowed, busy, silence

    def _why(self, limit: float, allowed: str, busy: bool) -> str:
        timeout = self.cfg.stall_timeout_sec
        why = f"--stall_timeout_sec {timeout:g}" if limit == timeout else f"{allowed}: {limit:g} s allowed"
        return why + (f", {BUSY_GRACE:g}x for a process that computes" if busy else "")

    def _limit(self, name: str, silence: Silence, timeout: float) -> tuple[float, str]:
        """(seconds of silence allowed to `name`, why more than --stall_timeout_sec where it is)."""
        # a process still starting gets longer, unless it is stopped: no start-up is that slow
        limit = timeout if self.state.has_started(name) or silence.stopped else max(timeout, STARTUP_STALL_SEC)
        allowed = "starting"
        if self.world.data_parallel(self.cfg.num_policies) and process_kind(name) == "learner" and not silence.stopped:
            waits = 1 if self.state.has_started(name) else 2
            peers = self.cfg.distributed_timeout_sec * waits + PEER_WAIT_GRACE_SEC
            if peers > limit:
                limit, allowed = peers, "a data-parallel learner waiting for the other ranks"
        return limit, allowed

    def _stuck(self, name: str, p, idle: float, limit: float, allowed: str, busy: bool, silence: Silence,
               healing: bool) -> bool:
        """`name` is stuck: its stack to the log, then killed (healing: its replacement follows) or the run stopped
        (False)."""
        self.drain_reports()  # the stack file of a process that only just started
        why = self._why(limit, allowed, busy)
        log.error("%s gave no sign of life for %.0f s (%s): it is stuck; %s. %s. Its stack:\n%s", name, idle,
                  why, "killing and replacing it" if healing else "stopping the run", silence.describe(idle),
                  read_stack(p.pid, self.stack_files.get(name)))
        if healing:
            self.causes[name] = f"gave no sign of life for {idle:.0f} s ({why})"
            kill_tree(p)
            p.join(timeout=5.0)
            return True
        self.state.request_stop()
        return False
