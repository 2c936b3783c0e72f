"""The runner's end of the report queue: what the processes of the run tell it, read between its other work.

    everyone --(kind, ...)--> report queue --> ReportReader.drain()

    ("episodes", worker, [episode stats])       rollout workers   statistics; each policy's best metric (SharedState)
    ("train", [train stats], version, frames, p, skipped)          learners: statistics (skipped: optimizer steps)
    ("checkpoint", path, final)                  learners          a log line
    ("final_weights", sha256, version, frames, p, start sha256, skipped, steps)   learners: a log line
    ("pbt_copied", p, source, copied version, new version)         a log line
    ("pbt_copy_abandoned", p, source, why)                         a warning, and a line of PBT's decisions
    ("stack_file", name, fd)                     every child       where the stall watchdog reads its stack
    ("error", name, traceback, fatal)            every child       the runner's on_error (a crash)
    other kinds                                                    their handler in `handlers`, if any (sf.eval's rows)
"""
from __future__ import annotations

import logging
from queue import Empty
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from sf.cfg.config import Config

log = logging.getLogger("sf")


class ReportReader:
    def __init__(self, cfg: Config, queue, stats, state, stack_files: dict[str, int],
                 on_error: Callable[[str, str, bool], None]):
        """stats: the run's RunStats; state: SharedState; stack_files: name -> descriptor, filled here; on_error(name,
        traceback, fatal): a crashed process."""
        self.cfg, self.queue, self.stats, self.state = cfg, queue, stats, state
        self.stack_files, self.on_error = stack_files, on_error
        self.num_policies = cfg.num_policies
        # the paths learners reported as their final checkpoint (the Done line)
        self.final_checkpoints: set[str] = set()
        self.handlers: dict[str, Callable[[tuple], None]] = {}  # kind -> handler(message), for kinds not above

    def drain(self) -> None:
        """Read every report on the queue now."""
        while True:
            try:
                msgs = self.queue.get_many(timeout=0.0, max_messages_to_get=1000)
            except Empty:
                return
            for msg in msgs:
                self._read(msg)

    def _read(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "episodes":
            for p in self.stats.add_episodes(msg[2]):
                metric = self.stats.mean(self.cfg.save_best_metric, p)
                if metric == metric:
                    self.state.best_metric[p, 0] = metric
                    self.state.best_metric[p, 1] = self.stats.policies[p].num_episodes
        elif kind == "train":
            self.stats.add_train(msg[1], msg[2], msg[3], msg[4], skipped=msg[5])
        elif kind == "stack_file":
            self.stack_files[msg[1]] = msg[2]
        elif kind == "checkpoint":
            log.info("Saved %scheckpoint %s", "final " if msg[2] else "", msg[1])
            if msg[2]:
                self.final_checkpoints.add(msg[1])
        elif kind == "final_weights":
            who = f"policy {msg[4]}, " if self.num_policies > 1 else "policy "
            changed = "changed from" if msg[1] != msg[5] else "UNCHANGED from"
            log.info("Final weights sha256: %s (%sversion %d, %d env frames); %s this process's start, %d of %d "
                     "optimizer steps skipped", msg[1], who, msg[2], msg[3], changed, msg[6], msg[7])
        elif kind == "pbt_copied":  # (policy, source, the source's version copied, the policy's new version)
            log.info("PBT: policy %d now plays with the weights of policy %d (its version %d), as policy "
                     "version %d", *msg[1:5])
        elif kind == "pbt_copy_abandoned":  # (policy, source, why)
            line = (f"PBT: policy {msg[1]} could not copy the weights of policy {msg[2]}: {msg[3]}; it keeps its "
                    "own weights, with the hyperparameters PBT gave it")
            log.warning("%s", line)
            self.stats.texts.append(("pbt/decisions", line))
        elif kind == "error":
            self.on_error(msg[1], msg[2], msg[3] if len(msg) > 3 else True)
        elif kind in self.handlers:
            self.handlers[kind](msg)
