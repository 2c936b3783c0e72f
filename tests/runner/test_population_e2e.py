"""Populations end to end: train.py with several policies (the real multi-process system, tiny budgets) on the built-in
multi-agent env and with population-based training; resume; enjoy playing chosen policies; bad input."""
import json
import os
import re
import signal
import time

import psutil
import pytest

from e2e_helpers import (child_pids, engine_files, shm_files, shm_left_behind, skip_if_unavailable, start_train,
                         train_args, wait_for)
from sf.runner.stats import read_event_scalars

pytestmark = pytest.mark.e2e

POP = ["--num_workers", "2", "--use_rnn", "False", "--learning_rate", "1e-3"]


def test_two_policies_on_a_multiagent_env_train_checkpoint_and_resume(tmp_path, entry):
    """test_race (2 agents per env), 2 policies drawn per episode: both learners train (their own versions and frames,
    TensorBoard p0/ and p1/ series, checkpoint_p0 and checkpoint_p1), the budget holds for each policy, and a resumed
    run continues both from their checkpoints."""
    res = entry("train.py", *train_args(tmp_path, "test_race", *POP, "--num_policies", "2", "--train_for_env_steps",
                                        "8000"), timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    exp = tmp_path / "e2e"
    frames = {}
    for p in (0, 1):
        ckpts = sorted((exp / f"checkpoint_p{p}").glob("checkpoint_*.pth"))
        assert ckpts, f"policy {p}: no checkpoint"
        frames[p] = int(ckpts[-1].stem.split("_")[-1])
        assert frames[p] >= 8000  # the budget counts for every policy
    scalars = read_event_scalars(exp)
    for p in (0, 1):
        for tag in ("reward/reward", "reward/win_rate", "train/policy_lag_avg", "train/policy_version"):
            assert f"p{p}/{tag}" in scalars, (p, tag, sorted(scalars))
        assert max(v for _, v in scalars[f"p{p}/train/policy_version"]) >= 10
    assert "perf/_fps" in scalars and "reward/reward" not in scalars  # global series unprefixed, per-policy prefixed
    assert {"memory/rss_mb_learners", "memory/rss_mb_policy_workers", "memory/rss_mb_rollout_workers"} <= set(scalars)
    assert "Population: 2 policies (independent), 2 agents per env (16 agents in all)" in res.stdout
    assert len(re.findall(r"Final weights sha256: [0-9a-f]{64} \(policy \d, version", res.stdout)) == 2

    res = entry("train.py", *train_args(tmp_path, "test_race", "--train_for_env_steps", "12000"), timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    resumed = re.findall(r"Resumed policy (\d) from checkpoint: policy version \d+, (\d+) env frames", res.stdout)
    assert sorted((int(p), int(f)) for p, f in resumed) == sorted(frames.items())  # config.json kept num_policies 2
    for p in (0, 1):
        last = sorted((exp / f"checkpoint_p{p}").glob("checkpoint_*.pth"))[-1]
        assert int(last.stem.split("_")[-1]) >= 12000


def pbt_args(tmp_path, steps):
    return train_args(tmp_path, "test_corridor", *POP, "--num_policies", "4", "--with_pbt", "True",
                      "--pbt_period_env_steps", "2000", "--pbt_start_mutation", "2000", "--pbt_mutation_rate", "0.5",
                      "--pbt_replace_reward_gap", "0.0", "--train_for_env_steps", str(steps), "--seed", "11")


def test_pbt_mutates_copies_records_and_resumes(tmp_path, entry):
    """4 policies, a PBT decision every 2000 frames of each: mutations and weight copies happen (console lines, the
    learner's confirmation of each copy, TensorBoard text and p{i}/pbt/ scalars), the state is in pbt_state.json and
    every policy's final checkpoint trained with the hyperparameters pbt_state.json and TensorBoard record (its
    optimizer's); a resumed run continues the same history."""
    res = entry("train.py", *pbt_args(tmp_path, 10000), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert re.search(r"PBT: policy \d .* mutates: \w+ [\d.e-]+ -> [\d.e-]+", out), out[-3000:]
    copies = re.findall(r"PBT: policy (\d) .* copies weights and hyperparameters of policy (\d)", out)
    assert copies
    for target, source in copies:  # each copy is confirmed by the target's learner
        assert re.search(rf"PBT: policy {target} now plays with the weights of policy {source} \(its version \d+\), as "
                         rf"policy version \d+", out)
    assert "could not copy" not in out
    exp = tmp_path / "e2e"
    state = json.loads((exp / "pbt_state.json").read_text())
    kinds = {d["kind"] for d in state["history"]}
    assert {"mutate", "replace"} <= kinds, kinds
    scalars = read_event_scalars(exp)
    assert all(f"p{p}/pbt/learning_rate" in scalars for p in range(4))
    import torch
    for p in range(4):
        ckpt = torch.load(sorted((exp / f"checkpoint_p{p}").glob("checkpoint_*.pth"))[-1], weights_only=True)
        recorded = state["hyperparams"][p]
        assert ckpt["hyperparams"] == recorded
        group = ckpt["optimizer"]["param_groups"][0]
        assert (group["lr"], group["betas"][0]) == (recorded["learning_rate"], recorded["adam_beta1"])
        for k, v in recorded.items():  # (TensorBoard stores float32)
            assert scalars[f"p{p}/pbt/{k}"][-1][1] == pytest.approx(v, rel=1e-6)

    res = entry("train.py", *pbt_args(tmp_path, 14000), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "population-based training, resumed" in res.stdout
    later = json.loads((exp / "pbt_state.json").read_text())
    assert later["history"][:len(state["history"])] == state["history"]  # the same history, continued
    assert len(later["history"]) > len(state["history"])


def stop_with_ctrl_c(proc, log, policies: int) -> None:
    """SIGINT to the runner (killed if it does not stop): exit code 0 and a final checkpoint from every learner."""
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert len(re.findall(r"Saved final checkpoint .*checkpoint_p\d/", text)) == policies, text[-2000:]


def test_sigint_stops_a_population_with_every_final_checkpoint(tmp_path):
    """Ctrl-C (SIGINT to the runner) during a 3-policy run: every learner writes its final checkpoint, exit code 0, no
    process of the run left, no shared memory left."""
    shm_before = shm_files()
    log = tmp_path / "log.txt"
    proc = start_train(train_args(tmp_path, "test_race", *POP, "--num_policies", "3"), log)
    try:
        wait_for(lambda: ("policy 2: version" in log.read_text()
                          and re.search(r"policy 2: version [1-9]", log.read_text())),
                 120, "policy 2 to train", log)
        pids = child_pids(log)
        assert {"learner_p0", "learner_p1", "learner_p2", "policy_worker_p2_0"} <= set(pids)
    finally:
        stop_with_ctrl_c(proc, log, policies=3)
    time.sleep(0.5)
    assert not [p for p in pids.values() if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not shm_left_behind(shm_before)


def test_enjoy_plays_a_match_between_chosen_policies(tmp_path, entry):
    res = entry("train.py", *train_args(tmp_path, "test_race", *POP, "--num_policies", "3", "--train_for_env_steps",
                                        "3000"), timeout=240)
    assert res.returncode == 0, res.stdout[-3000:]
    res = entry("enjoy.py", "--env", "test_race", "--experiment", "e2e", "--train_dir", tmp_path, "--policy_index", "2",
                "0", "--max_num_episodes", "4", "--no_render", "--device", "cpu", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Loaded latest checkpoint: policy 2: policy version" in res.stdout
    assert "Loaded latest checkpoint: policy 0: policy version" in res.stdout
    assert re.search(r"Episode \d+ \(agent 0, policy 2\): reward", res.stdout)
    assert re.search(r"Episode \d+ \(agent 1, policy 0\): reward", res.stdout)
    assert re.search(r"Policy 2: \d+ episodes, reward mean [-\d.]+, win mean", res.stdout)
    bad = entry("enjoy.py", "--env", "test_race", "--experiment", "e2e", "--train_dir", tmp_path, "--policy_index", "3",
                "--no_render", timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "enjoy.py: error: --policy_index 3: the experiment has policies 0-2 (--num_policies 3)"


@pytest.mark.parametrize("args, message", [
    (["--num_policies", "2", "--sync_mode", "hts"],
     "--sync_mode hts trains one policy; a population (--num_policies 2) needs --sync_mode async"),
    (["--num_policies", "65"], "--num_policies must be in [1, 64] (got 65)"),
    (["--num_policies", "2", "--pbt_perturb_min", "1.5", "--pbt_perturb_max", "1.2"],
     "--pbt_perturb_min (1.5) must be at most --pbt_perturb_max (1.2)"),
    (["--pbt_replace_fraction", "0.7"], "--pbt_replace_fraction must be in [0, 0.5] (got 0.7)"),
    (["--policy_mapping", "roundrobin"], "--policy_mapping must be one of"),
])
def test_population_bad_input_is_one_line(tmp_path, entry, args, message):
    res = entry("train.py", "--env", "test_corridor", "--train_dir", tmp_path, *args, timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    line = res.stderr.strip()
    assert "\n" not in line and line.startswith("train.py: error: " + message), line
    assert not os.listdir(tmp_path)


def engine_port(engine) -> int | None:
    """The UDP port on a VizDoom engine's command line (-port P), if any."""
    cmd = engine.cmdline()
    return next((int(cmd[i + 1]) for i in range(len(cmd) - 1) if cmd[i] == "-port"), None)


@pytest.mark.doom
def test_doom_duel_self_play_smoke(tmp_path):
    """doom_duel (2 learning agents per match over VizDoom's network mode on localhost), 2 policies: both policies'
    versions advance; at Ctrl-C every engine ends, their shared memory and the match's UDP port are released."""
    pytest.importorskip("vizdoom")
    import fcntl
    from sf_envs.doom import ports
    skip_if_unavailable("doom_duel")
    log = tmp_path / "log.txt"
    proc = start_train(["--env", "doom_duel", "--experiment", "duel", "--train_dir", str(tmp_path),
                        "--num_workers", "1", "--num_envs_per_worker", "2", "--worker_num_splits", "2",
                        "--num_policies", "2", "--rollout", "16", "--recurrence", "16", "--batch_size", "64",
                        "--rnn_size", "32", "--hidden_size", "32", "--report_interval_sec", "2", "--device", "cpu",
                        # each match is policy 0 against policy 1: a random draw gives all 4 agents to one policy
                        # 1 time in 8, and a duel's episodes outlast the test
                        "--policy_mapping", "fixed"], log)
    try:
        versions = lambda: [int(v) for v in re.findall(r"policy \d: version (\d+)", log.read_text())[-2:]]  # noqa: E731
        wait_for(lambda: len(versions()) == 2 and min(versions()) >= 2, 240, "both policies to train", log)
        engines = [c for c in psutil.Process(proc.pid).children(recursive=True) if c.name() == "vizdoom"]
        assert len(engines) == 4  # 2 matches x 2 players
        files = engine_files(engines)
        used_ports = {port for port in map(engine_port, engines) if port is not None}
        assert len(used_ports) == 2  # one port per match, distinct
    finally:
        stop_with_ctrl_c(proc, log, policies=2)
    wait_for(lambda: not any(e.is_running() and e.status() != psutil.STATUS_ZOMBIE for e in engines), 10,
             "engines to end")
    assert not files & shm_files(vizdoom=True)
    for port in used_ports:
        assert ports.udp_port_free(port)
        with open(ports.lock_dir() / f"{port}.lock", "a") as f:  # no lease holds it any more
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_resuming_pbt_with_another_population_size_is_one_line(tmp_path, entry):
    """A pbt_state.json of 2 policies, resumed with --num_policies 3: refused before anything is written."""
    from sf.runner.population.pbt import PopulationBasedTraining
    from sf.runner.population.pbt_settings import PbtSettings, default_hyper_specs
    exp = tmp_path / "e2e"
    exp.mkdir()
    pbt = PopulationBasedTraining(2, PbtSettings(), {"learning_rate": 1e-3, "exploration_loss_coeff": 0.01,
                                                     "adam_beta1": 0.9}, default_hyper_specs(), seed=0)
    (exp / "pbt_state.json").write_text(json.dumps(pbt.state_dict()))
    before = {p: p.read_bytes() for p in exp.iterdir()}
    res = entry("train.py", *train_args(tmp_path, "test_corridor", "--num_policies", "3", "--with_pbt", "True"),
                timeout=60)
    assert res.returncode == 2 and res.stdout == "", res.stdout + res.stderr
    line = res.stderr.strip()
    assert "\n" not in line and line.startswith(f"train.py: error: {exp / 'pbt_state.json'}: "), line
    assert "move it aside" in line
    assert {p: p.read_bytes() for p in exp.iterdir()} == before


def test_more_policies_than_agents_playing_says_so_and_every_policy_trains(tmp_path, entry):
    """4 policies on 2 envs of one agent (the random mapping): one line at start says that only 2 play at once and
    that the run ends when every policy has trained its budget; the console names the policies without experience
    yet; the draws cover the population (a deck per rollout worker), so every policy trains its budget and the run
    ends."""
    res = entry("train.py", *train_args(tmp_path, "test_corridor", *POP, "--num_workers", "1",
                                        "--num_envs_per_worker", "2", "--num_policies", "4",
                                        "--policy_resample_episodes", "1", "--train_for_env_steps", "1500"),
                timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout + res.stderr
    assert len(re.findall(r"Population: 4 policies but 2 agent\(s\) play at once: .* every policy has trained "
                          r"--train_for_env_steps", out)) == 1, out[-3000:]
    assert re.search(r"4 policies \(no experience yet: [0-3](, [0-3])*\):", out), out[-3000:]
    for p in range(4):
        last = sorted((tmp_path / "e2e" / f"checkpoint_p{p}").glob("checkpoint_*.pth"))[-1]
        assert int(last.stem.split("_")[-1]) >= 1500, p
