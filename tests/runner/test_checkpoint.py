"""Checkpoint module: roundtrip, weights_only safety, pruning, best, corruption fallback, compatibility
errors and kill-safety of the atomic write."""
import logging
import multiprocessing as mp
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from sf.runner import checkpoint as ckpt
from sf.runner.checkpoint import (CheckpointError, CheckpointManager, check_compatible, load_into,
                                  make_checkpoint_state, model_signature, restore_rng_states)


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
    expected = (torch.rand(5), np.random.rand(5), [random.random() for _ in range(5)])

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

    torch.rand(3), np.random.rand(3), random.random()  # move every RNG on
    restore_rng_states(loaded)
    got = (torch.rand(5), np.random.rand(5), [random.random() for _ in range(5)])
    assert torch.equal(expected[0], got[0])
    assert np.array_equal(expected[1], got[1])
    assert expected[2] == got[2]


def test_numpy_gaussian_cache_is_restored(tmp_path):
    np.random.seed(3)
    np.random.randn()  # leaves a cached gaussian in the legacy state
    state = small_state(1, 1)
    after = np.random.randn(4)
    np.random.seed(4)
    restore_rng_states(state)
    assert np.array_equal(np.random.randn(4), after)


def test_content_is_weights_only_safe(tmp_path):
    model, opt = trained_model()
    state = make_checkpoint_state(model, opt, 3, 300, meta_for(model))
    path = CheckpointManager(tmp_path).save(state, 3, 300)
    raw = torch.load(path, weights_only=True)  # the strict unpickler accepts every value
    assert set(raw) >= {"model", "optimizer", "policy_version", "env_steps", "lr", "rng", "meta"}
    assert {"torch", "numpy", "python"} <= set(raw["rng"])

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


def test_negative_best_values_parse(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save_best(small_state(1, 1), 1, 1, -12.3456)
    assert CheckpointManager(tmp_path).best_value == pytest.approx(-12.346)


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
    with pytest.raises(OSError):
        mgr.save(small_state(2, 20), 2, 20)
    monkeypatch.setattr(ckpt.torch, "save", real_save)

    def replace_fails(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(ckpt.os, "replace", replace_fails)
    with pytest.raises(OSError):
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


def test_sigkill_during_save_always_leaves_a_loadable_checkpoint(tmp_path, caplog):
    # forkserver: children fork from a clean server that already imported torch (fast, and no fork of a
    # process whose thread pools are running).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "sf.runner.checkpoint"])
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
