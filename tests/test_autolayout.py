"""sf.autolayout's measuring, cache and command line: `train.py --num_workers auto` with a cached layout (flags given
win), bad input as one line, one run of `python -m sf.autolayout` end to end, and what the measurements count and
compute in (the cost model: tests/test_autolayout_model.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sf.autolayout.__main__ import main
from sf.autolayout.cache import cache_path, layout_key
from sf.autolayout.measure import measure_envs, resolve_auto, synthetic_batch
from sf.autolayout.model import LAYOUT_KEYS
from sf.cfg import ConfigError, parse_cfg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- train.py --num_workers auto ---------------------------------------------------------------------------------
CHOICE = {"num_workers": 3, "num_envs_per_worker": 6, "worker_num_splits": 3, "policy_workers_per_policy": 2,
          "learner_torch_threads": 1, "batch_size": 512}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = cache_path("test_image")
    path.parent.mkdir(parents=True)
    return path


def write_cache(path, **extra):
    path.write_text(json.dumps({"version": 1, "env": "test_image", "measured_at": "2026-01-01 00:00:00",
                                "choice": CHOICE, "predicted": {"frames_per_s": 1234.0}, **extra}))


def auto_cfg(tmp_path, *flags):
    return parse_cfg(["--env", "test_image", "--train_dir", str(tmp_path / "td"), "--num_workers", "auto", *flags],
                     auto_layout=resolve_auto)


def test_each_engine_has_its_own_cached_layout(tmp_path):
    """A pool of --env_agents games is one env: EnvPool's layout is cached apart from the ALE engine's."""
    def key(*flags):
        return layout_key(parse_cfg(["--env", "atari_breakout", "--train_dir", str(tmp_path), *flags]))
    assert key() == "atari_breakout"
    assert key("--env_engine", "envpool") == "atari_breakout.envpool4"
    assert key("--env_engine", "envpool", "--env_agents", "16") == "atari_breakout.envpool16"
    assert len({cache_path(key()), cache_path(key("--env_engine", "envpool"))}) == 2


def test_num_workers_auto_applies_the_cached_layout(tmp_path, cache):
    write_cache(cache)
    cfg = auto_cfg(tmp_path)
    assert (cfg.num_workers, cfg.num_envs_per_worker, cfg.worker_num_splits, cfg.policy_workers_per_policy,
            cfg.learner_torch_threads) == (3, 6, 3, 2, 1)
    assert cfg.batch_size == 256  # the preset's: the cached batch size applies only where it was tuned
    note = [n for n in cfg._notes if n.startswith("--num_workers auto")]
    assert len(note) == 1 and str(cache) in note[0] and "num_envs_per_worker 6" in note[0]
    assert "num_workers" in cfg._explicit


def test_num_workers_auto_flags_given_win(tmp_path, cache):
    write_cache(cache, batch_size_tuned=True)
    cfg = auto_cfg(tmp_path, "--num_envs_per_worker", "9", "--policy_workers_per_policy", "1")
    assert (cfg.num_workers, cfg.num_envs_per_worker, cfg.worker_num_splits, cfg.policy_workers_per_policy,
            cfg.batch_size) == (3, 9, 3, 1, 512)
    note = next(n for n in cfg._notes if n.startswith("--num_workers auto"))
    assert "--num_envs_per_worker" in note and "--policy_workers_per_policy" in note


@pytest.mark.parametrize("content,expected", [
    ("not json", "is not valid JSON"),
    (json.dumps({"choice": {"num_workers": 2}}), "no layout in it"),
    (json.dumps({"choice": dict(CHOICE, num_workers=0)}), "key 'num_workers'"),
])
def test_num_workers_auto_bad_cache_is_one_line(tmp_path, cache, content, expected):
    cache.write_text(content)
    with pytest.raises(ConfigError) as e:
        auto_cfg(tmp_path)
    msg = str(e.value)
    assert expected in msg and str(cache) in msg and "\n" not in msg


def test_num_workers_auto_bad_input(tmp_path, cache):
    # without the layout resolver (any entry point but train.py), and other bad flags before anything is measured
    with pytest.raises(ConfigError, match=r"--num_workers auto .*number in \[1, 200\]"):
        parse_cfg(["--env", "test_image", "--train_dir", str(tmp_path), "--num_workers", "auto"])
    with pytest.raises(ConfigError, match=r"--gamma must be in \[0, 1\]"):
        auto_cfg(tmp_path, "--gamma", "50")
    assert not cache.exists()  # nothing measured, nothing written
    with pytest.raises(ConfigError, match=r"^--num_workers: expected an integer, got 'autox'$"):
        parse_cfg(["--env", "test_image", "--train_dir", str(tmp_path), "--num_workers", "autox"])


@pytest.mark.parametrize("argv,expected", [
    (["--env", "no_such_env"], "--env"),
    (["--env", "test_image", "--minutes", "0"], "--minutes must be a number of minutes > 0 (got '0')"),
    (["--env", "test_image", "--minutes", "-1"], "--minutes must be"),
    (["--env", "test_image", "--minutes", "soon"], "--minutes must be"),
    (["--env", "test_image", "--minutes", "nan"], "--minutes must be"),
    (["--env", "test_image", "--gamma", "50"], "--gamma must be in [0, 1]"),
])
def test_autolayout_bad_input_one_line(argv, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and err.startswith("python -m sf.autolayout: error: ")
    assert not (tmp_path / "cache").exists()


@pytest.mark.e2e
def test_autolayout_end_to_end(tmp_path, monkeypatch):
    """Measure, choose, check with a short train.py run, cache; the cached layout is what --num_workers auto applies."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    res = subprocess.run([sys.executable, "-m", "sf.autolayout", "--env", "test_image", "--minutes", "0.5",
                          "--policy_worker_torch_threads", "1"],
                         capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = res.stdout
    for expected in ("measured in", "preset ", "chosen ", "batch size: kept at 256", "checking: python -m sf.train",
                     "measured: ", "saved "):
        assert expected in out, (expected, out)
    files = list((tmp_path / "cache" / "sf" / "autolayout").glob("test_image-*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert set(LAYOUT_KEYS) <= set(data["choice"]) and data["check"]["rc"] == 0
    assert data["predicted"]["frames_per_s"] > 0
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = auto_cfg(tmp_path)
    assert {k: getattr(cfg, k) for k in LAYOUT_KEYS} == {k: data["choice"][k] for k in LAYOUT_KEYS}


def test_measured_episode_ends_and_the_runs_precision():
    """measure_envs counts the episode ends it sees (test_image: 16 steps per episode), which the learner's synthetic
    batch then has; the forward and learner measurements compute in the run's precision, resolved as the run's
    processes resolve it."""
    from sf.model.actor_critic import create_actor_critic, resolve_precision, run_precision
    from sf_envs.registry import make_env
    cfg = parse_cfg(["--env", "test_image", "--device", "cpu", "--train_dir", "/tmp/unused"])
    envs = [make_env(cfg, env_index=i) for i in range(2)]
    try:
        times, rate = measure_envs(envs, [1, 2], 0.05, multiagent=False)
    finally:
        for e in envs:
            e.close()
    assert set(times) == {1, 2} and all(t > 0 for t in times.values())
    assert abs(rate - 1 / 16) < 0.01
    model = create_actor_critic(cfg, envs[0].observation_space, envs[0].action_space)
    batch = synthetic_batch(model, envs[0].observation_space, envs[0].action_space, 64, 32, "cpu", done_rate=0.25)
    assert abs(float(batch["dones"].float().mean()) - 0.25) < 0.05
    for precision, mode in (("auto", "async"), ("bfloat16", "async"), ("auto", "hts")):
        c = parse_cfg(["--env", "test_image", "--device", "cpu", "--precision", precision, "--sync_mode", mode,
                       "--train_dir", "/tmp/unused"])
        m = run_precision(c, create_actor_critic(c, envs[0].observation_space, envs[0].action_space), "cpu",
                          c.mode.deterministic)
        assert m.compute_dtype is resolve_precision(precision, m, "cpu", deterministic=mode != "async")
