"""sf.autolayout: the cost model's choice (against an oracle that evaluates the documented formula by hand over every
candidate), `train.py --num_workers auto` with a cached layout (flags given win), bad input as one line, and one run of
`python -m sf.autolayout` end to end."""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys

import pytest

from sf import autolayout as al
from sf.cfg import ConfigError, parse_cfg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def synthetic(**kw) -> al.Measurements:
    """Measurements given at every point the candidates use (envs per worker 1..64, rows 1..128), so that the
    interpolation is exact and the oracle reads the tables directly."""
    env = kw.pop("env", lambda e: 2e-4)
    fwd = kw.pop("fwd", lambda b: 2e-3 + 1e-5 * b)
    base = dict(cores=2, env={e: env(e) for e in range(1, 65)}, step=1e-5, msg=1e-4, call=3e-4,
                fwd={b: fwd(b) for b in range(1, 129)}, learn={"256/1": 1e-4, "256/2": 6e-5}, rollout=16,
                batch_size=256)
    base.update(kw)
    return al.Measurements(**base)


def oracle(m: al.Measurements, preset: al.Layout, max_lag: float = 10.0):
    """The module docstring's cost model and choice rule, written out by hand over the documented candidate grid."""
    def model(W, E, S, P, th, B):
        A = m.agents
        g = E / S * A
        b = g * math.ceil(W / P)
        env, fwd, learn = m.env[E] / A, m.fwd[int(b)], m.learn[f"{B}/{th}"]
        c = (env + m.step + m.msg / g) + ((fwd * m.policy_threads + m.call) / b + m.msg / g) + learn * th
        wait = max(0.0, fwd + m.call + m.msg - (S - 1) * g * (env + m.step))
        rnd = S * (g * (env + m.step) + m.msg + wait)
        sampler = min(W * E * A / rnd, P * b / (fwd + m.call))
        learner = 1 / learn
        fps = min(sampler, learner, m.cores / c) * m.frameskip
        per_batch = B * m.num_batches_per_epoch
        lag = (W * E * A * m.rollout / 2 / per_batch + 0.5 + (learner <= sampler)) * m.num_batches_per_epoch * \
            m.num_epochs
        return fps, lag

    bound = max(max_lag, model(*preset.__dict__.values())[1])
    grid = []
    for W, S, E, P, th in itertools.product(range(1, 2 * m.cores + 1), (2, 4), al.ENVS_PER_WORKER, (1, 2),
                                            sorted({1, m.cores})):
        if E % S == 0 and E <= max(8, 2 * preset.num_envs_per_worker) and P <= W and \
                W * E <= max(16, 2 * preset.num_workers * preset.num_envs_per_worker):
            fps, lag = model(W, E, S, P, th, preset.batch_size)
            if lag <= bound:
                grid.append((fps, lag, (W, E, S, P, th)))
    best = max(fps for fps, _, _ in grid)
    near = [t for t in grid if t[0] >= 0.99 * best]
    return min(near, key=lambda t: (t[2][0] + t[2][3], t[2][0] * t[2][1], t[1], t[2][4], -t[0]))


PRESET = al.Layout(num_workers=2, num_envs_per_worker=4, worker_num_splits=2, policy_workers_per_policy=1,
                   learner_torch_threads=2, batch_size=256)
CASES = {
    # the forward's per-call cost dominates: the most rows per call win, until the lag bound (long rollouts, small
    # batches, two epochs) cuts the envs in flight
    "forward-bound, lag-limited": synthetic(rollout=64, batch_size=64, num_epochs=2, learn={"64/1": 1e-4, "64/2": 6e-5},
                                            fwd=lambda b: 5e-3 + 1e-5 * b),
    # a slow simulator: every core to the envs, the forward small beside it
    "env-bound": synthetic(env=lambda e: 3e-3 * (1 + 0.01 * e), fwd=lambda b: 1e-4 + 2e-5 * b),
    # an expensive learner: its threads matter (two threads are faster but take more CPU per sample)
    "learner-bound": synthetic(learn={"256/1": 1e-3, "256/2": 6e-4}, env=lambda e: 1e-4),
}


@pytest.mark.parametrize("name", list(CASES))
def test_cost_model_choice_matches_hand_oracle(name):
    m = CASES[name]
    preset = dataclasses.replace(PRESET, batch_size=m.batch_size)
    lay, pred, _ = al.choose(m, preset)
    fps, lag, want = oracle(m, preset)
    got = (lay.num_workers, lay.num_envs_per_worker, lay.worker_num_splits, lay.policy_workers_per_policy,
           lay.learner_torch_threads)
    assert got == want, (name, got, want)
    assert pred["frames_per_s"] == pytest.approx(fps) and pred["lag"] == pytest.approx(lag)


def test_cost_model_terms_by_hand():
    """One layout's prediction, computed by hand: W=2 workers x E=8 envs in S=2 splits, P=1, 1 learner thread."""
    m = synthetic()
    p = al.predict(al.Layout(2, 8, 2, 1, 1, 256), m)
    # g = 4 rows per split, b = 8 rows per call; fwd(8) = 2.08 ms, 0.3 ms per call beside it
    assert p["rows_per_forward"] == 8
    worker = 2e-4 + 1e-5 + 1e-4 / 4  # 0.235 ms
    policy = (2.08e-3 + 3e-4) / 8 + 1e-4 / 4  # 0.3225 ms
    assert p["cpu_per_sample"]["rollout_worker"] == pytest.approx(worker)
    assert p["cpu_per_sample"]["policy_worker"] == pytest.approx(policy)
    cores = 2 / (worker + policy + 1e-4)
    wait = 2.08e-3 + 3e-4 + 1e-4 - 1 * 4 * (2e-4 + 1e-5)  # the forward outlasts stepping the other split
    rollout_cap = 2 * 8 / (2 * (4 * 2.1e-4 + 1e-4 + wait))
    sampler = min(rollout_cap, 1 * 8 / 2.38e-3)
    assert p["sampler"] == pytest.approx(sampler) and p["learner"] == pytest.approx(1e4)
    assert p["frames_per_s"] == pytest.approx(min(sampler, 1e4, cores))
    assert p["lag"] == pytest.approx(2 * 8 * 16 / 2 / 256 + 0.5)  # the sampler is the bottleneck: no batch waits


def test_lag_bound_and_fixed_flags():
    m = CASES["forward-bound, lag-limited"]
    preset = dataclasses.replace(PRESET, batch_size=64)
    unbounded, _, _ = al.choose(m, preset, max_lag=1e9)
    bounded, pred, bound = al.choose(m, preset)
    assert al.predict(unbounded, m)["lag"] > bound >= pred["lag"]  # the bound changed the choice
    lay, _, _ = al.choose(m, preset, fixed={"num_envs_per_worker": 6, "policy_workers_per_policy": 2})
    assert (lay.num_envs_per_worker, lay.policy_workers_per_policy) == (6, 2)
    lay, _, _ = al.choose(m, preset, fixed={"num_workers": 7, "num_envs_per_worker": 5})  # outside the search's grid
    assert (lay.num_workers, lay.num_envs_per_worker, lay.worker_num_splits) == (7, 5, 1)  # the only S dividing 5
    assert lay.batch_size == 64  # never changed unless tuned
    assert {c.batch_size for c in al.candidates(m, preset, {}, True)} == {64, 128}  # 32: not a whole trajectory


# --- train.py --num_workers auto ---------------------------------------------------------------------------------
CHOICE = {"num_workers": 3, "num_envs_per_worker": 6, "worker_num_splits": 3, "policy_workers_per_policy": 2,
          "learner_torch_threads": 1, "batch_size": 512}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = al.cache_path("test_image")
    path.parent.mkdir(parents=True)
    return path


def write_cache(path, **extra):
    path.write_text(json.dumps({"version": 1, "env": "test_image", "measured_at": "2026-01-01 00:00:00",
                                "choice": CHOICE, "predicted": {"frames_per_s": 1234.0}, **extra}))


def auto_cfg(tmp_path, *flags):
    return parse_cfg(["--env", "test_image", "--train_dir", str(tmp_path / "td"), "--num_workers", "auto", *flags],
                     auto_layout=al.resolve_auto)


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
    assert al.main(argv) == 2
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
    assert set(al.LAYOUT_KEYS) <= set(data["choice"]) and data["check"]["rc"] == 0
    assert data["predicted"]["frames_per_s"] > 0
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = auto_cfg(tmp_path)
    assert {k: getattr(cfg, k) for k in al.LAYOUT_KEYS} == {k: data["choice"][k] for k in al.LAYOUT_KEYS}


def test_measured_episode_ends_and_the_runs_precision():
    """measure_envs counts the episode ends it sees (test_image: 16 steps per episode), which the learner's synthetic
    batch then has; the forward and learner measurements compute in the run's precision, resolved as the run's
    processes resolve it."""
    from sf.model.actor_critic import create_actor_critic, resolve_precision, run_precision
    from sf_envs.registry import make_env
    cfg = parse_cfg(["--env", "test_image", "--device", "cpu", "--train_dir", "/tmp/unused"])
    envs = [make_env(cfg, env_index=i) for i in range(2)]
    try:
        times, rate = al.measure_envs(envs, [1, 2], 0.05, multiagent=False)
    finally:
        for e in envs:
            e.close()
    assert set(times) == {1, 2} and all(t > 0 for t in times.values())
    assert abs(rate - 1 / 16) < 0.01
    model = create_actor_critic(cfg, envs[0].observation_space, envs[0].action_space)
    batch = al.synthetic_batch(model, envs[0].observation_space, envs[0].action_space, 64, 32, "cpu", done_rate=0.25)
    assert abs(float(batch["dones"].float().mean()) - 0.25) < 0.05
    for precision, mode in (("auto", "async"), ("bfloat16", "async"), ("auto", "hts")):
        c = parse_cfg(["--env", "test_image", "--device", "cpu", "--precision", precision, "--sync_mode", mode,
                       "--train_dir", "/tmp/unused"])
        m = run_precision(c, create_actor_critic(c, envs[0].observation_space, envs[0].action_space), "cpu")
        assert m.compute_dtype is resolve_precision(precision, m, "cpu", deterministic=mode != "async")
