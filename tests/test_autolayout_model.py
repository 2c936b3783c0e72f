"""sf.autolayout.model, the cost model, without a process: its choice against an oracle that evaluates the documented
formula by hand over every candidate, one prediction's terms by hand, the tables' interpolation, the lag bound and the
flags given, the batch size candidates, a layout as train.py flags."""
from __future__ import annotations

import ast
import dataclasses
import itertools
import math
import sys

import pytest

from sf.autolayout import model as model_module
from sf.autolayout.model import (ENVS_PER_WORKER, Layout, Measurements, batch_sizes, candidates, choose, layout_flags,
                                 predict)


def synthetic(**kw) -> Measurements:
    """Measurements given at every point the candidates use (envs per worker 1..64, rows 1..128), so that the
    interpolation is exact and the oracle reads the tables directly."""
    env = kw.pop("env", lambda e: 2e-4)
    fwd = kw.pop("fwd", lambda b: 2e-3 + 1e-5 * b)
    base = dict(cores=2, env={e: env(e) for e in range(1, 65)}, step=1e-5, msg=1e-4, call=3e-4,
                fwd={b: fwd(b) for b in range(1, 129)}, learn={"256/1": 1e-4, "256/2": 6e-5}, rollout=16,
                batch_size=256)
    base.update(kw)
    return Measurements(**base)


def oracle(m: Measurements, preset: Layout, max_lag: float = 10.0):
    """sf.autolayout's documented cost model and choice rule, written out by hand over the documented candidate grid."""
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
    for W, S, E, P, th in itertools.product(range(1, 2 * m.cores + 1), (2, 4), ENVS_PER_WORKER, (1, 2),
                                            sorted({1, m.cores})):
        if E % S == 0 and E <= max(8, 2 * preset.num_envs_per_worker) and P <= W and \
                W * E <= max(16, 2 * preset.num_workers * preset.num_envs_per_worker):
            fps, lag = model(W, E, S, P, th, preset.batch_size)
            if lag <= bound:
                grid.append((fps, lag, (W, E, S, P, th)))
    best = max(fps for fps, _, _ in grid)
    near = [t for t in grid if t[0] >= 0.99 * best]
    return min(near, key=lambda t: (t[2][0] + t[2][3], t[2][0] * t[2][1], t[1], t[2][4], -t[0]))


PRESET = Layout(num_workers=2, num_envs_per_worker=4, worker_num_splits=2, policy_workers_per_policy=1,
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
    lay, pred, _ = choose(m, preset)
    fps, lag, want = oracle(m, preset)
    got = (lay.num_workers, lay.num_envs_per_worker, lay.worker_num_splits, lay.policy_workers_per_policy,
           lay.learner_torch_threads)
    assert got == want, (name, got, want)
    assert pred["frames_per_s"] == pytest.approx(fps) and pred["lag"] == pytest.approx(lag)


def test_cost_model_terms_by_hand():
    """One layout's prediction, computed by hand: W=2 workers x E=8 envs in S=2 splits, P=1, 1 learner thread."""
    m = synthetic()
    p = predict(Layout(2, 8, 2, 1, 1, 256), m)
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
    unbounded, _, _ = choose(m, preset, max_lag=1e9)
    bounded, pred, bound = choose(m, preset)
    assert predict(unbounded, m)["lag"] > bound >= pred["lag"]  # the bound changed the choice
    lay, _, _ = choose(m, preset, fixed={"num_envs_per_worker": 6, "policy_workers_per_policy": 2})
    assert (lay.num_envs_per_worker, lay.policy_workers_per_policy) == (6, 2)
    lay, _, _ = choose(m, preset, fixed={"num_workers": 7, "num_envs_per_worker": 5})  # outside the search's grid
    assert (lay.num_workers, lay.num_envs_per_worker, lay.worker_num_splits) == (7, 5, 1)  # the only S dividing 5
    assert lay.batch_size == 64  # never changed unless tuned
    assert {c.batch_size for c in candidates(m, preset, {}, True)} == {64, 128}  # 32: not a whole trajectory



def test_tables_interpolate_between_measured_points():
    """Measured at a few points only (as measure() does): envs per process linear between them and flat past the
    last; the forward linear between them and scaled by rows / last past it."""
    fwd = {b: 1e-3 + 1e-5 * b for b in (1, 2, 4, 8, 16, 32, 64)}
    m = dataclasses.replace(synthetic(step=0.0, msg=0.0, call=0.0), fwd=fwd,
                            env={1: 1e-4, 2: 1.2e-4, 4: 1.6e-4, 8: 2.4e-4, 16: 4e-4})
    cases = [(Layout(1, 6, 2, 1, 1, 256), 2e-4, 3, 1e-3 + 3e-5),  # 6 envs: halfway 4..8; 3 rows: halfway 2..4
             (Layout(4, 24, 2, 1, 1, 256), 4e-4, 48, 1e-3 + 48e-5),  # 24 envs: the last point's; 48 rows: 32..64
             (Layout(4, 48, 2, 1, 1, 256), 4e-4, 96, fwd[64] * 96 / 64)]  # 96 rows: the forward of 64 scaled
    for lay, env, rows, fwd_b in cases:
        p = predict(lay, m)
        assert p["rows_per_forward"] == rows
        assert p["cpu_per_sample"]["rollout_worker"] == pytest.approx(env), lay
        assert p["cpu_per_sample"]["policy_worker"] == pytest.approx(fwd_b / rows), lay


def test_every_candidate_lags_more_than_the_bound_the_least_lag_wins():
    m = CASES["forward-bound, lag-limited"]
    preset = dataclasses.replace(PRESET, batch_size=64)
    fixed = {"num_workers": 8, "num_envs_per_worker": 64}  # given: far more envs in flight than the bound allows
    lay, pred, bound = choose(m, preset, fixed)
    assert (lay.num_workers, lay.num_envs_per_worker) == (8, 64) and pred["lag"] > bound
    assert pred["lag"] == min(predict(c, m)["lag"] for c in candidates(m, preset, fixed, False))


def test_batch_size_candidates_are_whole_trajectories():
    assert batch_sizes(256, 32, False) == [256]
    assert batch_sizes(256, 32, True) == [256, 128, 512]
    assert batch_sizes(64, 64, True) == [64, 128]  # 32: shorter than one trajectory
    assert batch_sizes(160, 64, True) == [160, 320]  # 80: not a whole number of trajectories


def test_layout_flags():
    lay = Layout(3, 6, 3, 2, 1, 512)
    flags = ["--num_workers", "3", "--num_envs_per_worker", "6", "--worker_num_splits", "3",
             "--policy_workers_per_policy", "2", "--learner_torch_threads", "1"]
    assert layout_flags(lay, False) == flags
    assert layout_flags(dataclasses.asdict(lay), True) == flags + ["--batch_size", "512"]


def test_the_model_imports_only_the_standard_library():
    """The cost model is arithmetic: testable (and importable) without torch, envs or processes."""
    tree = ast.parse(open(model_module.__file__).read())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names
