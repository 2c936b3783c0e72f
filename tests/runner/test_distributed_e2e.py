"""Data-parallel learners launched with torchrun (issue 19), end to end: `torchrun --standalone --nproc-per-node 2
train.py ...` runs two whole stacks whose learners average their gradients (gloo on CPU). Each test checks what a user
sees: both ranks end with the same weights (their `Final weights sha256` lines), only rank 0 writes checkpoints, a
Ctrl-C to the terminal's process group stops both cleanly, a rank that dies stops the other, and a resume with another
number of ranks is refused in one line. The oracle (2 ranks x batch B == 1 rank x batch 2B) is
tests/learning/test_distributed.py."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from e2e_helpers import ROOT, SMALL, free_port, shm_files, shm_left_behind, trained_frames, wait_for

pytestmark = pytest.mark.e2e

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def start_torchrun(args: list, log: Path) -> subprocess.Popen:
    """torchrun with 2 ranks on this machine, in a session of its own (a terminal's process group: Ctrl-C reaches
    torchrun and every rank). --standalone picks its own rendezvous port; --master-port keeps parallel test runs
    apart."""
    cmd = [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "--master-port", str(free_port()),
           str(ROOT / "train.py"), *args]
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"))


def digests(text: str) -> dict:
    return {int(r): d for r, d in re.findall(r"\[rank (\d)\]\[INFO\] Final weights sha256: ([0-9a-f]{64})", text)}


def rank_pids(text: str) -> dict:
    """rank -> the pid of its runner (the pid field of its log lines)."""
    return {int(r): int(p) for p, r in re.findall(r"\]\[(\d+)\]\[rank (\d)\]\[INFO\] (?:Data-parallel rank|Rank \d of)",
                                                    text)}


def tree(pid: int) -> list:
    try:
        return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def gone(procs: list) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)


def args(tmp_path, env="test_corridor", *extra) -> list:
    return ["--env", env, "--experiment", "ddp", "--train_dir", str(tmp_path), "--num_workers", "1", "--seed", "5",
            *SMALL, "--num_envs_per_worker", "2", *extra]


def run_to_the_end(train_args: list, log: Path) -> str:
    """torchrun with 2 ranks until its budget; asserts exit code 0, returns the console."""
    p = start_torchrun(train_args, log)
    try:
        rc = p.wait(timeout=300)
    finally:
        p.kill()
    text = log.read_text()
    assert rc == 0, text[-4000:]
    return text


@pytest.mark.doom
def test_two_ranks_train_doom_basic_to_identical_weights(tmp_path):
    pytest.importorskip("vizdoom")
    log = tmp_path / "log.txt"
    text = run_to_the_end(args(tmp_path, "doom_basic", "--train_for_env_steps", "8000"), log)
    final = digests(text)
    assert set(final) == {0, 1} and final[0] == final[1], text[-3000:]
    saves = re.findall(r"\[rank (\d)\]\[INFO\] Saved (?:final )?checkpoint", text)
    assert saves and set(saves) == {"0"}  # only rank 0 writes checkpoints
    assert re.search(r"\[rank 0\]\[INFO\] All 2 ranks: \d+ env frames collected", text)
    totals = [int(n) for n in re.findall(r"All 2 ranks: \d+ env frames collected \([\d.]+ frames/s\), (\d+) trained",
                                         text)]
    assert totals[-1] >= 8000  # the budget is the run's: both ranks together
    assert len(list((tmp_path / "ddp").glob("config.json"))) == 1
    # resumed with the same number of ranks: both from rank 0's checkpoint, to identical weights again
    text = run_to_the_end(args(tmp_path, "doom_basic", "--train_for_env_steps", "12000"), log)
    resumed = re.findall(r"\[rank (\d)\]\[INFO\] Resumed from checkpoint: policy version (\d+)", text)
    assert sorted(r for r, _ in resumed) == ["0", "1"] and len({v for _, v in resumed}) == 1, text[-3000:]
    again = digests(text)
    assert set(again) == {0, 1} and again[0] == again[1] != final[0]
    # a resume with another number of ranks: one line, nothing touched
    res = subprocess.run([sys.executable, str(ROOT / "train.py"), *args(tmp_path, "doom_basic", "--train_for_env_steps",
                                                                         "24000")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert re.search(r"was trained by 2 data-parallel rank\(s\), this run has 1: "
                     r"resume with the same number", res.stderr)
    assert "Traceback" not in res.stderr


def start_training(tmp_path, log: Path) -> subprocess.Popen:
    """A long run of 2 ranks on doom_basic, returned once both ranks trained."""
    pytest.importorskip("vizdoom")
    p = start_torchrun(args(tmp_path, "doom_basic", "--train_for_seconds", "600"), log)
    try:
        wait_for(lambda: re.search(r"All 2 ranks: \d+ env frames collected \([\d.]+ frames/s\), [1-9]\d* trained",
                                   log.read_text()), 180, "both ranks to train")
    except BaseException:
        p.kill()
        raise
    return p


@pytest.mark.doom
def test_ctrl_c_stops_both_ranks_with_a_checkpoint(tmp_path):
    log = tmp_path / "log.txt"
    p = start_training(tmp_path, log)
    try:
        procs = [q for pid in rank_pids(log.read_text()).values() for q in tree(pid)]
        os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        p.wait(timeout=60)
    finally:
        p.kill()
    text = log.read_text()
    final = digests(text)
    assert set(final) == {0, 1} and final[0] == final[1], text[-3000:]
    assert re.search(r"\[rank 0\]\[INFO\] Saved final checkpoint", text)
    wait_for(lambda: gone(procs), 20, "every process of both ranks to exit")


@pytest.mark.parametrize("population", [[], ["--num_policies", "4", "--with_pbt", "True", "--pbt_period_env_steps",
                                                "2000"]], ids=["data_parallel", "population_pbt"])
def test_a_killed_torchrun_stops_its_ranks_with_a_checkpoint(tmp_path, population):
    """SIGKILL of torchrun alone (not its process group): its orphaned ranks stop by themselves, with their final
    checkpoints (data-parallel: rank 0's; a population with PBT across the ranks, whose store dies with torchrun: each
    rank's policies'), nothing left in /dev/shm, instead of training on unseen until their budget."""
    log = tmp_path / "log.txt"
    before = shm_files()
    p = start_torchrun(args(tmp_path, "test_corridor", "--train_for_seconds", "600", *population), log)
    procs = []
    training = ([r"All 2 ranks: \d+ env frames collected \([\d.]+ frames/s\), [1-9]\d* trained"] if not population else
                [rf"\[rank {r}\]\[INFO\] Fps is .*\n\s+policy \d: version [1-9]" for r in (0, 1)])
    try:
        wait_for(lambda: all(re.search(t, log.read_text()) for t in training),
                 180, "both ranks to train", log)
        ranks = rank_pids(log.read_text())
        assert set(ranks) == {0, 1}
        procs = [q for pid in ranks.values() for q in tree(pid)]
        p.kill()  # torchrun alone
        p.wait(timeout=10)
        wait_for(lambda: gone(procs), 90, "both orphaned ranks to stop")
    finally:
        p.kill()  # (a failure before the kill: torchrun and its ranks, nothing left running)
        for q in procs:
            try:
                q.kill()
            except psutil.Error:
                pass
    text = log.read_text()
    # the first rank to see it stops, and its data-parallel peer with it (if it has not seen it yet itself)
    assert re.search(r"\[rank [01]\]\[ERROR\] This rank's launcher \(pid \d+, torchrun\) is gone: stopping", text), \
        text[-3000:]
    if not population:
        assert re.search(r"\[rank 0\]\[INFO\] Saved final checkpoint", text), text[-3000:]
        assert (tmp_path / "ddp" / "checkpoint_p0").is_dir()
    else:  # (no learners' group: each rank sees its launcher gone by itself)
        for rank in (0, 1):
            assert f"[rank {rank}][ERROR] This rank's launcher" in text, text[-3000:]
        saved = set(re.findall(r"\[rank (\d)\]\[INFO\] Saved final checkpoint \S+/checkpoint_p(\d)/", text))
        assert saved == {("0", "0"), ("0", "2"), ("1", "1"), ("1", "3")}, text[-3000:]
    assert not shm_left_behind(before)


@pytest.mark.doom
def test_a_rank_that_dies_stops_the_other(tmp_path):
    log = tmp_path / "log.txt"
    p = start_training(tmp_path, log)
    try:
        pids = rank_pids(log.read_text())
        procs = [q for pid in pids.values() for q in tree(pid)]
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.time()
        rc = p.wait(timeout=90)
        stopped_in = time.time() - t0
    finally:
        p.kill()
    text = log.read_text()
    assert rc != 0
    assert stopped_in < 45, f"rank 0 stopped {stopped_in:.0f} s after rank 1 died"
    wait_for(lambda: gone(procs), 20, "every process of both ranks to exit")
    assert re.search(r"\[rank 0\]\[INFO\] Saved final checkpoint", text), text[-3000:]  # rank 0's, at the failure
    assert "DistributedError" in text or "SIGTERM received" in text, text[-3000:]


def test_a_learner_waiting_for_a_slow_peer_is_not_a_stall(tmp_path):
    """Rank 1 stops whole (SIGSTOP to every process of it: a slow peer) for 4x --stall_timeout_sec. Rank 0's learner
    waits in a collective all that time without a heartbeat; the watchdog gives a data-parallel learner
    --distributed_timeout_sec (then the collective itself raises), so rank 0 does not declare it stuck. Rank 1
    continues, both go on training, and a Ctrl-C stops both cleanly with the same weights."""
    stall = 4.0
    log = tmp_path / "log.txt"
    p = start_torchrun(args(tmp_path, "test_corridor", "--stall_timeout_sec", str(stall), "--distributed_timeout_sec",
                            "120", "--train_for_seconds", "600"), log)
    try:
        wait_for(lambda: trained_frames(log.read_text()) > 0, 180, "both ranks to train", log)
        rank1 = tree(rank_pids(log.read_text())[1])
        assert rank1
        for q in rank1:  # its runner first: it must not see its own processes stopped
            q.suspend()
        try:
            time.sleep(4 * stall)  # the silence under test: rank 0's learner waits in a collective meanwhile
        finally:
            for q in reversed(rank1):
                q.resume()
        trained = trained_frames(log.read_text())
        wait_for(lambda: trained_frames(log.read_text()) > trained, 120, "training to go on", log)
        os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=60)
    finally:
        p.kill()
    text = log.read_text()
    assert "gave no sign of life" not in text, text[-4000:]
    final = digests(text)
    assert set(final) == {0, 1} and final[0] == final[1], text[-3000:]


def test_a_population_is_placed_on_the_ranks_and_resumes(tmp_path):
    """--num_policies 4 on 2 ranks (one machine, one train dir): policies 0 and 2 train on rank 0, 1 and 3 on rank 1,
    each to the budget (it holds for every policy, as on one machine); each rank writes its policies' checkpoints and
    its own event file with their series; a resume restores every policy on its rank; another number of ranks is
    refused in one line."""
    from sf.runner.stats import read_event_scalars
    log = tmp_path / "log.txt"
    population = ["--num_policies", "4", "--train_for_env_steps", "1200"]
    text = run_to_the_end(args(tmp_path, "test_corridor", *population), log)
    for rank, mine in ((0, "0, 2"), (1, "1, 3")):
        assert f"[rank {rank}][INFO] Rank {rank} of 2 (local rank {rank} of 2, cores" in text, text[-3000:]
        assert f"policies {mine} of the population of 4 (policy p on rank p mod 2)" in text
        assert re.search(rf"\[rank {rank}\]\[INFO\] Done: \d+ env frames \(rank {rank} of 2: policies {mine}\)", text)
    saved = set(re.findall(r"\[rank (\d)\]\[INFO\] Saved final checkpoint \S+/checkpoint_p(\d)/", text))
    assert saved == {("0", "0"), ("0", "2"), ("1", "1"), ("1", "3")}, text[-3000:]
    exp = tmp_path / "ddp"
    for p in range(4):
        newest = max((exp / f"checkpoint_p{p}").glob("checkpoint_*.pth")).stem
        assert int(newest.split("_")[2]) >= 1200, newest  # (checkpoint_<version>_<frames>)
    events = sorted(exp.glob("events.out.tfevents.*"))
    assert [e.name.endswith(f".rank{r}") for r, e in enumerate(events)] == [True, True], events
    assert "All 2 ranks" not in text  # (no learners' group: nothing is summed across ranks)
    series = read_event_scalars(exp)
    assert {t.split("/")[0] for t in series if re.match(r"p\d/", t)} == {"p0", "p1", "p2", "p3"}

    text = run_to_the_end(args(tmp_path, "test_corridor", "--num_policies", "4", "--train_for_env_steps", "2400"), log)
    resumed = set(re.findall(r"\[rank (\d)\]\[INFO\] Resumed policy (\d) from checkpoint", text))
    assert resumed == {("0", "0"), ("0", "2"), ("1", "1"), ("1", "3")}, text[-3000:]
    res = subprocess.run([sys.executable, str(ROOT / "train.py"), *args(tmp_path, "test_corridor", "--num_policies",
                                                                         "4", "--train_for_env_steps", "3600")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout[-2000:] + res.stderr[-2000:]
    assert "was trained by a run of 2 rank(s) (policy p on rank p mod 2), this run has 1" in res.stderr
