"""Weights & Biases tracking (--with_wandb, sf/runner/tracking.py), the tqdm progress bar and the final Done line."""
import json
import logging
import re
import struct
import sys
import threading
import time
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from e2e_helpers import train_args
from sf.cfg import ConfigError, parse_cfg
from sf.processes.ranks import World
from sf.runner import run_log, tracking
from sf.runner import stats as stats_module
from sf.runner.stats import format_duration, progress_bar, read_event_scalars

DONE_LINE = re.compile(r"Done: (\d+) env frames in (?:\d+ h )?(?:\d+ min )?\d+ s \((\d+) frames/s\), "
                       r"policy version \d+")


# --- the progress bar (tqdm) and the Done line ---

def test_progress_bar_is_tqdms_toward_the_frame_budget(monkeypatch):
    calls = []
    real = stats_module.tqdm.format_meter

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(stats_module.tqdm, "format_meter", spy)
    # half of 400k frames in 100 s: 100 s left at that rate
    assert progress_bar(200_000, 400_000, 100.0, 10**10) == " |##########..........| 50% 200k/400k frames, ETA 01:40"
    assert len(calls) == 1 and calls[0][0][:3] == (200_000, 400_000, 100.0)


def test_progress_bar_time_budget_past_the_end_and_before_one_percent():
    assert progress_bar(10, 10**10, 150.0, 300) == " |##########..........| 50% 02:30/05:00, ETA 02:30"
    assert progress_bar(410_000, 400_000, 100.0, 10**10) == " |####################| 100% 400k/400k frames, ETA 00:00"
    assert progress_bar(3_000, 400_000, 2.0, 10**10) == ""  # 0.75%: no bar yet
    assert progress_bar(0, 10**10, 7200.0 * 0.25, 7200) == " |#####...............| 25% 30:00/2:00:00, ETA 1:30:00"


def test_log_progress_counts_a_resumed_run_from_where_it_started(caplog):
    """run_log.log_progress: the frames of this run only (200k of 400k after resuming at 100k of 500k)."""
    fake = SimpleNamespace(stats=SimpleNamespace(start_frames=100_000, report_line=lambda: "Fps is (...)."),
                           num_policies=1, trained_frames=lambda: 300_000, world=World(), data_parallel=False,
                           cfg=SimpleNamespace(train_for_env_steps=500_000, train_for_seconds=10**10))
    with caplog.at_level(logging.INFO, logger="sf"):
        run_log.log_progress(fake, time.time() - 100.0)
    assert caplog.records[-1].getMessage() == "Fps is (...). |##########..........| 50% 200k/400k frames, ETA 01:40"


def test_format_duration():
    assert format_duration(0.4) == "0 s"
    assert format_duration(45) == "45 s"
    assert format_duration(6 * 60 + 12) == "6 min 12 s"
    assert format_duration(2 * 3600 + 5 * 60 + 9) == "2 h 05 min 09 s"


# --- tracking.check / tracking.start / WandbTracker with a stand-in wandb ---

def _cfg(tmp_path, *flags):
    return parse_cfg(["--env", "test_corridor", "--experiment", "trk", "--train_dir", str(tmp_path), "--with_wandb",
                      "True", *flags], mode="train", prog="train.py")


def test_check_missing_or_broken_wandb(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ModuleNotFoundError (name 'wandb')
    with pytest.raises(ConfigError, match=r"^--with_wandb: the wandb package is not installed \(pip install wandb\)$"):
        tracking.check(cfg)
    tracking.check(parse_cfg(["--env", "test_corridor", "--train_dir", str(tmp_path)]))  # without --with_wandb: no-op
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "wandb.py").write_text("raise ImportError(\"cannot import name 'x' from 'google.protobuf'\")\n")
    monkeypatch.delitem(sys.modules, "wandb")
    monkeypatch.syspath_prepend(str(broken))
    with pytest.raises(ConfigError, match=r"^--with_wandb: the wandb package cannot be imported \(ImportError: cannot "
                                          r"import name 'x' from 'google.protobuf'\); reinstall it"):
        tracking.check(cfg)
    sys.modules.pop("wandb", None)


class FakeRun:
    def __init__(self, log_error=None, finish_blocks=None):
        self.rows, self.metrics, self.finished = [], [], None
        self.log_error, self.finish_blocks = log_error, finish_blocks
        self.project, self.dir, self.settings = "sf", "/nowhere", SimpleNamespace(mode="offline")

    def define_metric(self, name, **kwargs):
        self.metrics.append((name, kwargs))

    def log(self, row):
        if self.log_error:
            raise self.log_error
        self.rows.append(row)

    def finish(self, exit_code=0):
        if self.finish_blocks is not None:
            self.finish_blocks.wait()
        self.finished = exit_code


def _fake_wandb(run=None, init_error=None):
    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        if init_error:
            raise init_error
        return run

    return types.SimpleNamespace(init=init, Settings=lambda **kw: ("settings", kw)), calls


def test_start_initializes_once_with_the_flags_and_a_stable_run_id(tmp_path, monkeypatch):
    run = FakeRun()
    fake, calls = _fake_wandb(run)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_FINISH_TIMEOUT", raising=False)
    cfg = _cfg(tmp_path, "--wandb_user", "me", "--wandb_project", "proj", "--wandb_group", "grp", "--wandb_job_type",
               "train", "--wandb_tags", "a", "b")
    cfg = cfg.replace(_notes=("not a parameter",))
    exp = tmp_path / "trk"
    exp.mkdir()
    tracker = tracking.start(cfg, exp)
    assert isinstance(tracker, tracking.WandbTracker)
    kw = calls[0]
    assert (kw["project"], kw["entity"], kw["group"], kw["job_type"], kw["tags"], kw["name"]) == \
        ("proj", "me", "grp", "train", ["a", "b"], "trk")
    assert kw["dir"] == str(exp) and kw["resume"] == "allow"
    assert kw["config"]["wandb_group"] == "grp" and kw["config"]["env"] == "test_corridor"
    assert not any(k.startswith("_") for k in kw["config"])
    assert kw["id"] == (exp / "wandb_run_id").read_text().strip() and re.fullmatch(r"trk_[0-9a-f]{8}", kw["id"])
    assert ("*", {"step_metric": "global_step"}) in run.metrics
    tracker.log({"perf/_fps": 10.0, "train/policy_version": 3}, 1000, {"train/policy_lag_batches": [1.0, 2.0]})
    assert tracker.finish(exit_code=1, timeout=10)
    assert run.rows == [{"perf/_fps": 10.0, "train/policy_version": 3.0, "global_step": 1000},
                        {"train/policy_lag_batches": 1.0, "global_step": 1000},
                        {"train/policy_lag_batches": 2.0, "global_step": 1000}]
    assert run.finished == 1
    assert tracking.start(cfg, exp).finish(timeout=10)  # resumed: the same run id
    assert calls[1]["id"] == kw["id"]


def test_start_failure_is_one_warning_and_no_tracker(tmp_path, monkeypatch, caplog):
    fake, _ = _fake_wandb(init_error=RuntimeError("network is unreachable\nmore"))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with caplog.at_level(logging.WARNING, logger="sf"):
        assert tracking.start(_cfg(tmp_path), tmp_path) is None
    assert [r.getMessage() for r in caplog.records] == [
        "--with_wandb: W&B could not start (RuntimeError: network is unreachable); training with TensorBoard only"]
    assert tracking.start(parse_cfg(["--env", "test_corridor", "--train_dir", str(tmp_path)]), tmp_path) is None


def test_log_failure_warns_once_and_finish_is_bounded(caplog):
    run = FakeRun(log_error=ConnectionError("wandb-core is gone"))
    tracker = tracking.WandbTracker(run)
    with caplog.at_level(logging.WARNING, logger="sf"):
        for step in range(5):
            tracker.log({"perf/_fps": 1.0}, step)
        assert tracker.finish(timeout=10)
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["W&B logging failed (ConnectionError: wandb-core is gone); "
                        "training goes on with TensorBoard only"]
    assert run.finished == 0  # finished all the same

    release = threading.Event()
    hung = tracking.WandbTracker(FakeRun(finish_blocks=release))
    t0 = time.monotonic()
    try:
        assert hung.finish(timeout=0.5) is False
        assert time.monotonic() - t0 < 3
    finally:
        release.set()


# --- for real: a tiny training run with wandb offline ---

def _wandb_records(path: Path) -> list:
    """The records of an offline run's .wandb file (LevelDB log format: 32 KiB blocks of chunks, each with a 7-byte
    header of crc32, length and type; a 7-byte W&B header first), as wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2
    data, pos, block = path.read_bytes(), 7, 32768
    assert data[:4] == b":W&B"
    payloads, partial = [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's trailer: zeros
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:  # full
            payloads.append(chunk)
        elif kind == 2:  # first
            partial = chunk
        elif kind == 3:  # middle
            partial += chunk
        elif kind == 4:  # last
            payloads.append(partial + chunk)
    records = []
    for p in payloads:
        r = wandb_internal_pb2.Record()
        r.ParseFromString(p)
        records.append(r)
    return records


def _history(records) -> list[dict]:
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def _offline_runs(exp: Path) -> list[Path]:
    return sorted((exp / "wandb").glob("offline-run-*/run-*.wandb"))


@pytest.mark.e2e
def test_wandb_offline_run_logs_what_tensorboard_gets_and_resumes_the_same_run(tmp_path, entry):
    pytest.importorskip("wandb")
    env = {"WANDB_MODE": "offline", "WANDB_CONFIG_DIR": str(tmp_path / "cfg"),
           "WANDB_CACHE_DIR": str(tmp_path / "cache"), "WANDB_DATA_DIR": str(tmp_path / "data")}
    args = train_args(tmp_path, "test_corridor", "--num_workers", "2")
    res = entry("train.py", *args, "--train_for_env_steps", "3000", "--with_wandb", "True", "--wandb_tags", "t1",
                timeout=240, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    exp = tmp_path / "e2e"
    run_id = (exp / "wandb_run_id").read_text().strip()
    runs = _offline_runs(exp)
    assert [p.name for p in runs] == [f"run-{run_id}.wandb"]
    records = _wandb_records(runs[0])
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.run_id, run.project, run.display_name, list(run.tags)) == (run_id, "sf", "e2e", ["t1"])
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["train_for_env_steps"] == 3000 and config["with_wandb"] is True
    history = _history(records)
    tb = read_event_scalars(exp)  # TensorBoard still gets everything
    for tag in ("perf/_fps", "reward/reward", "train/policy_version", "train/policy_lag_avg", "memory/rss_mb_learner"):
        assert tag in tb, tag
        # the same points: TensorBoard's step is W&B's global_step (env frames)
        assert sorted((row["global_step"], float(np.float32(row[tag]))) for row in history if tag in row) == \
            sorted(tb[tag]), tag  # (TensorBoard keeps float32)
    assert [row["_step"] for row in history] == list(range(len(history)))  # wandb's own step: row after row
    done = DONE_LINE.search(res.stdout)
    assert done and int(done.group(1)) >= 3000 and int(done.group(2)) > 0, res.stdout[-2000:]

    # --restart_behavior resume (the default) continues the same W&B run
    res = entry("train.py", *args, "--train_for_env_steps", "4500", timeout=240, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = _offline_runs(exp)
    assert len(runs) == 2 and {p.name for p in runs} == {f"run-{run_id}.wandb"}
    history = _history(_wandb_records(runs[1]))
    assert max(row["global_step"] for row in history if "train/policy_version" in row) >= 4500
    assert DONE_LINE.search(res.stdout)


@pytest.mark.e2e
def test_with_wandb_without_the_package_is_one_line_exit_2(tmp_path, entry):
    fake = tmp_path / "no_wandb"
    fake.mkdir()
    (fake / "wandb.py").write_text("raise ModuleNotFoundError(\"No module named 'wandb'\", name='wandb')\n")
    res = entry("train.py", "--env", "test_corridor", "--experiment", "e2e", "--train_dir", str(tmp_path / "train"),
                "--with_wandb", "True", "--train_for_env_steps", "3000", timeout=120, env={"PYTHONPATH": str(fake)})
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "train.py: error: --with_wandb: the wandb package is not installed (pip install wandb)"]
    assert "Started" not in res.stdout
    assert not (tmp_path / "train").exists()  # before anything is written
