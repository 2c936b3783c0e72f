"""Data-parallel ranks on two hosts (issue 42): two network namespaces joined by a veth pair (tests/two_hosts.py), each
host with a train dir of its own (no shared filesystem), `torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d
--rdzv-endpoint <host 0>:PORT` on each. The run trains to one digest on both hosts, only host 0 holds checkpoints, and a
resume on both hosts works from host 0's files alone: rank 0 sends its checkpoint's state through the process group."""
import re
import time
from pathlib import Path

import pytest

from e2e_helpers import ROOT, SMALL, trained_frames, wait_for
from sf.runner.startup.experiment_lock import ExperimentLock
from two_hosts import TwoHosts, why_not

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(why_not() is not None, reason=f"two hosts: {why_not()}")]

def torchrun(host, rdzv_host, train_dir: Path, log: Path, *extra: str):
    """torchrun of one rank on `host` (Host.torchrun), training test_corridor into `train_dir`."""
    cmd = host.torchrun(rdzv_host, "two_hosts", [
        str(ROOT / "train.py"), "--env", "test_corridor", "--experiment", "ddp", "--train_dir", str(train_dir),
        "--num_workers", "1", "--seed", "5", *SMALL, "--num_envs_per_worker", "2", "--distributed_timeout_sec", "60",
        *extra])
    return host.popen(cmd, log, cwd=ROOT)


def run_both(h0, h1, dirs, logs, *extra, ok: bool = True) -> list[str]:
    """Both hosts' torchrun to their end (both exit 0, or with `ok` False both fail); their logs."""
    procs = [torchrun(h, h0, d, log, *extra) for h, d, log in zip((h0, h1), dirs, logs)]
    try:
        rcs = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    texts = [log.read_text() for log in logs]
    assert (rcs == [0, 0]) if ok else (0 not in rcs), (rcs, "\n\n".join(t[-3000:] for t in texts))
    return texts


def digest(text: str, rank: int) -> str:
    found = re.findall(rf"\[rank {rank}\]\[INFO\] Final weights sha256: ([0-9a-f]{{64}})", text)
    assert len(found) == 1, text[-3000:]
    return found[0]


def files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()) if d.exists() else []


def test_two_hosts_train_and_resume_without_a_shared_filesystem(tmp_path):
    dirs = [tmp_path / "host0", tmp_path / "host1"]
    logs = [tmp_path / "host0.log", tmp_path / "host1.log"]
    with TwoHosts() as (h0, h1):
        texts = run_both(h0, h1, dirs, logs, "--train_for_env_steps", "3000")
        assert digest(texts[0], 0) == digest(texts[1], 1)  # host 0 holds rank 0 (the lower address)
        assert re.search(r"\[rank 0\]\[INFO\] Saved final checkpoint", texts[0]), texts[0][-3000:]
        assert list((dirs[0] / "ddp" / "checkpoint_p0").glob("checkpoint_*.pth"))
        assert files(dirs[1]) == []  # rank 1 writes nothing: no checkpoint, no config.json, no log
        assert re.search(r"\[rank 0\]\[INFO\] Gradient all-reduce: [1-9]\d* calls of \d+ KiB", texts[0])
        first = digest(texts[0], 0)

        texts = run_both(h0, h1, dirs, logs, "--train_for_env_steps", "6000")
        resumed = [re.findall(r"\[rank (\d)\]\[INFO\] Resumed from checkpoint: policy version (\d+)", t) for t in texts]
        assert [r for r, _ in resumed[0]] == ["0"] and [r for r, _ in resumed[1]] == ["1"], texts[1][-3000:]
        assert resumed[0][0][1] == resumed[1][0][1]  # the same version: rank 0's checkpoint, sent to rank 1
        assert digest(texts[0], 0) == digest(texts[1], 1) != first
        assert files(dirs[1]) == []
        wait_for(lambda: h0.pids() == [] and h1.pids() == [], 20, "nothing left running on either host")

        # Only host 0 can see that the experiment is finished, or that it refuses the run: host 1 learns it from rank
        # 0 through torchrun's store, at once (before, it waited --distributed_timeout_sec for the learners' group)
        start = time.monotonic()
        texts = run_both(h0, h1, dirs, logs, "--train_for_env_steps", "6000", "--distributed_timeout_sec", "600")
        assert time.monotonic() - start < 120
        assert "[rank 0][INFO] Done: nothing to train" in texts[0], texts[0][-3000:]
        assert ("[rank 1][INFO] Done: rank 0: nothing to train: the experiment reached --train_for_env_steps 6000 "
                "already. Nothing was written on this rank.") in texts[1], texts[1][-3000:]
        lock = ExperimentLock.acquire(dirs[0], "ddp")  # (another run of the experiment, on host 0)
        try:
            start = time.monotonic()
            texts = run_both(h0, h1, dirs, logs, "--train_for_env_steps", "9000", "--distributed_timeout_sec", "600",
                             ok=False)
        finally:
            lock.release()
        assert time.monotonic() - start < 120
        refusal = re.search(r"train.py: error: (experiment .* is in use by another run.*)", texts[0]).group(1)
        assert f"train.py: error: rank 0 did not start the run: {refusal}" in texts[1], texts[1][-3000:]
        assert files(dirs[1]) == []
        wait_for(lambda: h0.pids() == [] and h1.pids() == [], 20, "nothing left running on either host")


DECISION = re.compile(r"PBT: policy \d+ \([^)]*frames\) (copies weights|mutates|keeps its weights|skips this update)")
DECIDED = re.compile(r"PBT: policy \d+ \([^)]*frames\) (copies weights|mutates)")
COPIED = re.compile(r"\[rank (\d)\]\[INFO\] PBT: policy (\d) now plays with the weights of policy (\d)")


def test_a_population_of_4_with_pbt_trains_over_two_hosts_and_each_host_resumes_its_policies(tmp_path):
    """--num_policies 4 --with_pbt over the two hosts (issue 42, item 2): policies 0 and 2 live on host 0, 1 and 3 on
    host 1; each host writes its policies' checkpoints and its own event file into its own train dir (no shared
    filesystem); rank 0 alone decides for all 4 (its console, its pbt_state.json), and every weight copy lands on the
    policy's own host, whichever host its source lives on; a resume on both hosts restores every policy from its host's
    files and PBT from host 0's. (A cross-host copy bit for bit: tests/runner/test_population_link.py.)"""
    dirs = [tmp_path / "host0", tmp_path / "host1"]
    logs = [tmp_path / "host0.log", tmp_path / "host1.log"]
    mine = {0: ["0", "2"], 1: ["1", "3"]}
    # (10,000 frames: a host that starts seconds after the other still overlaps it for several PBT periods)
    pbt = ["--num_policies", "4", "--with_pbt", "True", "--pbt_period_env_steps", "500", "--pbt_start_mutation", "1000",
           "--pbt_replace_fraction", "0.5", "--pbt_replace_reward_gap", "0.0"]
    with TwoHosts() as (h0, h1):
        texts = run_both(h0, h1, dirs, logs, *pbt, "--train_for_env_steps", "10000")
        for rank in (0, 1):
            checkpoints = sorted(p.parent.name for p in (dirs[rank] / "ddp").glob("checkpoint_p*/checkpoint_*.pth"))
            assert sorted(set(checkpoints)) == [f"checkpoint_p{p}" for p in mine[rank]], files(dirs[rank])
            assert len(list((dirs[rank] / "ddp").glob(f"events.out.tfevents.*.rank{rank}"))) == 1
            saved = re.findall(rf"\[rank {rank}\]\[INFO\] Saved final checkpoint \S+/checkpoint_p(\d)/", texts[rank])
            assert sorted(saved) == mine[rank], texts[rank][-3000:]
        assert not list((dirs[1] / "ddp").glob("config.json"))  # (rank 0's files: config.json, the log)
        assert DECIDED.search(texts[0]), texts[0][-3000:]
        assert not DECISION.search(texts[1]), texts[1][-3000:]
        assert (dirs[0] / "ddp" / "pbt_state.json").is_file() and not (dirs[1] / "ddp" / "pbt_state.json").exists()
        for text in texts:
            for rank, policy, _ in COPIED.findall(text):
                assert policy in mine[int(rank)]

        texts = run_both(h0, h1, dirs, logs, *pbt, "--train_for_env_steps", "11000")
        for rank in (0, 1):
            resumed = re.findall(rf"\[rank {rank}\]\[INFO\] Resumed policy (\d) from checkpoint", texts[rank])
            assert sorted(resumed) == mine[rank], texts[rank][-3000:]
        assert "population-based training, resumed" in texts[0], texts[0][-3000:]
        wait_for(lambda: h0.pids() == [] and h1.pids() == [], 20, "nothing left running on either host")


TIMEOUT = 20  # --distributed_timeout_sec of the link test
MARGIN = 30  # seconds past it: the final checkpoint, stopping the processes, torchrun's own exit


def test_a_host_whose_link_goes_down_stops_the_run_with_a_checkpoint_and_both_resume(tmp_path):
    """Host 1's link goes down mid-run: no reset, its packets go nowhere. Host 0's learner waits in a collective until
    --distributed_timeout_sec, writes a final checkpoint and the run stops within TIMEOUT + MARGIN; host 1's rank stops
    too; nothing is left running in either namespace. With the link back, both hosts resume from host 0's checkpoint."""
    dirs = [tmp_path / "host0", tmp_path / "host1"]
    logs = [tmp_path / "host0.log", tmp_path / "host1.log"]
    with TwoHosts() as (h0, h1):
        procs = [torchrun(h, h0, d, log, "--train_for_seconds", "600", "--distributed_timeout_sec", str(TIMEOUT))
                 for h, d, log in zip((h0, h1), dirs, logs)]
        try:
            wait_for(lambda: trained_frames(logs[0].read_text()) > 0, 180, "both ranks to train", logs[0])
            h1.cut()
            t0 = time.time()
            rc0 = procs[0].wait(timeout=TIMEOUT + MARGIN + 60)
            stopped_in = time.time() - t0
            wait_for(lambda: h0.pids() == [] and h1.pids() == [], 60, "nothing left running on either host")
        finally:
            for p in procs:
                p.kill()
        text = logs[0].read_text()
        assert rc0 != 0 and stopped_in < TIMEOUT + MARGIN, f"host 0 stopped {stopped_in:.0f} s after the cut, rc {rc0}"
        saved = re.findall(r"\[rank 0\]\[INFO\] Saved final checkpoint \S+checkpoint_(\d+)_(\d+)\.pth", text)
        assert saved, text[-4000:]
        assert "DistributedError" in text or "failed on rank 0" in text, text[-4000:]
        # rank 1 stopped on its own collective's timeout, or was stopped by its torchrun agent, whose store connection
        # failed first; a crash it reports points at its console (it writes no file)
        text1 = logs[1].read_text()
        assert all(where.startswith("the lines below") for where in
                   re.findall(r"\[rank 1\]\[ERROR\] \S+ crashed: .* \(traceback in ([^)]*)\)", text1)), text1[-4000:]
        assert files(dirs[1]) == []

        h1.uncut()
        version, frames = map(int, saved[-1])  # (frames per rank)
        logs = [tmp_path / "host0_resumed.log", tmp_path / "host1_resumed.log"]
        texts = run_both(h0, h1, dirs, logs, "--train_for_env_steps", str(2 * frames + 2000))
        resumed = [re.findall(r"\[rank \d\]\[INFO\] Resumed from checkpoint: policy version (\d+)", t) for t in texts]
        assert resumed == [[str(version)]] * 2, (saved, resumed)
        assert digest(texts[0], 0) == digest(texts[1], 1)
        assert files(dirs[1]) == []
