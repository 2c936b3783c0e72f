"""python -m sf.eval: tiny real experiments (test_image, one policy; test_race, a population of 2 playing matches)
evaluated on the sampler's processes. The CSV's columns and rows, repeatability (same seed: the same CSV but for
wall_time; another seed: other episodes), populations, per-agent rows, the printed confidence interval against a
naive computation from the CSV, Ctrl-C, and bad input (one line, exit code 2, nothing written)."""
import csv
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_helpers import made_once
from sf.eval import COLUMNS, main, t_quantile
from sf.sampling.evaluation import EvalPlan

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--num_workers", "1", "--num_envs_per_worker", "4", "--rollout", "8", "--recurrence", "8", "--batch_size", "32",
        "--rnn_size", "16", "--hidden_size", "16", "--encoder_mlp_layers", "16", "--device", "cpu", "--seed", "1",
        "--train_for_env_steps", "300"]
# Student's t, 97.5% quantiles (two-sided 95%), from the printed tables
T_TABLE = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 7: 2.3646, 10: 2.2281, 11: 2.2010, 19: 2.0930,
           30: 2.0423, 60: 2.0003, 120: 1.9799, 1000: 1.9623}


# --- without processes -------------------------------------------------------------------------------------------
def test_plan_gives_each_policy_its_episodes_over_its_agents():
    plan = EvalPlan.make(num_agents=6, num_policies=2, episodes=7)
    assert plan.players == (0, 1, 0, 1, 0, 1)  # agent i: policy i % 2 (--policy_mapping fixed)
    assert plan.quotas == (3, 3, 2, 2, 2, 2) and plan.total == 14  # 7 per policy, the first agents one more
    only = EvalPlan.make(num_agents=6, num_policies=2, episodes=4, policy=1)
    assert only.players == (1,) * 6 and only.quotas == (1, 1, 1, 1, 0, 0) and only.total == 4


def test_t_quantile_matches_the_tables():
    for df, t in T_TABLE.items():
        assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-4), df
    assert t_quantile(0.975, 10**6) == pytest.approx(1.959966, abs=1e-5)


def _experiment(root: Path, name: str, config: str | None) -> Path:
    d = root / name
    d.mkdir()
    if config is not None:
        (d / "config.json").write_text(config)
    return d


def _listing(root: Path) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("case", ["missing", "foreign", "unknown_env", "episodes_0", "episodes_negative",
                                  "episodes_text", "csv_no_dir", "csv_parent_is_file", "csv_is_dir", "policy_range",
                                  "no_checkpoint", "bad_layout"])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, case):
    exp = _experiment(tmp_path, "pop", '{"env": "test_image", "num_policies": 2}')
    _experiment(tmp_path, "other", None).joinpath("notes.txt").write_text("not an experiment")
    _experiment(tmp_path, "alien", '{"env": "no_such_env"}')
    (tmp_path / "file").write_text("x")
    argv, needle = {
        "missing": ([str(tmp_path / "nope"), "--episodes", "3"], "does not exist"),
        "foreign": ([str(tmp_path / "other"), "--episodes", "3"], "no config.json"),
        "unknown_env": (["alien", "--train_dir", str(tmp_path), "--episodes", "3"], "unknown env 'no_such_env'"),
        "episodes_0": ([str(exp), "--episodes", "0"], "--episodes must be in [1, 1000000000] (got 0)"),
        "episodes_negative": ([str(exp), "--episodes", "-4"], "--episodes must be in [1, 1000000000] (got -4)"),
        "episodes_text": ([str(exp), "--episodes", "many"], "--episodes: expected an integer"),
        "csv_no_dir": ([str(exp), "--episodes", "3", "--csv", str(tmp_path / "no" / "e.csv")], "cannot be written"),
        "csv_parent_is_file": ([str(exp), "--episodes", "3", "--csv", str(tmp_path / "file" / "e.csv")],
                               "cannot be written"),
        "csv_is_dir": ([str(exp), "--episodes", "3", "--csv", str(tmp_path)], "is a directory"),
        "policy_range": ([str(exp), "--episodes", "3", "--policy", "2"], "--policy 2: the experiment has policies 0-1"),
        "no_checkpoint": ([str(exp), "--episodes", "3"], "no latest checkpoint"),
        "bad_layout": ([str(exp), "--episodes", "3", "--num_envs_per_worker", "3"], "must be divisible"),
    }[case]
    before = _listing(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and needle in err, err
    assert _listing(tmp_path) == before


# --- real runs ---------------------------------------------------------------------------------------------------
def _run(*args, timeout=180) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "sf.eval", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def experiments(tmp_path_factory, entry):
    """train_dir with `img` (test_image, one policy) and `race` (test_race, 2 agents per env, a population of 2)."""

    def make(train_dir):
        for name, env, extra in (("img", "test_image", []), ("race", "test_race", ["--num_policies", "2"])):
            res = entry("train.py", "--env", env, "--experiment", name, "--train_dir", train_dir, *TINY, *extra,
                        timeout=300)
            assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return made_once(tmp_path_factory, "eval", make)


def _rows(path: Path) -> tuple[list, list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def _without_wall_time(path: Path) -> list:
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in _rows(path)[1]]


def _printed_policy_line(stdout: str, policy: int) -> list[float]:
    """(mean, std, CI low, CI high) of the line 'Policy p: n episodes, return mean M, std S, 95% CI [L, H] ...'."""
    line = next(x for x in stdout.splitlines() if x.startswith(f"Policy {policy}: "))
    mean = line.split("return mean ")[1].split(",")[0]
    std = line.split("std ")[1].split(",")[0]
    lo, hi = line.split("95% CI [")[1].split("]")[0].split(", ")
    return [float(x) for x in (mean, std, lo, hi)]


@pytest.mark.e2e
def test_csv_rows_and_printed_interval(experiments):
    res = _run(experiments / "img", "--episodes", "12", "--seed", "5")
    assert res.returncode == 0, res.stdout + res.stderr
    path = experiments / "img" / "eval_latest_seed5_12ep.csv"  # the default path
    assert f"CSV: {path}" in res.stdout
    columns, rows = _rows(path)
    assert tuple(columns) == COLUMNS and len(rows) == 12
    assert [int(r["episode"]) for r in rows] == list(range(12))
    assert {r["policy"] for r in rows} == {"0"} and {r["agent"] for r in rows} == {"0"}
    assert {r["length"] for r in rows} == {"16"} and {r["true_objective"] for r in rows} == {""}  # test_image's
    assert len({r["env_seed"] for r in rows}) == 4  # 12 episodes over the 4 envs of the experiment's layout
    # the printed interval, computed naively from the CSV: mean +- t(0.975, n - 1) * sample std / sqrt(n)
    returns = [float(r["return"]) for r in rows]
    n, mean = len(returns), sum(returns) / len(returns)
    std = math.sqrt(sum((x - mean) ** 2 for x in returns) / (n - 1))
    half = T_TABLE[11] * std / math.sqrt(n)
    assert _printed_policy_line(res.stdout, 0) == pytest.approx([mean, std, mean - half, mean + half], rel=1e-4)


@pytest.mark.e2e
def test_same_seed_same_csv_other_seed_other_episodes(experiments, tmp_path):
    # two rollout workers: how the policy worker batches their requests varies from run to run (sampling with torch's
    # generator, as training does, gives other actions then: checked by hand)
    layout = ["--num_workers", "2", "--num_envs_per_worker", "2"]
    for name, seed in (("a", 3), ("b", 3)):
        res = _run(experiments / "img", "--episodes", "10", "--seed", seed, "--csv", tmp_path / f"{name}.csv", *layout)
        assert res.returncode == 0, res.stdout + res.stderr
    assert _without_wall_time(tmp_path / "a.csv") == _without_wall_time(tmp_path / "b.csv")
    # another seed (and --deterministic: the most likely actions): other envs, other episodes
    res = _run(experiments / "img", "--episodes", "10", "--seed", "4", "--deterministic", *layout)
    assert res.returncode == 0 and "the most likely actions" in res.stdout, res.stdout + res.stderr
    a = _without_wall_time(tmp_path / "a.csv")
    c = _without_wall_time(experiments / "img" / "eval_latest_seed4_10ep_argmax.csv")  # the default path
    assert len(c) == 10 and {r["env_seed"] for r in a}.isdisjoint({r["env_seed"] for r in c})
    assert [r["return"] for r in a] != [r["return"] for r in c]


@pytest.mark.e2e
def test_population_match_and_per_agent_rows(experiments, tmp_path):
    # every policy plays: agent i of the run is played by policy i % 2, so in test_race agent 0 is policy 0 and agent
    # 1 policy 1 in every env: a match between the two, 5 episodes (rows) of each
    res = _run(experiments / "race", "--episodes", "5", "--csv", tmp_path / "match.csv")
    assert res.returncode == 0, res.stdout + res.stderr
    _, rows = _rows(tmp_path / "match.csv")
    assert len(rows) == 10
    assert {(r["policy"], r["agent"]) for r in rows} == {("0", "0"), ("1", "1")}
    assert sum(r["policy"] == "0" for r in rows) == 5
    assert {r["true_objective"] for r in rows} <= {"0.0", "1.0"}  # test_race reports wins
    assert "Policy 0: 5 episodes" in res.stdout and "Policy 1: 5 episodes" in res.stdout
    # one policy on every agent of the env: rows of both agents
    res = _run(experiments / "race", "--episodes", "6", "--policy", "1", "--csv", tmp_path / "p1.csv")
    assert res.returncode == 0, res.stdout + res.stderr
    _, rows = _rows(tmp_path / "p1.csv")
    assert len(rows) == 6 and {r["policy"] for r in rows} == {"1"} and {r["agent"] for r in rows} == {"0", "1"}


@pytest.mark.e2e
def test_ctrl_c_stops_every_process_and_writes_nothing(experiments, tmp_path):
    import psutil
    out = tmp_path / "out.txt"
    with open(out, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sf.eval", str(experiments / "img"), "--episodes", "100000000",
                                 "--csv", str(tmp_path / "never.csv")], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            deadline = time.time() + 120
            while "Started rollout_worker_0" not in out.read_text() and time.time() < deadline:
                assert proc.poll() is None, out.read_text()
                time.sleep(0.2)
            children = psutil.Process(proc.pid).children(recursive=True)
            assert children, out.read_text()
            time.sleep(1.0)  # sampling
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 130, out.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
    text = out.read_text()
    assert "no CSV written" in text and "Traceback" not in text, text
    assert not (tmp_path / "never.csv").exists()
    psutil.wait_procs(children, timeout=10)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
