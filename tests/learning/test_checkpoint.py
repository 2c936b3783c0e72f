"""Checkpoint module: roundtrip, weights_only safety, pruning, best, corruption fallback, verification of
forged files (never trusted by their names), compatibility errors, one-line I/O errors (disk full, read-only)
and kill-safety of the atomic write."""
import logging
import multiprocessing as mp
import errno
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from sf.learning import checkpoint_store as ckpt
from sf.learning.checkpoint import (CheckpointError, check_compatible, load_into, make_checkpoint_state,
                                    model_signature, restore_rng_states)
from sf.learning.checkpoint_store import CheckpointManager


class TinyModel(nn.Module):
    """A small net with a normalizer-like buffer (buffers must travel in the checkpoint too)."""

    def __init__(self, hidden: int = 8):
        super().__init__()
        self.fc1 = nn.Linear(4, hidden)
        self.fc2 = nn.Linear(hidden, 2)
        self.register_buffer("obs_mean", torch.zeros(4))
        self.register_buffer("obs_count", torch.zeros((), dtype=torch.float64))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1((x - self.obs_mean))))


def trained_model(hidden: int = 8, steps: int = 3):
    model = TinyModel(hidden)
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    for _ in range(steps):
        loss = model(torch.randn(16, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.obs_mean.fill_(0.25)
    model.obs_count.fill_(123.0)
    return model, opt


def meta_for(model, env="doom_basic", obs="Dict('obs': Box(0, 255, (3, 72, 128), uint8))", act="Discrete(3)"):
    return {"env": env, "observation_space": obs, "action_space": act, "model": model_signature(model)}


def small_state(version: int, steps: int, model=None, meta=None):
    model = model or TinyModel()
    return make_checkpoint_state(model, None, version, steps, meta or meta_for(model))


def names(paths):
    return [p.name for p in paths]


# --- roundtrip ---------------------------------------------------------------------------------------------

def test_roundtrip_model_optimizer_and_rng(tmp_path):
    torch.manual_seed(1)
    model, opt = trained_model()
    meta = meta_for(model)
    state = make_checkpoint_state(model, opt, 7, 1234, meta, extra={"note": "hello"})
    mgr = CheckpointManager(tmp_path, policy_id=0)
    path = mgr.save(state, 7, 1234)
    assert path == tmp_path / "checkpoint_p0" / "checkpoint_000000007_1234.pth"

    # the random numbers drawn right after saving are what a restored run must draw again
    expected = torch.rand(5)

    torch.manual_seed(99)
    model2 = TinyModel()
    opt2 = torch.optim.Adam(model2.parameters(), lr=1.0)
    loaded = CheckpointManager(tmp_path).load("latest")
    assert loaded["path"] == str(path)
    assert loaded["policy_version"] == 7 and loaded["env_steps"] == 1234 and loaded["note"] == "hello"
    assert loaded["meta"] == meta and loaded["lr"] == [3e-4]
    check_compatible(loaded["meta"], meta_for(model2), loaded["path"])
    load_into(model2, opt2, loaded)
    for (k, a), (k2, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k
    assert model2.obs_count.item() == 123.0  # buffers travel too
    assert opt2.param_groups[0]["lr"] == 3e-4
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert s1.keys() == s2.keys()
    for i in s1:
        assert torch.equal(s1[i]["exp_avg"], s2[i]["exp_avg"]) and torch.equal(s1[i]["exp_avg_sq"], s2[i]["exp_avg_sq"])

    # the optimizer continues identically: one more step on both gives the same weights
    x = torch.randn(8, 4)
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m(x).pow(2).mean().backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))

    torch.rand(3)  # move the RNG on
    restore_rng_states(loaded)
    assert torch.equal(torch.rand(5), expected)


def test_global_numpy_and_python_states_are_not_saved_and_old_ones_are_ignored(tmp_path):
    """The learner draws from torch's global generator only (seeded from --seed): numpy's and Python's, never seeded,
    made two identical runs save different checkpoints. A checkpoint of an earlier version that holds them (in the form
    it wrote) still loads, and restoring it leaves those generators alone."""
    state = small_state(1, 1)
    assert set(state["rng"]) == {"torch"}  # (and "cuda" where CUDA is in use)
    np_state = np.random.get_state(legacy=True)
    version, internal, gauss = random.getstate()
    old = dict(state, rng=dict(state["rng"], python=[int(version), [int(x) for x in internal], gauss],
                               numpy=[str(np_state[0]), torch.from_numpy(np_state[1].astype(np.int64)),
                                      int(np_state[2]), int(np_state[3]), float(np_state[4])]))
    CheckpointManager(tmp_path).save(old, 1, 1)
    loaded = CheckpointManager(tmp_path).load("latest")
    assert set(loaded["rng"]) == {"torch", "numpy", "python"}
    np.random.seed(4)
    random.seed(4)
    restore_rng_states(loaded)
    expected_np, expected_py = np.random.RandomState(4).rand(3), random.Random(4).random()
    assert np.array_equal(np.random.rand(3), expected_np) and random.random() == expected_py


def test_content_is_weights_only_safe(tmp_path):
    model, opt = trained_model()
    state = make_checkpoint_state(model, opt, 3, 300, meta_for(model))
    path = CheckpointManager(tmp_path).save(state, 3, 300)
    raw = torch.load(path, weights_only=True)  # the strict unpickler accepts every value
    assert set(raw) >= {"model", "optimizer", "policy_version", "env_steps", "lr", "rng", "meta"}
    assert set(raw["rng"]) == {"torch"}

    bad = dict(state, extra_array=np.zeros(3))  # a value weights_only would refuse: rejected before writing
    with pytest.raises(TypeError, match="extra_array"):
        CheckpointManager(tmp_path).save(bad, 4, 400)
    assert names(CheckpointManager(tmp_path).latest()) == [path.name]


def test_extra_keys_cannot_clash():
    model = TinyModel()
    with pytest.raises(ValueError, match="policy_version"):
        make_checkpoint_state(model, None, 1, 1, meta_for(model), extra={"policy_version": 5})


# --- pruning and best --------------------------------------------------------------------------------------

def test_pruning_keeps_n_latest_in_numeric_order(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_checkpoints=3)
    # env steps are not zero-padded in the name: 999 < 1000 must hold numerically
    for version, steps in ((1, 10), (2, 999), (2, 1000), (3, 5000), (10, 9000), (11, 12000)):
        mgr.save(small_state(version, steps), version, steps)
    assert names(mgr.latest()) == ["checkpoint_000000011_12000.pth", "checkpoint_000000010_9000.pth",
                                   "checkpoint_000000003_5000.pth"]
    assert len(list(mgr.dir.glob("*.pth"))) == 3
    assert mgr.load()["policy_version"] == 11


def test_milestones_are_never_pruned(tmp_path):
    """--save_milestones_sec: a copy in milestones/ outlives pruning and restarts, loads, and is not a candidate for
    latest (a resumed run still continues from the newest regular checkpoint)."""
    mgr = CheckpointManager(tmp_path, keep_checkpoints=1)
    for version in (1, 2, 3):
        path = mgr.save(small_state(version, version * 100), version, version * 100)
        if version < 3:
            assert mgr.save_milestone(path) == mgr.dir / "milestones" / path.name
    assert names(mgr.latest()) == ["checkpoint_000000003_300.pth"]
    kept = sorted(p.name for p in (mgr.dir / "milestones").iterdir())
    assert kept == ["checkpoint_000000001_100.pth", "checkpoint_000000002_200.pth"]
    again = CheckpointManager(tmp_path, keep_checkpoints=1)
    again.save(small_state(4, 400), 4, 400)
    assert len(list((mgr.dir / "milestones").iterdir())) == 2 and again.load()["policy_version"] == 4
    assert torch.load(mgr.dir / "milestones" / kept[0], weights_only=True)["policy_version"] == 1


def test_just_saved_checkpoint_is_never_pruned(tmp_path):
    # a newer-named file (e.g. a corrupted one load skipped) must not push out the resumed run's progress
    mgr = CheckpointManager(tmp_path, keep_checkpoints=1)
    mgr.save(small_state(50, 5000), 50, 5000)
    path = mgr.save(small_state(20, 2000), 20, 2000)
    assert path.exists()


def test_best_replaced_only_by_better_and_survives_restart(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_checkpoints=2, save_best_metric="reward")
    assert mgr.load("best") is None
    first = mgr.save_best(small_state(1, 100), 1, 100, 1.5)
    assert first is not None and first.name == "best_000000001_100_reward_1.500.pth"
    assert mgr.save_best(small_state(2, 200), 2, 200, 1.0) is None
    assert mgr.save_best(small_state(3, 300), 3, 300, float("nan")) is None
    better = mgr.save_best(small_state(4, 400), 4, 400, 2.25)
    assert better.name == "best_000000004_400_reward_2.250.pth"
    assert names(mgr.dir.glob("best_*.pth")) == [better.name]  # only one best kept

    # regular saves and pruning do not touch it
    for v in range(5, 9):
        mgr.save(small_state(v, v * 100), v, v * 100)
    assert better.exists()

    restarted = CheckpointManager(tmp_path, keep_checkpoints=2, save_best_metric="reward")
    assert restarted.best_value == pytest.approx(2.25)
    assert restarted.save_best(small_state(9, 900), 9, 900, 2.0) is None
    assert restarted.load("best")["policy_version"] == 4
    newest = restarted.save_best(small_state(10, 1000), 10, 1000, -0.5 + 3.0)
    assert newest is not None and names(mgr.dir.glob("best_*.pth")) == [newest.name]
    assert restarted.load("best")["best_metric"] == {"name": "reward", "value": 2.5}

    # another metric starts from scratch and still leaves a single best file
    score = CheckpointManager(tmp_path, save_best_metric="score")
    assert score.best_value == float("-inf")
    s = score.save_best(small_state(11, 1100), 11, 1100, -7.0)
    assert s.name == "best_000000011_1100_score_-7.000.pth"
    assert names(mgr.dir.glob("best_*.pth")) == [s.name]


def test_best_value_after_restart_is_the_exact_stored_value(tmp_path):
    # was: parsed from the name (rounded to -12.346); now read from the file's best_metric
    mgr = CheckpointManager(tmp_path)
    path = mgr.save_best(small_state(1, 1), 1, 1, -12.3456)
    assert path.name == "best_000000001_1_reward_-12.346.pth"
    restarted = CheckpointManager(tmp_path)
    assert restarted.best_value == -12.3456
    assert restarted.save_best(small_state(2, 2), 2, 2, -12.3458) is None  # rounds to the same name, but is worse
    assert restarted.save_best(small_state(3, 3), 3, 3, -12.3455) is not None


# --- corruption --------------------------------------------------------------------------------------------

def _corrupt_truncate(p: Path):
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _corrupt_garbage(p: Path):
    p.write_bytes(b"garbage" * 10)


def _corrupt_empty(p: Path):
    p.write_bytes(b"")


def _corrupt_not_a_checkpoint(p: Path):
    torch.save([1, 2, 3], p)  # a valid torch file, but not a checkpoint dict


@pytest.mark.parametrize("corrupt", [_corrupt_truncate, _corrupt_garbage, _corrupt_empty, _corrupt_not_a_checkpoint])
def test_corrupted_latest_falls_back_with_warning(tmp_path, caplog, corrupt):
    mgr = CheckpointManager(tmp_path, keep_checkpoints=3)
    for v in (1, 2, 3):
        mgr.save(small_state(v, v * 10), v, v * 10)
    newest = mgr.latest()[0]
    corrupt(newest)
    with caplog.at_level(logging.WARNING):
        state = CheckpointManager(tmp_path).load("latest")
    assert state["policy_version"] == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and newest.name in warnings[0].getMessage()
    assert "checkpoint_000000002_20.pth" in warnings[0].getMessage()  # says what it falls back to


def test_all_corrupted_raises_one_line_error(tmp_path, caplog):
    mgr = CheckpointManager(tmp_path)
    for v in (1, 2):
        mgr.save(small_state(v, v), v, v)
    for p in mgr.latest():
        _corrupt_garbage(p)
    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointError) as e:
        mgr.load("latest")
    msg = str(e.value)
    assert "\n" not in msg and "checkpoint_000000002_2.pth" in msg and str(mgr.dir) in msg
    # one warning for the fallback from 2 to 1; the last failure has nothing to fall back to: the error says it
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1

    mgr.save_best(small_state(3, 3), 3, 3, 1.0)
    _corrupt_truncate(mgr.best())
    with pytest.raises(CheckpointError, match="best"):
        mgr.load("best")


def test_nothing_saved_returns_none(tmp_path):
    assert CheckpointManager(tmp_path / "does_not_exist").load() is None
    assert CheckpointManager(tmp_path).latest() == []
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path).load("oldest")


# --- compatibility -----------------------------------------------------------------------------------------

def _compat_error(saved, current, path="train_dir/x/checkpoint_p0/checkpoint_000000005_50.pth") -> str:
    with pytest.raises(CheckpointError) as e:
        check_compatible(saved, current, path)
    msg = str(e.value)
    assert "\n" not in msg and path in msg, msg
    return msg


def test_incompatible_meta_is_one_line_naming_file_and_item():
    model = TinyModel()
    saved = meta_for(model)
    check_compatible(saved, meta_for(TinyModel()), "p")  # same settings: fine

    msg = _compat_error(saved, meta_for(model, env="doom_defend_the_center"))
    assert "doom_basic" in msg and "doom_defend_the_center" in msg and "Discrete(3)" in msg

    msg = _compat_error(saved, meta_for(model, act="Discrete(5)"))
    assert "action space" in msg and "Discrete(3)" in msg and "Discrete(5)" in msg

    msg = _compat_error(saved, meta_for(model, obs="Dict('obs': Box(-1.0, 1.0, (7,), float32))"))
    assert "observation space" in msg

    msg = _compat_error(saved, meta_for(TinyModel(hidden=16)))
    assert "fc1.weight" in msg and "[8, 4]" in msg and "[16, 4]" in msg

    saved_missing = {k: v for k, v in saved.items() if k != "action_space"}
    assert "action space" in _compat_error(saved_missing, saved)
    assert "metadata" in _compat_error(None, saved)

    extra_param = dict(saved, model=dict(saved["model"], extra=[3]))
    assert "'extra'" in _compat_error(extra_param, saved)


def test_load_into_mismatched_model_is_one_line(tmp_path):
    model, opt = trained_model(hidden=8)
    mgr = CheckpointManager(tmp_path)
    mgr.save(make_checkpoint_state(model, opt, 1, 10, meta_for(model)), 1, 10)
    state = mgr.load()
    other = TinyModel(hidden=16)
    with pytest.raises(CheckpointError) as e:
        load_into(other, torch.optim.Adam(other.parameters()), state)
    assert "\n" not in str(e.value) and "checkpoint_000000001_10.pth" in str(e.value) and "fc1" in str(e.value)
    # the real model check through the saved meta gives the same kind of message
    with pytest.raises(CheckpointError, match="fc1.weight"):
        check_compatible(state["meta"], meta_for(other), state["path"])


def test_load_into_mismatched_optimizer_is_one_line(tmp_path):
    model, opt = trained_model()
    state = make_checkpoint_state(model, opt, 1, 10, meta_for(model))
    model2 = TinyModel()
    opt2 = torch.optim.Adam([{"params": [model2.fc1.weight]}, {"params": [model2.fc1.bias]}])  # other groups
    with pytest.raises(CheckpointError, match="optimizer"):
        load_into(model2, opt2, state)


# --- atomic writes -----------------------------------------------------------------------------------------

def test_leftover_temp_files_are_ignored_then_removed(tmp_path, caplog):
    mgr = CheckpointManager(tmp_path)
    mgr.save(small_state(1, 10), 1, 10)
    leftover = mgr.dir / "checkpoint_000000002_20.pth.4242.deadbeef.tmp"
    leftover.write_bytes(b"half a checkpoint")
    best_leftover = mgr.dir / "best_000000002_20_reward_9.000.pth.4242.cafe.tmp"
    best_leftover.write_bytes(b"")
    unrelated = mgr.dir / "notes.tmp"
    unrelated.write_text("not ours")
    with caplog.at_level(logging.WARNING):
        assert mgr.load()["policy_version"] == 1
    assert not caplog.records  # not even looked at
    assert mgr.latest() == [mgr.dir / "checkpoint_000000001_10.pth"]
    mgr.save(small_state(3, 30), 3, 30)
    assert not leftover.exists() and not best_leftover.exists() and unrelated.exists()


def test_failed_write_keeps_previous_and_leaves_no_partial_file(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path)
    mgr.save(small_state(1, 10), 1, 10)
    real_save = torch.save

    def half_then_fail(obj, f, *a, **kw):
        f.write(b"PK\x03\x04partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt.torch, "save", half_then_fail)
    with pytest.raises(CheckpointError, match="checkpoint_000000002_20.pth: No space left on device$"):
        mgr.save(small_state(2, 20), 2, 20)
    monkeypatch.setattr(ckpt.torch, "save", real_save)

    def replace_fails(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(ckpt.os, "replace", replace_fails)
    with pytest.raises(CheckpointError, match="checkpoint_000000003_30.pth: rename failed$"):
        mgr.save(small_state(3, 30), 3, 30)
    monkeypatch.undo()

    assert sorted(p.name for p in mgr.dir.iterdir()) == ["checkpoint_000000001_10.pth"]
    assert mgr.load()["policy_version"] == 1


def _save_forever(exp_dir: str, first_version: int, started) -> None:
    """Child process: save large checkpoints in a loop until killed. The weights of version v are all v, so a
    torn file is detectable even if it happened to unpickle."""
    mgr = CheckpointManager(Path(exp_dir), keep_checkpoints=2)
    started.set()
    v = first_version
    while True:
        state = {"model": {"w": torch.full((2_000_000,), float(v))}, "policy_version": v, "env_steps": v * 100,
                 "meta": {"env": "test"}}
        mgr.save(state, v, v * 100)
        if v % 3 == 0:
            mgr.save_best(state, v, v * 100, float(v))
        v += 1


@pytest.mark.e2e
def test_sigkill_during_save_always_leaves_a_loadable_checkpoint(tmp_path, caplog):
    # forkserver: children fork from a clean server that already imported torch (fast, and no fork of a
    # process whose thread pools are running).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "sf.learning.checkpoint_store"])
    mgr = CheckpointManager(tmp_path, keep_checkpoints=2)
    mgr.save({"model": {"w": torch.zeros(4)}, "policy_version": 0, "env_steps": 0, "meta": {"env": "test"}}, 0, 0)
    rng = random.Random(0)
    version, kills, mid_write = 1, 0, 0
    # ~10 kills; a few more if too few of them happened to land inside a write (about half of them do)
    while kills < 10 or (mid_write < 2 and kills < 25):
        kills += 1
        started = ctx.Event()
        p = ctx.Process(target=_save_forever, args=(str(tmp_path), version, started), daemon=True)
        p.start()
        assert started.wait(30), "saver child did not start"
        time.sleep(rng.uniform(0.0, 0.4))
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        assert p.exitcode == -signal.SIGKILL
        mid_write += any(mgr.dir.glob("*.tmp"))
        with caplog.at_level(logging.WARNING):
            state = CheckpointManager(tmp_path).load("latest")
        assert state is not None
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "a final-named file was torn"
        v = state["policy_version"]
        assert v >= version - 1 and torch.all(state["model"]["w"] == float(v))
        best = CheckpointManager(tmp_path).load("best")
        if best is not None:
            assert torch.all(best["model"]["w"] == float(best["policy_version"]))
        version = v + 1
    assert mid_write >= 1, "no kill landed during a write; the test did not test anything"
    CheckpointManager(tmp_path).save({"model": {"w": torch.zeros(1)}, "policy_version": version, "env_steps": 0,
                                      "meta": {}}, version, 0)
    assert not list(mgr.dir.glob("*.tmp"))
    assert len(CheckpointManager(tmp_path).latest()) == 2


# --- verification: files are not trusted by their names ------------------------------------------------------

STRAY = "checkpoint_000009999_99999999.pth"  # named like a far newer checkpoint


def _forge_garbage(mgr, name):
    (mgr.dir / name).write_bytes(b"\x00garbage" * 100)


def _forge_foreign_torch_file(mgr, name):
    torch.save({"weights": torch.ones(3), "step": 5}, mgr.dir / name)  # loads fine, but lacks our keys


def _forge_renamed_copy(mgr, name):
    # a real, fully loadable checkpoint whose name claims another version than its content
    shutil.copy(mgr.latest()[-1], mgr.dir / name)


FORGERIES = [_forge_garbage, _forge_foreign_torch_file, _forge_renamed_copy]


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("forge", FORGERIES)
def test_stray_regular_file_is_moved_aside_and_never_prunes_real_ones(tmp_path, caplog, forge):
    mgr = CheckpointManager(tmp_path, keep_checkpoints=2)
    for v in (1, 2):
        mgr.save(small_state(v, v * 10), v, v * 10)
    forge(mgr, STRAY)
    stray_bytes = (mgr.dir / STRAY).read_bytes()

    with caplog.at_level(logging.WARNING):
        for v in (3, 4, 5):
            mgr.save(small_state(v, v * 10), v, v * 10)
    # the issue: with the stray counted as the newest, only one real checkpoint was left
    assert names(mgr.latest()) == ["checkpoint_000000005_50.pth", "checkpoint_000000004_40.pth"]
    assert sorted(p.name for p in mgr.dir.glob("*.pth")) == ["checkpoint_000000004_40.pth",
                                                             "checkpoint_000000005_50.pth"]
    moved = mgr.dir / "rejected" / STRAY
    assert moved.read_bytes() == stray_bytes  # kept for inspection, outside every glob of ours
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and STRAY in warnings[0] and "rejected" in warnings[0], warnings

    state = CheckpointManager(tmp_path).load("latest")
    assert state["policy_version"] == 5 and state["path"].endswith("checkpoint_000000005_50.pth")


@pytest.mark.parametrize("forge", FORGERIES)
def test_stray_regular_file_at_resume_falls_back_to_the_real_latest(tmp_path, caplog, forge):
    mgr = CheckpointManager(tmp_path, keep_checkpoints=2)
    for v in (1, 2):
        mgr.save(small_state(v, v * 10), v, v * 10)
    forge(mgr, STRAY)
    resumed = CheckpointManager(tmp_path, keep_checkpoints=2)
    with caplog.at_level(logging.WARNING):
        state = resumed.load("latest")
    assert state["policy_version"] == 2
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and STRAY in warnings[0] and "checkpoint_000000002_20.pth" in warnings[0]
    assert not (mgr.dir / STRAY).exists() and (mgr.dir / "rejected" / STRAY).exists()
    assert names(resumed.latest()) == ["checkpoint_000000002_20.pth", "checkpoint_000000001_10.pth"]


def test_name_must_match_content_exactly(tmp_path, caplog):
    mgr = CheckpointManager(tmp_path, keep_checkpoints=5)
    real = mgr.save(small_state(3, 30), 3, 30)
    # same numbers, other spelling (no zero padding): still not the name this content gives
    shutil.copy(real, mgr.dir / "checkpoint_3_30.pth")
    shutil.copy(real, mgr.dir / "checkpoint_000000003_31.pth")  # env steps disagree
    with caplog.at_level(logging.WARNING):
        assert names(mgr.latest()) == [real.name]
    assert sorted(p.name for p in (mgr.dir / "rejected").iterdir()) == ["checkpoint_000000003_31.pth",
                                                                       "checkpoint_3_30.pth"]
    assert any("would be named checkpoint_000000003_30.pth" in w for w in _warnings(caplog))


def test_second_stray_of_the_same_name_is_kept_too(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(small_state(1, 10), 1, 10)
    for content in (b"first", b"second"):
        (mgr.dir / STRAY).write_bytes(content)
        assert mgr.load()["policy_version"] == 1
    rejected = mgr.dir / "rejected"
    assert (rejected / STRAY).read_bytes() == b"first" and (rejected / f"{STRAY}.1").read_bytes() == b"second"


HUGE_BEST = "best_000000099_9900_reward_1000000.000.pth"


def _forge_best_garbage(mgr, name):
    (mgr.dir / name).write_bytes(b"not a checkpoint")


def _forge_best_from_regular(mgr, name):
    # a real checkpoint (right version and steps) without best_metric, renamed to claim a huge value
    torch.save(small_state(99, 9900), mgr.dir / name)


def _forge_best_value_in_name(mgr, name):
    # a complete best checkpoint whose stored value (3.0) is not the one in its name
    torch.save(dict(small_state(99, 9900), best_metric={"name": "reward", "value": 3.0}), mgr.dir / name)


BEST_FORGERIES = [_forge_best_garbage, _forge_best_from_regular, _forge_best_value_in_name]


@pytest.mark.parametrize("forge", BEST_FORGERIES)
def test_stray_best_file_does_not_set_the_best_value(tmp_path, caplog, forge):
    mgr = CheckpointManager(tmp_path, save_best_metric="reward")
    real = mgr.save_best(small_state(1, 100), 1, 100, 1.5)
    forge(mgr, HUGE_BEST)

    restarted = CheckpointManager(tmp_path, save_best_metric="reward")
    with caplog.at_level(logging.WARNING):
        assert restarted.best_value == 1.5  # from the real best file's metadata
        assert restarted.best() == real
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and HUGE_BEST in warnings[0], warnings
    assert (mgr.dir / "rejected" / HUGE_BEST).exists() and not (mgr.dir / HUGE_BEST).exists()

    # the issue: no best checkpoint was ever saved again; now an improvement is saved
    assert restarted.save_best(small_state(2, 200), 2, 200, 1.0) is None
    better = restarted.save_best(small_state(3, 300), 3, 300, 2.0)
    assert better is not None and names(mgr.dir.glob("best_*.pth")) == [better.name]
    loaded = CheckpointManager(tmp_path).load("best")  # what enjoy --load_checkpoint_kind best does
    assert loaded["path"] == str(better) and loaded["best_metric"] == {"name": "reward", "value": 2.0}


@pytest.mark.parametrize("forge", BEST_FORGERIES)
def test_only_a_stray_best_file(tmp_path, caplog, forge):
    mgr = CheckpointManager(tmp_path, save_best_metric="reward")
    mgr.save(small_state(1, 10), 1, 10)
    forge(mgr, HUGE_BEST)
    enjoy = CheckpointManager(tmp_path)
    # the stray is not a best checkpoint; and since a file was there, this is an error, not "train first"
    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointError) as e:
        enjoy.load("best")
    msg = str(e.value)
    assert "\n" not in msg and HUGE_BEST in msg and "rejected" in msg
    with pytest.raises(CheckpointError, match="moved to .*rejected"):  # a later run is told too
        CheckpointManager(tmp_path).load("best")

    learner = CheckpointManager(tmp_path, save_best_metric="reward")
    assert learner.best_value == float("-inf") and learner.best() is None
    first = learner.save_best(small_state(2, 20), 2, 20, 0.25)
    assert first is not None
    assert CheckpointManager(tmp_path).load("best")["policy_version"] == 2


def test_best_of_another_metric_is_deleted_only_when_verified(tmp_path):
    mgr = CheckpointManager(tmp_path, save_best_metric="score")
    old = mgr.save_best(small_state(1, 10), 1, 10, 5.0)
    unrelated = mgr.dir / "best_notes.pth"  # not named like ours: never touched
    unrelated.write_bytes(b"x")
    forged = mgr.dir / "best_000000002_20_score_9.000.pth"
    forged.write_bytes(b"garbage")
    reward = CheckpointManager(tmp_path, save_best_metric="reward")
    new = reward.save_best(small_state(3, 30), 3, 30, 1.0)
    assert not old.exists() and unrelated.exists() and (mgr.dir / "rejected" / forged.name).exists()
    assert sorted(p.name for p in mgr.dir.glob("best_*.pth")) == sorted([new.name, unrelated.name])


def test_unreadable_file_is_left_in_place_not_counted_not_deleted(tmp_path, caplog, monkeypatch):
    # e.g. a file this user may not read: it may be fine, so it is not moved aside, but it never decides
    # what is pruned or loaded
    mgr = CheckpointManager(tmp_path, keep_checkpoints=1)
    mgr.save(small_state(1, 10), 1, 10)
    locked = mgr.dir / STRAY
    torch.save(small_state(9999, 99999999), locked)
    real_load = ckpt._load_for_verification

    def load(path):
        if path.name == STRAY:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_load(path)

    monkeypatch.setattr(ckpt, "_load_for_verification", load)
    resumed = CheckpointManager(tmp_path, keep_checkpoints=1)
    with caplog.at_level(logging.WARNING):
        assert resumed.load()["policy_version"] == 1
        resumed.save(small_state(2, 20), 2, 20)
    assert locked.exists() and not (mgr.dir / "rejected").exists()
    assert names(resumed.latest()) == ["checkpoint_000000002_20.pth"]
    assert sorted(p.name for p in mgr.dir.glob("*.pth")) == ["checkpoint_000000002_20.pth", STRAY]
    assert any(STRAY in w and "Permission denied" in w for w in _warnings(caplog))


def test_each_file_is_read_once_per_manager(tmp_path, monkeypatch):
    writer = CheckpointManager(tmp_path, keep_checkpoints=3)
    for v in (1, 2, 3):
        writer.save(small_state(v, v * 10), v, v * 10)
    writer.save_best(small_state(3, 30), 3, 30, 1.0)
    reads = []
    real_load = ckpt._load_for_verification
    monkeypatch.setattr(ckpt, "_load_for_verification", lambda p: reads.append(p.name) or real_load(p))

    mgr = CheckpointManager(tmp_path, keep_checkpoints=3)
    assert reads == []  # constructing reads nothing
    for v in range(4, 10):
        mgr.save(small_state(v, v * 10), v, v * 10)
        mgr.save_best(small_state(v, v * 10), v, v * 10, float(v))
    mgr.latest(), mgr.best(), mgr.best_value
    # only the files of the previous run were read, each once; what this manager wrote is known already
    assert sorted(reads) == sorted(["checkpoint_000000001_10.pth", "checkpoint_000000002_20.pth",
                                    "checkpoint_000000003_30.pth", "best_000000003_30_reward_1.000.pth"])

    # a file changed on disk (same name, other content) is read again
    reads.clear()
    newest = mgr.latest()[0]
    torch.save(small_state(99, 99), newest)
    assert newest not in mgr.latest() and reads == [newest.name]


def test_save_refuses_state_that_would_not_verify(tmp_path):
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(ValueError, match="policy_version 1"):
        mgr.save(small_state(1, 10), 2, 10)  # the name would disagree with the content
    with pytest.raises(ValueError, match="keys"):
        mgr.save({"model": {}}, 1, 10)
    with pytest.raises(ValueError, match="best_metric"):
        model = TinyModel()
        make_checkpoint_state(model, None, 1, 1, meta_for(model), extra={"best_metric": 1})
    assert not mgr.dir.exists() or not list(mgr.dir.iterdir())


# --- I/O failures: one line, previous files intact ---------------------------------------------------------

def _snapshot(directory: Path) -> dict:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def _big_state(version: int, steps: int) -> dict:
    model = TinyModel()
    return make_checkpoint_state(model, None, version, steps, meta_for(model), extra={"blob": torch.zeros(400_000)})


def _one_line_error(excinfo, *parts):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for part in parts:
        assert part in msg, (part, msg)
    return msg


@pytest.fixture
def small_fs(tmp_path):
    """A real 1 MiB filesystem (tmpfs); skipped where mounting is not allowed."""
    mnt = tmp_path / "small_fs"
    mnt.mkdir()
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot mount a small tmpfs here: {e}")
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def _remount(mnt: Path, mode: str):
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True, capture_output=True, timeout=30)


def test_disk_full_on_a_real_filesystem(small_fs):
    mgr = CheckpointManager(small_fs / "exp", keep_checkpoints=2)
    mgr.save(small_state(1, 10), 1, 10)
    mgr.save_best(small_state(1, 10), 1, 10, 1.0)
    before = _snapshot(mgr.dir)

    with pytest.raises(CheckpointError) as e:
        mgr.save(_big_state(12, 4096), 12, 4096)
    _one_line_error(e, f"cannot write checkpoint {mgr.dir / 'checkpoint_000000012_4096.pth'}: No space left on device")
    with pytest.raises(CheckpointError) as e:
        mgr.save_best(_big_state(12, 4096), 12, 4096, 2.0)
    _one_line_error(e, str(mgr.dir / "best_000000012_4096_reward_2.000.pth"), "No space left on device")
    assert _snapshot(mgr.dir) == before  # byte-identical, and no temp file left behind
    assert mgr.best_value == 1.0  # the failed best does not count

    # once there is room again (here: a smaller checkpoint), saving works and prunes as usual
    mgr.save(small_state(13, 5000), 13, 5000)
    assert mgr.save_best(small_state(13, 5000), 13, 5000, 2.0) is not None
    assert CheckpointManager(small_fs / "exp").load()["policy_version"] == 13


def test_read_only_filesystem(small_fs, caplog):
    mgr = CheckpointManager(small_fs / "exp", keep_checkpoints=2)
    for v in (1, 2):
        mgr.save(small_state(v, v * 10), v, v * 10)
    (mgr.dir / STRAY).write_bytes(b"garbage")
    before = _snapshot(mgr.dir)
    _remount(small_fs, "ro")
    try:
        with pytest.raises(CheckpointError) as e:
            mgr.save(small_state(3, 30), 3, 30)
        _one_line_error(e, str(mgr.dir / "checkpoint_000000003_30.pth"), "Read-only file system")
        with pytest.raises(CheckpointError) as e:
            mgr.save_best(small_state(3, 30), 3, 30, 1.0)
        _one_line_error(e, "Read-only file system")
        with pytest.raises(CheckpointError) as e:
            CheckpointManager(small_fs / "other_exp").save(small_state(1, 1), 1, 1)
        _one_line_error(e, f"cannot create checkpoint directory {small_fs / 'other_exp' / 'checkpoint_p0'}",
                        "Read-only file system")
        # reading still works; the stray cannot be moved aside, so it is ignored (and reported once)
        reader = CheckpointManager(small_fs / "exp")
        with caplog.at_level(logging.WARNING):
            assert reader.load()["policy_version"] == 2
            assert names(reader.latest()) == ["checkpoint_000000002_20.pth", "checkpoint_000000001_10.pth"]
        warnings = _warnings(caplog)
        assert len(warnings) == 1 and STRAY in warnings[0] and "could not move" in warnings[0], warnings
        assert _snapshot(mgr.dir) == before
    finally:
        _remount(small_fs, "rw")


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EIO])
@pytest.mark.parametrize("where", ["open", "write", "fsync", "replace"])
def test_os_errors_during_save_are_one_line(tmp_path, monkeypatch, err, where):
    """The same contract without a real filesystem: every step of the atomic write may fail."""
    mgr = CheckpointManager(tmp_path)
    mgr.save(small_state(1, 10), 1, 10)
    mgr.save_best(small_state(1, 10), 1, 10, 1.0)
    before = _snapshot(mgr.dir)
    failure = OSError(err, os.strerror(err))

    def fail(*a, **kw):
        raise failure

    if where == "write":
        # a file whose writes fail after a few bytes: torch.save turns this into a RuntimeError that only
        # carries the OSError as its context, as on a really full disk
        real_fdopen = os.fdopen

        class Failing:
            def __init__(self, f):
                self.f, self.n = f, 0

            def write(self, b):
                self.n += len(b)
                if self.n > 64:
                    raise failure
                return self.f.write(b)

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

        monkeypatch.setattr(ckpt.os, "fdopen", lambda *a, **kw: Failing(real_fdopen(*a, **kw)))
    else:
        monkeypatch.setattr(ckpt.os, where, fail)
    for call, name in ((lambda: mgr.save(small_state(2, 20), 2, 20), "checkpoint_000000002_20.pth"),
                       (lambda: mgr.save_best(small_state(2, 20), 2, 20, 5.0), "best_000000002_20_reward_5.000.pth")):
        with pytest.raises(CheckpointError) as e:
            call()
        _one_line_error(e, f"cannot write checkpoint {mgr.dir / name}: {os.strerror(err)}")
    monkeypatch.undo()
    assert _snapshot(mgr.dir) == before
    assert mgr.best_value == 1.0 and mgr.load()["policy_version"] == 1


def test_name_too_long(tmp_path):
    exp = tmp_path / ("x" * 300)  # a directory component longer than any filesystem allows
    with pytest.raises(CheckpointError) as e:
        CheckpointManager(exp).save(small_state(1, 1), 1, 1)
    _one_line_error(e, "cannot create checkpoint directory", "File name too long")
    with pytest.raises(CheckpointError) as e:
        CheckpointManager(exp).load()
    _one_line_error(e, "cannot read checkpoint directory", "File name too long")


# --- nothing trained, nothing rewritten --------------------------------------------------------------------

def test_holds_only_a_verified_checkpoint_of_that_version_and_frames(tmp_path, caplog):
    mgr = CheckpointManager(tmp_path)
    saved = mgr.save(small_state(3, 300), 3, 300)
    assert mgr.holds(3, 300) == saved and mgr.holds(3, 301) is None and mgr.holds(4, 300) is None
    forged = mgr.dir / "checkpoint_000000005_500.pth"
    forged.write_bytes(b"not a checkpoint")
    assert mgr.holds(5, 500) is None and not forged.exists()  # a forged file does not count (moved aside)


def _experiment_files(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}


def test_learner_that_trained_nothing_rewrites_nothing(tmp_path):
    """A resumed learner stopped before it trained a batch (a Ctrl-C right after start, say): its final save leaves
    the checkpoint directory byte-identical, mtimes included (the checkpoint is not written again under the same name,
    the best one is not relabelled with this run's episodes), and still reports its final checkpoint. Once it has
    trained, it saves."""
    from types import SimpleNamespace

    from sf.buffers.shared_weights import SharedWeights
    from sf.buffers.trajectory_buffers import TrajectoryBuffers
    from sf.cfg import parse_cfg
    from sf.ipc import Queue
    from sf.learning.learner import Learner
    from sf.model.actor_critic import create_actor_critic
    from sf.processes.shared_state import SharedState
    from sf.runner.population.control import fill_shared, initial_hyperparams
    from sf_envs.registry import make_env

    cfg = parse_cfg(["--env", "test_corridor", "--experiment", "e", "--train_dir", str(tmp_path), "--num_workers", "1",
                     "--num_envs_per_worker", "2", "--rollout", "8", "--recurrence", "8", "--batch_size", "16",
                     "--hidden_size", "16", "--encoder_mlp_layers", "16", "--device", "cpu", "--save_best_after", "0"])
    env = make_env(cfg, 0)
    obs_space, action_space = env.observation_space, env.action_space
    env.close()
    model = create_actor_critic(cfg, obs_space, action_space)
    buffers = TrajectoryBuffers(4, 8, obs_space, action_space, model.rnn_state_size)
    weights, state = SharedWeights(model), SharedState(1, 1, 1, num_slots=4)
    fill_shared(state, [initial_hyperparams(cfg, {})])
    queues = SimpleNamespace(learner=Queue(), free=Queue(), report=Queue(max_size_bytes=2**20))
    learner = lambda: Learner(cfg, obs_space, action_space, buffers, queues, weights, state, "cpu",  # noqa: E731
                              tmp_path / "e", frameskip=1)
    try:
        state.best_metric[0, 0], state.best_metric[0, 1] = 0.5, 3
        learner().finish()  # a fresh run's final checkpoint, and its best
        ckpt_dir = tmp_path / "e" / "checkpoint_p0"
        before = _experiment_files(ckpt_dir)
        assert sorted(before) == ["best_000000000_0_reward_0.500.pth", "checkpoint_000000000_0.pth"]
        queues.report.get_many(timeout=1.0)
        state.best_metric[0, 0], state.best_metric[0, 1] = 0.9, 10  # better episodes, played with the same weights
        resumed = learner()
        resumed.finish()
        assert _experiment_files(ckpt_dir) == before
        reports = [tuple(m) for m in queues.report.get_many(timeout=1.0)]
        assert ("checkpoint", str(ckpt_dir / "checkpoint_000000000_0.pth"), True) in reports
        resumed.version += 1  # as after an SGD step
        resumed.finish()
        assert sorted(_experiment_files(ckpt_dir)) == ["best_000000001_0_reward_0.900.pth",
                                                       "checkpoint_000000000_0.pth", "checkpoint_000000001_0.pth"]
    finally:
        for q in (queues.learner, queues.free, queues.report):
            q.close()
