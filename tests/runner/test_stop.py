"""The run's stop on a busy machine (sf/runner/health/stopping.py), end to end beside CPU-bound processes: a final save
slower than any fixed budget still lands, because the learner shows progress as the bytes go out; a learner that hangs
in its final save is killed after the stall bound with a line that says so, and the Done line names the checkpoint
kept; a SIGTERM's stop fits its grace period; Ctrl-C always ends with a final checkpoint written after it, every
process gone and nothing left in /dev/shm."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from e2e_helpers import ROOT, SMALL, cpu_hogs, log_time, shm_files, shm_left_behind, tagged, wait_for

pytestmark = pytest.mark.e2e
SLOW_DISK = 6000  # bytes/s: the tiny model's checkpoint (about 100 kB) takes ~17 s, past the old fixed 8 s


def start(tmp_path: Path, extra: list, env: dict | None = None) -> tuple[subprocess.Popen, Path, str]:
    tag = uuid.uuid4().hex
    log = tmp_path / "console.txt"
    args = ["--env", "test_corridor", "--experiment", "e", "--train_dir", str(tmp_path), "--num_workers", "2",
            *SMALL, *extra]
    p = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], stdout=open(log, "w"),
                         stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1", SF_TEST_RUN_TAG=tag, **(env or {})))
    return p, log, tag


def start_with_a_checkpoint(tmp_path: Path, extra: list, env: dict) -> tuple[subprocess.Popen, Path, str]:
    """start(), once the run has written a periodic checkpoint (every second: the one a cut final save leaves)."""
    p, log, tag = start(tmp_path, ["--train_for_seconds", "600", "--save_every_sec", "1", *extra], env)
    try:
        wait_for(lambda: "Saved checkpoint" in log.read_text(), 240, "a periodic checkpoint", log)
    except BaseException:
        p.kill()
        raise
    return p, log, tag


def assert_done_names_the_checkpoint_kept(tmp_path: Path, text: str) -> None:
    kept = sorted((tmp_path / "e" / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert kept and f"No final checkpoint; the last one kept: {kept[-1]}" in line_with(text, "Done: "), text[-2000:]


def sigterm_and_wait(p: subprocess.Popen) -> tuple[int, float]:
    """SIGTERM to the runner alone (a scheduler's): (its exit code, the seconds it took to exit)."""
    try:
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGTERM)
        rc = p.wait(timeout=120)
        return rc, time.monotonic() - t0
    finally:
        p.kill()


def line_with(text: str, needle: str) -> str:
    return next(line for line in text.splitlines() if needle in line)


def test_a_final_save_slower_than_any_fixed_budget_lands_beside_cpu_hogs(tmp_path):
    """A disk that writes 6 kB/s: the final checkpoint takes ~17 s; the learner beats as its bytes go out, so the
    runner waits for it (once a fixed 8 s killed it and the Done line still named a checkpoint folder holding none)."""
    with cpu_hogs(2):
        p, log, _ = start(tmp_path, ["--train_for_env_steps", "1500"], {"SF_TEST_WRITE_BYTES_PER_SEC": str(SLOW_DISK)})
        try:
            rc = p.wait(timeout=300)
        finally:
            p.kill()
    text = log.read_text()
    assert rc == 0, text[-3000:]
    saved = line_with(text, "Saved final checkpoint")
    path = Path(saved.split("Saved final checkpoint ")[1])
    assert path.is_file() and path.parent == tmp_path / "e" / "checkpoint_p0"
    assert log_time(saved) - log_time(line_with(text, "Waiting for the final checkpoint of learner")) >= 0
    assert path.stat().st_size / SLOW_DISK > 8  # the save alone took longer than the old fixed budget
    assert "did not stop in time" not in text and "killing it" not in text, text[-3000:]
    assert f"Final checkpoint: {path}" in line_with(text, "Done: ")


def test_a_learner_hung_in_its_final_save_is_killed_after_the_stall_bound(tmp_path):
    """The learner stops itself (SIGSTOP) at the start of its final save: no progress, so after --stall_timeout_sec it
    is reported stuck with its state, killed, the run exits 1, and the Done line names the periodic checkpoint kept."""
    pause_dir = tmp_path / "pause"
    pause_dir.mkdir()
    with cpu_hogs(2):
        p, log, _ = start_with_a_checkpoint(tmp_path, ["--stall_timeout_sec", "4"], {
            "SF_TEST_PAUSE_AT": "learner_final_save", "SF_TEST_PAUSE_DIR": str(pause_dir)})
        try:
            os.killpg(p.pid, signal.SIGINT)
            rc = p.wait(timeout=180)
        finally:
            p.kill()
    text = log.read_text()
    assert (pause_dir / "learner_final_save").exists()
    assert rc == 1, text[-3000:]
    assert re.search(r"learner gave no sign of life for \d+ s while stopping \(--stall_timeout_sec 4\): it is stuck. "
                     r"Its main thread", text), text[-3000:]
    assert "learner gave no sign of life" in text and "killing it: its final checkpoint is not written" in text
    assert "Saved final checkpoint" not in text
    assert_done_names_the_checkpoint_kept(tmp_path, text)


def test_a_sigterm_stop_fits_its_grace_period(tmp_path):
    """Slurm and torchrun send SIGKILL 30 s after SIGTERM (here --sigterm_grace_sec 12): a final save that would take
    ~17 s is cut at the deadline (9 s), the runner is gone within the grace, the Done line names the checkpoint kept."""
    with cpu_hogs(2):
        p, log, _ = start_with_a_checkpoint(tmp_path, ["--sigterm_grace_sec", "12"],
                                            {"SF_TEST_WRITE_BYTES_PER_SEC": str(SLOW_DISK)})
        rc, took = sigterm_and_wait(p)
    text = log.read_text()
    assert took < 12, (took, text[-3000:])  # a deadline, not a speed: past it a scheduler's SIGKILL would come
    assert rc == 1, text[-3000:]
    assert "learner has not finished its final checkpoint within --sigterm_grace_sec after SIGTERM; killing it" in text
    assert_done_names_the_checkpoint_kept(tmp_path, text)


# The runner's own disk writes after the stop: tensorboardX fsyncs its event file on every flush and again when it is
# closed at exit (its atexit hook); on a loaded CI machine that fsync took seconds past the deadline. Here each fsync of
# an event file takes 60 s (in the runner only: it is the one process that writes them).
SLOW_EVENT_FSYNC = textwrap.dedent("""
    import os, time
    _fsync = os.fsync
    def _slow(fd):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = ""
        if "tfevents" in name:
            time.sleep(60)
        return _fsync(fd)
    os.fsync = _slow
""")


def test_a_sigterm_stop_fits_its_grace_period_when_tensorboard_fsyncs_slowly(tmp_path):
    """An fsync of the TensorBoard event file that takes a minute: the SIGTERM's stop still ends within the grace
    (the learner's final save lands: the disk is slow only for the event file), the Done line is written, and a line
    says the last summaries may be lost."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_EVENT_FSYNC)
    p, log, _ = start_with_a_checkpoint(tmp_path, ["--sigterm_grace_sec", "12"], {"PYTHONPATH": str(site)})
    try:  # (the TensorBoard writer is made with the first summaries, a report line's company)
        wait_for(lambda: "Fps is" in log.read_text(), 60, "a report line", log)
    except BaseException:
        p.kill()
        raise
    rc, took = sigterm_and_wait(p)
    text = log.read_text()
    assert took < 12, (took, text[-3000:])
    assert rc == 0, text[-3000:]
    assert "TensorBoard's event file was not closed within" in text, text[-3000:]
    assert "Final checkpoint: " in line_with(text, "Done: ")


def test_ctrl_c_beside_cpu_hogs_ends_with_a_final_checkpoint_and_nothing_left(tmp_path):
    """Three CPU-bound processes on a 2-core machine: a Ctrl-C to the terminal's process group still ends with a final
    checkpoint written after it, exit 0, every process of the run gone, nothing left in /dev/shm."""
    before = shm_files()
    with cpu_hogs(3):
        p, log, tag = start(tmp_path, ["--train_for_seconds", "600"])
        try:
            wait_for(lambda: re.search(r"Policy version: [1-9]", log.read_text()), 240, "training", log)
            t_ctrl_c = time.time()
            os.killpg(p.pid, signal.SIGINT)
            rc = p.wait(timeout=240)
        finally:
            p.kill()
        text = log.read_text()
        assert rc == 0, text[-3000:]
        final = Path(line_with(text, "Saved final checkpoint").split("Saved final checkpoint ")[1])
        assert final.stat().st_mtime >= t_ctrl_c - 1  # (mtime: 1 s of filesystem rounding)
        assert f"Final checkpoint: {final}" in line_with(text, "Done: ")
        wait_for(lambda: not tagged(tag), 30, "every process of the run to exit")
    assert not shm_left_behind(before)


def test_a_second_ctrl_c_during_a_slow_final_save_exits_at_once(tmp_path):
    """The wait for a slow final save is no trap: a second Ctrl-C exits at once (130), every process gone, nothing in
    /dev/shm, and the checkpoint written before stays whole (atomic writes: the save cut short leaves only its .tmp)."""
    from sf.learning.checkpoint_store import CheckpointManager
    before = shm_files()
    p, log, tag = start_with_a_checkpoint(tmp_path, [], {"SF_TEST_WRITE_BYTES_PER_SEC": str(SLOW_DISK)})
    try:
        os.killpg(p.pid, signal.SIGINT)
        wait_for(lambda: "stopping (final checkpoint)" in log.read_text(), 60, "the first Ctrl-C's line", log)
        time.sleep(1.0)  # (a Ctrl-C repeated within half a second is the same request)
        os.killpg(p.pid, signal.SIGINT)
        rc = p.wait(timeout=60)
    finally:
        p.kill()
    text = log.read_text()
    assert rc == 130, text[-3000:]
    assert "Saved final checkpoint" not in text
    wait_for(lambda: not tagged(tag), 30, "every process of the run to exit")
    kept = CheckpointManager(tmp_path / "e", policy_id=0, read_only=True).latest()
    assert kept, list((tmp_path / "e" / "checkpoint_p0").iterdir())
    assert not shm_left_behind(before)
