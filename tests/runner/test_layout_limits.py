"""Every layout the parameter limits allow can be started. Each process is started from the fork server with every file
descriptor its arguments carry, and the fork server takes at most MAX_FDS_SENT: the trajectory buffers, the shared
state and each policy's weights travel as one descriptor each (sf.utils.packed), and --num_workers is bounded by what
a policy worker (every rollout worker's reply queue) can be sent. A start the system refuses anyway is one line."""
import re
import signal
import subprocess
import sys

import psutil
import pytest

from e2e_helpers import ROOT, child_pids, skip_if_unavailable, start_train, wait_for
import sf.runner.runner as runner_module
from sf.buffers.shared_weights import SharedWeights
from sf.buffers.trajectory_buffers import TrajectoryBuffers
from sf.cfg import PARAMS, parse_cfg
from sf.ipc import Queue
from sf.model.actor_critic import create_actor_critic
from sf.processes.fds import MAX_FDS_SENT, fds_sent
from sf.processes.shared_state import SharedState
from sf.runner.startup.experiment_lock import ExperimentLock
from sf.runner.health.healing import process_kind
from sf_envs.registry import make_env

LIMITS = {p.name: int(p.max_value) for p in PARAMS if p.name in
          ("num_policies", "num_workers", "policy_workers_per_policy", "num_envs_per_worker")}
TINY = ["--rollout", "8", "--recurrence", "8", "--batch_size", "64", "--rnn_size", "16", "--hidden_size", "16",
        "--encoder_mlp_layers", "16", "--use_rnn", "False", "--device", "cpu", "--report_interval_sec", "1"]


class CountingContext:
    """Stands in for the fork server's multiprocessing context where the layout's processes cannot all run on this
    machine: a start counts the descriptors the fork server would be sent (sf.processes.fds) instead of forking."""

    def __init__(self):
        self.sent: dict[str, int] = {}

    def Process(self, target, args, name, daemon):  # noqa: N802 — multiprocessing's name
        sent = self.sent

        class Started:
            pid = 0

            def start(self):
                sent[name] = fds_sent(args)
        return Started()


def test_every_process_of_the_largest_layout_is_sent_few_enough_descriptors(tmp_path, monkeypatch):
    """--num_policies, --num_workers and --policy_workers_per_policy at their limits, population-based training: the
    runner's real arguments for each of its 64 + 64 x 16 + 200 processes carry at most MAX_FDS_SENT descriptors (a
    learner gets every policy's weights, a rollout worker every policy's request and learner queue, a policy worker
    every rollout worker's reply queue)."""
    P, W, PW = LIMITS["num_policies"], LIMITS["num_workers"], LIMITS["policy_workers_per_policy"]
    cfg = parse_cfg(["--env", "test_race", "--experiment", "limits", "--train_dir", str(tmp_path), *TINY,
                     "--num_policies", str(P), "--with_pbt", "True", "--num_workers", str(W),
                     "--policy_workers_per_policy", str(PW), "--num_envs_per_worker", "2"])  # (envs carry none)
    # (the memory check would refuse 1,288 processes on a small machine: only their arguments are built here)
    monkeypatch.setattr(runner_module, "check_memory", lambda *args: None)
    runner = runner_module.Runner(cfg)
    runner.lock = ExperimentLock.acquire(cfg.train_dir, cfg.experiment)  # the learners' too, as in run_training
    try:
        runner.build()
        context = CountingContext()
        runner.start_processes(context)
    finally:
        runner.close_queues()
        runner.stats.close()
        runner.lock.release()
    assert len(context.sent) == P + P * PW + W
    most = {}
    for name, fds in context.sent.items():
        most[process_kind(name)] = max(most.get(process_kind(name), 0), fds)
    assert max(most.values()) <= MAX_FDS_SENT, most
    # what grows with the layout: a learner's one descriptor per policy, a rollout worker's two queues per policy, a
    # policy worker's reply queue per rollout worker (the rest is a handful: buffers, state, report queue, ...)
    assert most["learner"] < P + 10 and most["rollout_worker"] < 2 * P + 10 and most["policy_worker"] < W + 10, most


@pytest.mark.e2e
def test_fds_sent_counts_what_the_fork_server_is_sent(tmp_path):
    """fds_sent() against the real thing: a process started from a fork server with packed buffers, state and weights
    and a list of queues received exactly the descriptors counted (its Popen's list), and sees the shared memory."""
    import torch.multiprocessing
    cfg = parse_cfg(["--env", "test_race", "--train_dir", str(tmp_path), *TINY])
    env = make_env(cfg, 0)
    model = create_actor_critic(cfg, env.observation_space, env.action_space)
    buffers = TrajectoryBuffers(4, 8, env.observation_space, env.action_space, model.rnn_state_size)
    env.close()
    weights = [SharedWeights(model) for _ in range(3)]
    state, queues = SharedState(5, 2, 3, num_slots=4), [Queue() for _ in range(5)]
    args = (buffers, state, weights, queues)
    assert fds_sent(args) == 1 + 1 + 3 + 5
    state.worker_frames[4] = 17
    buffers.rewards[3, 7] = 2.5
    weights[2].publish(model, 9)
    process = torch.multiprocessing.get_context("forkserver").Process(target=_report_shared, args=args)
    process.start()
    try:
        assert len(process._popen._fds) == fds_sent(args)
        assert queues[0].get(timeout=120) == (17, 2.5, 9)
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
    assert process.exitcode == 0
    for q in queues:
        q.close()


def _report_shared(buffers, state, weights, queues) -> None:
    queues[0].put((int(state.worker_frames[4]), float(buffers.rewards[3, 7]), weights[2].version))


def _run(args: list, log) -> subprocess.Popen:
    return start_train(["--experiment", "limits", "--train_dir", str(log.parent), *TINY, *args], log)


def _stop(proc: subprocess.Popen, log) -> str:
    """Ctrl-C: the run stops cleanly (exit code 0) and every process it started is gone."""
    pids = child_pids(log)
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "Traceback" not in text and "crashed" not in text, text[-3000:]
    assert not [name for name, pid in pids.items() if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    return text


def _still_running(proc: subprocess.Popen, log, may_not_fit: bool = False) -> None:
    """The run did not end. may_not_fit: a run its memory check refused is skipped (the layout's estimate, 80 MiB a
    process, is close to what a 23 GiB machine has; elsewhere the refusal is the intended behaviour: one line, exit
    code 2)."""
    if may_not_fit and proc.poll() is not None:
        refusal = re.search(r"error: this configuration needs about .*", log.read_text())
        if refusal and proc.returncode == 2:
            pytest.skip(f"not enough memory on this machine: {refusal.group(0)}")
    assert proc.poll() is None, log.read_text()[-3000:]


def _trained(log, policies: int) -> bool:
    """Some policy trained on a batch (its version went past 0): learners, policy and rollout workers all worked."""
    text = log.read_text()
    pattern = r"policy \d+: version (\d+)" if policies > 1 else r"Policy version: (\d+)"
    return len(child_pids(log)) > 0 and any(int(v) > 0 for v in re.findall(pattern, text))


@pytest.mark.e2e
def test_the_largest_population_starts_trains_and_stops(tmp_path):
    """--num_policies at its limit (64 learners and 64 policy workers) on the cheapest multi-agent env: every process
    starts, some policies train, Ctrl-C ends the run with every learner's final checkpoint."""
    P = LIMITS["num_policies"]
    log = tmp_path / "log.txt"
    proc = _run(["--env", "test_race", "--num_policies", str(P), "--num_workers", "1", "--num_envs_per_worker", "2"],
                log)
    wait_for(lambda: _trained(log, P) or proc.poll() is not None, 300, "a policy to train", log)
    _still_running(proc, log)
    assert len(child_pids(log)) == 2 * P + 1
    text = _stop(proc, log)
    assert len(re.findall(r"Saved final checkpoint .*checkpoint_p\d+/", text)) == P


@pytest.mark.e2e
def test_the_most_workers_start_train_and_stop(tmp_path):
    """--num_workers and --policy_workers_per_policy at their limits (one env each, the cheapest env): every process
    starts, the policy trains, Ctrl-C ends the run cleanly."""
    W, PW = LIMITS["num_workers"], LIMITS["policy_workers_per_policy"]
    log = tmp_path / "log.txt"
    proc = _run(["--env", "test_race", "--num_workers", str(W), "--policy_workers_per_policy", str(PW),
                 "--num_envs_per_worker", "1", "--worker_num_splits", "1"], log)
    wait_for(lambda: _trained(log, 1) or proc.poll() is not None, 300, "the policy to train", log)
    _still_running(proc, log, may_not_fit=True)
    assert len(child_pids(log)) == W + PW + 1
    _stop(proc, log)


@pytest.mark.e2e
def test_the_most_envs_per_worker_start_train_and_stop(tmp_path):
    """--num_envs_per_worker at its limit (one rollout worker): its envs are made and stepped, the policy trains, Ctrl-C
    ends the run cleanly."""
    log = tmp_path / "log.txt"
    proc = _run(["--env", "test_race", "--num_workers", "1", "--num_envs_per_worker",
                 str(LIMITS["num_envs_per_worker"])], log)
    wait_for(lambda: _trained(log, 1) or proc.poll() is not None, 300, "the policy to train", log)
    _still_running(proc, log)
    _stop(proc, log)


@pytest.mark.e2e
def test_a_process_the_fork_server_refuses_is_one_line_and_stops_the_others(tmp_path):
    """A fork server that takes fewer descriptors than a rollout worker is sent (multiprocessing's limit lowered to 12,
    so 7 at most): the learner and the policy worker started, the rollout worker cannot be; the run ends with one line
    naming the process and the cause (exit code 1, no traceback), and the processes it had started are gone."""
    code = ("import sys, multiprocessing.forkserver as f; f.MAXFDS_TO_SEND = 12; from sf.train import main; "
            "sys.exit(main(prog='train.py'))")
    res = subprocess.run([sys.executable, "-c", code, "--env", "test_race", "--experiment", "limits", "--train_dir",
                          str(tmp_path), *TINY, "--num_workers", "1", "--num_envs_per_worker", "2"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Traceback" not in res.stdout + res.stderr
    line = res.stderr.strip()
    refused = re.fullmatch(r"train.py: error: cannot start (\S+): its arguments carry \d+ file descriptors, the fork "
                           r"server passes at most 7", line)
    assert refused, line
    started = dict(re.findall(r"Started (\S+) \(pid (\d+)\)", res.stdout))
    assert started and refused.group(1) not in started, res.stdout[-3000:]  # (today: the rollout worker is refused)
    assert not [pid for pid in map(int, started.values()) if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.e2e
@pytest.mark.doom
def test_doom_duel_bots_population_with_pbt_starts_and_stops(tmp_path):
    """The paper's population (8 policies, population-based training) on doom_duel_bots, whose recurrent model with a
    measurements encoder and 7 action heads has 35 state_dict entries (8 policies' weights were 288 descriptors for
    each learner before they were packed): every process starts, the envs step, Ctrl-C ends the run with every
    learner's final checkpoint."""
    pytest.importorskip("vizdoom")
    skip_if_unavailable("doom_duel_bots")
    log = tmp_path / "log.txt"
    proc = _run(["--env", "doom_duel_bots", "--num_policies", "8", "--with_pbt", "True", "--num_workers", "1",
                 "--num_envs_per_worker", "2", "--rollout", "16", "--recurrence", "16", "--use_rnn", "True"], log)
    frames = lambda: [int(n) for n in re.findall(r"Total num frames: (\d+)", log.read_text())]  # noqa: E731
    wait_for(lambda: any(frames()) or proc.poll() is not None, 240, "the envs to step", log)
    _still_running(proc, log)
    assert len(child_pids(log)) == 8 + 8 + 1
    text = _stop(proc, log)
    assert len(re.findall(r"Saved final checkpoint .*checkpoint_p\d+/", text)) == 8
