"""Experiment tracking with Weights & Biases (--with_wandb), next to TensorBoard.

    check(cfg)                    before the run (Runner.__init__, checks only): ConfigError if wandb cannot be imported
    start(cfg, exp_dir)           when the run starts (Runner.run): wandb.init, or None (one warning) if that fails
    WandbTracker.log(...)         every TensorBoard summary (RunStats.write_summaries): the same tags and values
    WandbTracker.finish(code)     at the end (Runner.run): wandb's finish, bounded in time

The W&B run: project/entity/group/job_type/tags from --wandb_project/--wandb_user/--wandb_group/--wandb_job_type/
--wandb_tags, name = the experiment name, config = the resolved configuration, files under the experiment directory
(EXP/wandb/). Its id is kept in EXP/wandb_run_id, so `--restart_behavior resume` continues the same W&B run (restart and
overwrite move or delete the directory, and so start a new one). The mode is the user's (WANDB_MODE, `wandb offline`,
their login): nothing here forces it.

x-axis: env frames, as in TensorBoard, but logged as the key `global_step` (the name wandb's own TensorBoard
integration gives TensorBoard's step) with `define_metric("*", step_metric="global_step")`, not as wandb's `step`.
wandb drops every row whose `step` is below the run's last one; a resumed run starts from its checkpoint's frames, which
are below the frames of the last summaries written before a crash, so those first rows would be lost. wandb's own
`_step` counts rows and only grows; the charts are drawn against `global_step`.

Training never depends on W&B: logging goes through a queue drained by a thread of its own (the runner never waits on
wandb or the network), any wandb exception is one warning and the run goes on with TensorBoard only, and wandb's
finish runs in a daemon thread joined with a timeout.
"""
from __future__ import annotations

import logging
import os
import queue
import re
import secrets
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from sf.cfg import ConfigError
from sf.utils.files import error_line, write_text_atomic

if TYPE_CHECKING:
    from sf.cfg.config import Config

log = logging.getLogger("sf")
RUN_ID_FILE = "wandb_run_id"
STEP_KEY = "global_step"
FINISH_TIMEOUT_SEC = 30.0  # wandb's finish (offline: about a second; online: the upload of what is left)
QUEUE_ROWS = 10_000  # rows waiting for the logging thread; more means wandb is stuck: give up on it
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def enabled(cfg: Config) -> bool:
    return bool(cfg.with_wandb)


def check(cfg: Config) -> None:
    """With --with_wandb, wandb must import: otherwise one line (ConfigError, exit code 2) before anything runs."""
    if not enabled(cfg):
        return
    try:
        import wandb  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name != "wandb":
            raise ConfigError(f"--with_wandb: the wandb package cannot be imported ({error_line(e)}); reinstall it "
                              "(pip install wandb)") from None
        raise ConfigError("--with_wandb: the wandb package is not installed (pip install wandb)") from None
    except Exception as e:  # noqa: B902 — a broken install (a dependency of the wrong version, say)
        raise ConfigError(f"--with_wandb: the wandb package cannot be imported ({error_line(e)}); reinstall it "
                          "(pip install wandb)") from None


def start(cfg: Config, exp_dir: Path) -> WandbTracker | None:
    """wandb.init for this run (when --with_wandb), or None. Call it in the runner once the experiment directory exists,
    before the worker processes start (the runner then counts wandb's service process as its own, not an orphan).
    A failure (no network, not logged in, ...) is one warning: the run trains with TensorBoard only."""
    if not enabled(cfg):
        return None
    try:
        import wandb
        run_id = _run_id(cfg, Path(exp_dir))
        settings = None
        if "WANDB_FINISH_TIMEOUT" not in os.environ:  # wandb gives up uploading at the end after this (if it knows how)
            try:
                settings = wandb.Settings(finish_timeout=FINISH_TIMEOUT_SEC - 5)
            except Exception:  # noqa: B902 — a wandb without that setting
                settings = None
        tags = cfg.wandb_tags
        run = wandb.init(
            project=cfg.wandb_project or "sf", entity=cfg.wandb_user or None,
            group=cfg.wandb_group or None, job_type=cfg.wandb_job_type or None,
            tags=list(tags) if tags else None, name=cfg.experiment, dir=str(exp_dir), id=run_id, resume="allow",
            config=cfg.as_dict(), settings=settings)
        run.define_metric(STEP_KEY)
        run.define_metric("*", step_metric=STEP_KEY)
    except Exception as e:  # noqa: B902 — W&B is never a reason not to train
        log.warning("--with_wandb: W&B could not start (%s); training with TensorBoard only", error_line(e))
        return None
    log.info("W&B: run %s (project %s, %s mode), files in %s", run_id, run.project, _mode(run), exp_dir / "wandb")
    return WandbTracker(run)


class WandbTracker:
    """Rows for the W&B run, logged by a thread of its own; the first exception disables it (one warning)."""

    def __init__(self, run):
        self.run = run
        self.failed = False
        self.exit_code = 0
        self._rows: queue.Queue = queue.Queue(maxsize=QUEUE_ROWS)
        self._thread = threading.Thread(target=self._loop, name="wandb_log", daemon=True)
        self._thread.start()

    def log(self, scalars: dict, step: int, series: dict | None = None) -> None:
        """One row with `scalars` at env frame `step`; and one row for every value of `series` (tag -> values: several
        points at the same step, as TensorBoard gets them). Never blocks."""
        if self.failed:
            return
        try:
            rows = [{**{k: float(v) for k, v in scalars.items()}, STEP_KEY: int(step)}]
            rows += [{tag: float(v), STEP_KEY: int(step)} for tag, values in (series or {}).items() for v in values]
            for row in rows:
                self._rows.put_nowait(row)
        except queue.Full:
            self._fail(f"{QUEUE_ROWS} rows are waiting: wandb is not keeping up")
        except Exception as e:  # noqa: B902 — never the runner's problem
            self._fail(error_line(e))

    def finish(self, exit_code: int = 0, timeout: float | None = None) -> bool:
        """wandb's finish (after the rows logged so far), waiting at most `timeout` seconds: the run does not outlive
        its stop for W&B's sake. True if it finished. If not, wandb's service process is ended, so that nothing waits on
        it at exit; what it had not sent stays in the run's directory (`wandb sync`)."""
        if timeout is None:
            timeout = _finish_timeout()
        self.exit_code = exit_code
        deadline = time.monotonic() + timeout
        try:
            self._rows.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if not self._thread.is_alive():
            return True
        log.warning("W&B did not finish within %.0f s; ending it (unsent data stays in %s: wandb sync)", timeout,
                    getattr(self.run, "dir", "the run's directory"))
        _end_service()
        return False

    def _loop(self) -> None:
        while True:
            row = self._rows.get()
            if row is None:
                break
            if self.failed:
                continue
            try:
                self.run.log(row)
            except Exception as e:  # noqa: B902
                self._fail(error_line(e))
        try:
            self.run.finish(exit_code=self.exit_code)
        except Exception as e:  # noqa: B902
            if not self.failed:  # (after a failure, the same cause again: warned once already)
                log.warning("W&B could not finish the run (%s); TensorBoard has every summary", error_line(e))

    def _fail(self, reason: str) -> None:
        if not self.failed:
            self.failed = True
            log.warning("W&B logging failed (%s); training goes on with TensorBoard only", reason)


def _run_id(cfg: Config, exp_dir: Path) -> str:
    """The W&B run id of this experiment directory: read from EXP/wandb_run_id, or made and written there."""
    path = exp_dir / RUN_ID_FILE
    try:
        run_id = path.read_text(encoding="utf-8").strip()
        if _RUN_ID.fullmatch(run_id):
            return run_id
    except (OSError, UnicodeDecodeError):
        pass
    prefix = re.sub(r"[^A-Za-z0-9_-]+", "_", cfg.experiment)[:40]
    run_id = f"{prefix}_{secrets.token_hex(4)}"
    write_text_atomic(path, run_id + "\n")
    return run_id


def _finish_timeout() -> float:
    try:  # the user's own finish timeout for wandb, if longer than ours
        return max(FINISH_TIMEOUT_SEC, float(os.environ.get("WANDB_FINISH_TIMEOUT", 0)) + 5)
    except ValueError:
        return FINISH_TIMEOUT_SEC


def _end_service() -> None:
    """SIGKILL wandb's service process (wandb-core, a child of this process), whose end wandb's exit hook waits for."""
    try:
        for child in psutil.Process().children():
            try:
                if os.path.basename((child.cmdline() or [""])[0]).startswith("wandb-core"):
                    for p in [*child.children(recursive=True), child]:  # its system monitor (wandb-symon) too
                        p.kill()
            except psutil.Error:
                pass
    except psutil.Error:
        pass


def _mode(run) -> str:
    mode = str(getattr(getattr(run, "settings", None), "mode", None) or os.environ.get("WANDB_MODE") or "online")
    return {"dryrun": "offline", "run": "online"}.get(mode, mode)
