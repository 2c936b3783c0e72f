"""Deaths and crashes of the run's processes, judged by the runner (a mixin of Runner, sf/runner/runner.py): a process
that died is replaced (self-healing, sf/runner/health/healing.py) or stops the run with exit code 1; a stall the
watchdog cannot mend stops it too; a crash is one line on the console, its traceback in the log.

_build_supervision makes the bookkeeping (procs, reported, causes, the report reader, the watchdog, the healer); the
runner's state the rest reads is declared on the class below, and the runner's _start_* methods start a replacement as
the original was started.
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sf.processes.control import StopRequests
from sf.runner.health.healing import Healer, exit_cause, process_kind
from sf.runner.health.watchdog import StallWatchdog
from sf.runner.reports import ReportReader
from sf.runner.startup.supervision import TRACE_LOG

if TYPE_CHECKING:
    from sf.cfg.config import Config
    from sf.processes.ranks import World
    from sf.processes.shared_state import SharedState
    from sf.runner.stats import RunStats

log = logging.getLogger("sf")


class ProcessHealth:
    """Runner's judgment of deaths, stalls and crashes (see the module docstring)."""
    # the runner's, read here
    cfg: Config
    exp_dir: Path
    world: World
    data_parallel: bool
    state: SharedState
    stats: RunStats
    queues: Any
    env_slots: torch.Tensor
    learner_ready: bool
    spec: Any

    # the runner's starters: a replacement is started as the original was (the runner defines them)
    def _start_rollout_worker(self, w: int) -> str:
        raise NotImplementedError

    def _start_policy_worker(self, p: int, i: int) -> str:
        raise NotImplementedError

    def _start_learner(self, p: int, replacement: bool = False) -> str:
        raise NotImplementedError

    def _build_supervision(self) -> None:
        """The supervisor's bookkeeping: processes, their reported deaths, the report reader, the stall watchdog, the
        healer."""
        cfg = self.cfg
        self.procs: dict[str, torch.multiprocessing.Process] = {}
        self.stack_files: dict[str, int] = {}  # process name -> descriptor of its stack-dump file (in that process)
        self.exit_code = 0
        self.stop_requests = StopRequests()  # SIGINT/SIGTERM requests counted (interrupts)
        self.sigterm_at: float | None = None  # time.monotonic() of the first SIGTERM: the stop fits its grace period
        self.reported: set[str] = set()  # processes whose death was already reported (one line each)
        self.causes: dict[str, str] = {}  # process -> how it failed (its exception, a stall), for its restart line
        self.reports = ReportReader(cfg, self.queues.report, self.stats, self.state, self.stack_files, self._crashed)
        self.watchdog = StallWatchdog(cfg, self.state, self.world, self.procs, self.stack_files, self.causes,
                                      self.reports.drain)
        self.healer = Healer(cfg, self.state, self.queues, self.spec.frameskip)
        self.healing = cfg.mode.heals
        if self.healing:
            self.stats.faults = self.healer.scalars()
        self.own_children: set[int] = set()
        self.learner_ready = False  # the learner loaded its checkpoint and published its first weights

    def _check_processes(self) -> bool:
        """Replace a process that died (self-healing), or return False (and stop with exit code 1) where it cannot be:
        healing off, a death before training started, an error a replacement cannot mend, a crash loop. An error
        report comes first (the process exits at once): its line is the one report of that death."""
        for name, p in list(self.procs.items()):
            if p.exitcode is not None and name not in self.reported and not (p.exitcode == 0 and self.state.stopping()):
                self.reports.drain()
                if name in self.reported:  # its error stopped the run
                    continue
                # (a data-parallel learner is not replaced: a new one could not join the ranks' group)
                if self.healing and self.learner_ready and not self.state.stopping() and not (
                        self.data_parallel and process_kind(name) == "learner"):
                    self._replace(name, p)
                    continue
                log.error("%s %s; stopping the run", name, self.causes.pop(name, None) or
                          f"exited unexpectedly ({exit_cause(p.exitcode)})")
                self.reported.add(name)
                self.exit_code = 1
                self.state.request_stop()
        return not self.state.stopping()

    def _replace(self, name: str, proc) -> None:
        """Start a process in place of `name`, which died (Healer.replace), or stop the run (exit code 1) if that would
        be a crash loop."""
        cause = self.causes.pop(name, None) or exit_cause(proc.exitcode)
        starters = {"rollout_worker": self._start_rollout_worker, "policy_worker": self._start_policy_worker,
                    "learner": functools.partial(self._start_learner, replacement=True)}
        if not self.healer.replace(name, proc, cause, self.procs, self.env_slots, self.own_children, starters):
            self.reported.add(name)
            self.exit_code = 1
            self.state.request_stop()
            return
        self.stats.faults = self.healer.scalars()

    def _check_stalls(self) -> bool:
        """The stall watchdog's look (sf/runner/health/watchdog.py): False (and a stop with exit code 1) if a process
        is stuck and cannot be replaced, or if this rank's launcher (torchrun) died."""
        if self.watchdog.check(healing=self.healing and self.learner_ready) and not self.watchdog.launcher_gone():
            return True
        self.exit_code = 1
        return False

    def _crashed(self, name: str, tb: str, fatal: bool = True) -> None:
        """A process (or, in serial mode, a component) raised: one line on the console, the traceback in the log file.
        The run stops with exit code 1, unless the process is to be replaced (self-healing; not for a `fatal` error,
        which a replacement would meet again: a checkpoint that cannot be written, an env that keeps failing)."""
        last = tb.strip().splitlines()[-1] if tb.strip() else "(no message)"
        where = self.exp_dir / "sf_log.txt" if self.world.rank == 0 else "the lines below: this rank writes no files"
        log.error("%s crashed: %s (traceback in %s)", name, last, where)
        logging.getLogger(TRACE_LOG).error("%s crashed:\n%s", name, tb.rstrip())
        if not fatal and self.healing and self.learner_ready and not self.state.stopping():
            self.causes[name] = f"raised {last}"
            return
        self.reported.add(name)
        self.exit_code = 1
        self.state.request_stop()
