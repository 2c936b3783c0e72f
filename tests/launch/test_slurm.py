"""The Slurm backend of `python -m sf.launch` against a real single-node Slurm (slurm_cluster.py: munged, slurmctld and
slurmd started for this module, skipped with the reason where Slurm is not installed or this is not root): a 2
configurations x 2 seeds sweep of test_image submitted as one job array, one task requeued mid-run and resuming from
its checkpoint, every run done, --status and --summary read back; a finished run's requeued task exits 0 without
training; --cancel of a second submission; a failed run's last line; a run of 2 ranks under torchrun inside its
job. Without a cluster: the script of --dry_run, bad options and an unreachable Slurm (one line, exit code 2, nothing
written)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_helpers import ROOT, SMALL, wait_for
from slurm_cluster import SlurmCluster, unavailable

from sf.launch.__main__ import main as launch_main
from sf.launch.state import checkpoint_frames, read_launch

BUDGET = 20000
TRAIN = ["python", "train.py", "--env", "test_image", *SMALL, "--save_every_sec", "2"]


def write_sweep(path: Path, name: str, budget: int, grid: dict, seeds: list) -> Path:
    path.write_text(json.dumps({"name": name, "command": TRAIN + ["--train_for_env_steps", str(budget)],
                                "grid": grid, "seeds": seeds, "env_vars": {"OMP_NUM_THREADS": "1"}}))
    return path


@pytest.fixture(scope="module")
def cluster():
    why = unavailable()
    if why:
        pytest.skip(why)
    c = SlurmCluster(cpus=4).start()
    try:
        yield c
    finally:
        c.stop()


def sf_launch(cluster, cwd, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sf.launch", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=dict(cluster.env, PYTHONPATH=str(ROOT)), timeout=120)


def task_state(cluster, task: str) -> str:
    return cluster.run("squeue", "-h", "-t", "all", "-j", task, "-o", "%T", check=False).stdout.strip()


def exp_dirs(td: Path, sweep: str) -> list[Path]:
    return sorted(p for p in (td / sweep).iterdir() if p.is_dir() and not p.name.startswith("."))


def requeue(cluster, task: str):
    """scontrol requeue, then start it at once (Slurm holds a requeued job back for two minutes: BeginTime)."""
    cluster.run("scontrol", "requeue", task)
    wait_for(lambda: task_state(cluster, task) == "PENDING", 60, f"{task} to be pending again")
    cluster.run("scontrol", "update", f"JobId={task}", "StartTime=now")


@pytest.mark.e2e
def test_sweep_runs_as_job_array_and_a_requeued_task_resumes(cluster, tmp_path):
    sweep = write_sweep(tmp_path / "sweep.json", "lr", BUDGET, {"learning_rate": [0.0001, 0.0003]}, [1, 2])
    td = tmp_path / "td"
    r = sf_launch(cluster, tmp_path, sweep, "--backend", "slurm", "--train_dir", td, "--slurm_cpus_per_task", 1)
    assert r.returncode == 0, r.stderr
    job = json.loads((td / "lr" / ".launch" / "slurm.json").read_text())["submissions"][0]["job_id"]
    assert f"submitted job array {job}: 4 run(s)" in r.stdout
    runs = exp_dirs(td, "lr")
    assert [read_launch(d)["job_id"] for d in runs] == [f"{job}_{i}" for i in range(4)]

    # task 1 requeued once it has a checkpoint (as a preemption would): it resumes from it
    victim, task = runs[1], f"{job}_1"
    wait_for(lambda: checkpoint_frames(victim) > 0, 180, "a checkpoint of run 1", log=victim / "launch.log")
    before = checkpoint_frames(victim)
    assert before < BUDGET and task_state(cluster, task) == "RUNNING"
    requeue(cluster, task)
    wait_for(lambda: all(read_launch(d).get("state") == "done" for d in runs), 300, "every run done",
             log=victim / "launch.log")
    log = (victim / "launch.log").read_text()
    assert f"=== Slurm job {task} (attempt 2)" in log and "--restart_behavior resume" in log
    resumed = [int(f) for f in re.findall(r"Resumed from checkpoint: policy version \d+, (\d+) env frames", log)]
    assert resumed and resumed[-1] >= before > 0, log[-3000:]
    assert all(checkpoint_frames(d) >= BUDGET for d in runs)

    wait_for(lambda: all(task_state(cluster, f"{job}_{i}") == "COMPLETED" for i in range(4)), 60, "the tasks to end")
    r = sf_launch(cluster, tmp_path, sweep, "--train_dir", td, "--status", "--summary")
    assert r.returncode == 0, r.stderr
    for d in runs:
        assert re.search(rf"^{re.escape(d.name)}\s+done\s+\S+/{BUDGET / 1000:.2f}k", r.stdout, re.M), r.stdout
    assert "4 runs: 4 done" in r.stdout and f"{task} (COMPLETED)" in r.stdout, r.stdout
    assert re.search(r"^lr_l.rat_0.0001\s+2\s+2/2\s", r.stdout, re.M), r.stdout
    assert re.search(r"^lr_l.rat_0.0003\s+2\s+2/2\s", r.stdout, re.M), r.stdout

    # a finished run's task requeued (a preemption right after its end): exits 0 without training again
    requeue(cluster, f"{job}_0")
    wait_for(lambda: task_state(cluster, f"{job}_0") == "COMPLETED", 120, "the requeued finished task to end")
    info = cluster.run("scontrol", "show", "job", f"{job}_0").stdout
    assert "Restarts=1" in info and "ExitCode=0:0" in info, info
    assert (runs[0] / "launch.log").read_text().count("=== Slurm job") == 1
    assert read_launch(runs[0])["state"] == "done"

    # launching again: every run is done, nothing is submitted
    r = sf_launch(cluster, tmp_path, sweep, "--backend", "slurm", "--train_dir", td)
    assert r.returncode == 0 and "nothing to submit" in r.stdout, r.stdout + r.stderr


@pytest.mark.e2e
def test_cancel_stops_running_and_queued_tasks(cluster, tmp_path):
    sweep = write_sweep(tmp_path / "long.json", "long", 10**8, {}, [1, 2])
    td = tmp_path / "td"
    r = sf_launch(cluster, tmp_path, sweep, "--backend", "slurm", "--train_dir", td, "--max_parallel", 1,
                  "--slurm_cpus_per_task", 1)
    assert r.returncode == 0, r.stderr
    job = json.loads((td / "long" / ".launch" / "slurm.json").read_text())["submissions"][0]["job_id"]
    runs = exp_dirs(td, "long")
    wait_for(lambda: read_launch(runs[0]).get("state") == "running", 120, "task 0 to start")
    assert read_launch(runs[1])["state"] == "queued"  # --max_parallel 1: the array's throttle holds it back

    r = sf_launch(cluster, tmp_path, sweep, "--backend", "slurm", "--train_dir", td)
    assert r.returncode == 2 and "still queued or running" in r.stderr and len(r.stderr.splitlines()) == 1

    r = sf_launch(cluster, tmp_path, sweep, "--train_dir", td, "--cancel")
    assert r.returncode == 0 and f"cancelled job(s) {job}: 2 task(s)" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: all(read_launch(d).get("state") == "interrupted" for d in runs), 90, "both runs interrupted")
    wait_for(lambda: not cluster.run("squeue", "-h", "-j", job, check=False).stdout.strip(), 90, "the jobs to end")
    r = sf_launch(cluster, tmp_path, sweep, "--train_dir", td, "--status")
    assert r.returncode == 0 and "2 runs: 2 interrupted" in r.stdout, r.stdout + r.stderr
    assert "CANCELLED" in r.stdout
    r = sf_launch(cluster, tmp_path, sweep, "--train_dir", td, "--cancel")  # again: nothing left to cancel
    assert r.returncode == 0 and "no queued or running Slurm job" in r.stdout, r.stdout + r.stderr


@pytest.mark.e2e
def test_a_failed_run_shows_failed_with_its_last_line(cluster, tmp_path):
    """train.py made to fail at start (a sitecustomize on its PYTHONPATH, the sweep's env_vars: the task's wrapper
    does not get it): the task records failed with the exit code, --status shows its last line."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(
        "import os, sys\nsys.stderr.write('train.py: error: injected failure at start-up\\n')\nsys.stderr.flush()\n"
        "os._exit(1)\n")
    sweep = tmp_path / "fail.json"
    sweep.write_text(json.dumps({"name": "fail", "command": TRAIN, "seeds": [1],
                                 "env_vars": {"PYTHONPATH": str(tmp_path / "inject")}}))
    td = tmp_path / "td"
    r = sf_launch(cluster, tmp_path, sweep, "--backend", "slurm", "--train_dir", td, "--slurm_cpus_per_task", 1)
    assert r.returncode == 0, r.stderr
    run = exp_dirs(td, "fail")[0]
    wait_for(lambda: read_launch(run).get("state") == "failed", 120, "the run to fail", log=run / "launch.log")
    assert read_launch(run)["rc"] == 1
    job = read_launch(run)["job_id"]
    wait_for(lambda: task_state(cluster, job) == "FAILED", 60, "Slurm to see the task fail")
    r = sf_launch(cluster, tmp_path, sweep, "--train_dir", td, "--status")
    assert re.search(rf"^{re.escape(run.name)}\s+failed\s.*injected failure at start-up$", r.stdout, re.M), r.stdout
    assert f"{job} (FAILED)" in r.stdout


@pytest.mark.e2e
def test_ranks_per_task_runs_torchrun_inside_the_job(cluster, tmp_path):
    sweep = write_sweep(tmp_path / "ddp.json", "ddp", 4000, {}, [3])
    td = tmp_path / "td"
    r = sf_launch(cluster, tmp_path, sweep, "--backend", "slurm", "--train_dir", td, "--slurm_ranks_per_task", 2,
                  "--slurm_cpus_per_task", 2)
    assert r.returncode == 0, r.stderr
    run = exp_dirs(td, "ddp")[0]
    wait_for(lambda: read_launch(run).get("state") in ("done", "failed"), 240, "the 2-rank run to end",
             log=run / "launch.log")
    log = (run / "launch.log").read_text()
    assert read_launch(run)["state"] == "done", log[-3000:]
    assert "torch.distributed.run --standalone --nproc-per-node=2 -m sf.train" in log
    assert "All 2 ranks" in log


# --- without a cluster ---
def _sweep_here(tmp_path) -> Path:
    return write_sweep(tmp_path / "sweep.json", "lr", BUDGET, {"learning_rate": [0.0001, 0.0003]}, [1, 2])


def test_dry_run_prints_the_array_script_and_submits_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = launch_main([str(_sweep_here(tmp_path)), "--backend", "slurm", "--train_dir", "td", "--dry_run",
                      "--max_parallel", "2", "--slurm_partition", "gpu", "--slurm_cpus_per_task", "8",
                      "--slurm_gpus_per_task", "2", "--slurm_time", "1-00:00:00", "--slurm_ranks_per_task", "2",
                      "--slurm_sbatch_args", "--account=rl --qos=high"])  # a value with a space: not a flag
    out = capsys.readouterr().out
    assert rc == 0
    for line in ("#SBATCH --array=0-3%2", "#SBATCH --requeue", "#SBATCH --partition=gpu", "#SBATCH --cpus-per-task=8",
                 "#SBATCH --gpus-per-task=2", "#SBATCH --time=1-00:00:00", "#SBATCH --open-mode=append"):
        assert line in out.splitlines(), out
    assert re.search(r"^exec \S+python\S* -m sf.launch.slurm \S+/tasks.json \"\$SLURM_ARRAY_TASK_ID\"$", out, re.M)
    assert "torch.distributed.run --standalone --nproc-per-node=2 -m sf.train" in out
    assert "--num_workers 4" in out  # 8 cores, 2 ranks
    assert re.search(r"^# sbatch --parsable --account=rl --qos=high \S+/job.sbatch$", out, re.M), out
    assert not (tmp_path / "td").exists()


@pytest.mark.parametrize("args, flag", [
    (["--slurm_time", "soon"], "--slurm_time"),
    (["--slurm_cpus_per_task", "0"], "--slurm_cpus_per_task"),
    (["--slurm_ranks_per_task", "0"], "--slurm_ranks_per_task"),
    (["--slurm_sbatch_args=--array=1-2"], "--slurm_sbatch_args"),
    (["--slurm_sbatch_args=--qos='x"], "--slurm_sbatch_args"),
])
def test_bad_slurm_options_are_one_line(tmp_path, capsys, monkeypatch, args, flag):
    monkeypatch.chdir(tmp_path)
    rc = launch_main([str(_sweep_here(tmp_path)), "--backend", "slurm", "--train_dir", "td", *args])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and flag in err, err
    assert not (tmp_path / "td").exists()


def test_unreachable_slurm_is_one_line_and_submits_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # python, but no sbatch
    rc = launch_main([str(_sweep_here(tmp_path)), "--backend", "slurm", "--train_dir", "td"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Slurm is not reachable: no sbatch" in err, err
    assert not (tmp_path / "td").exists()


def test_slurm_without_a_controller_is_one_line_and_submits_nothing(tmp_path, capsys, monkeypatch):
    """The clients are installed but slurmctld does not answer (here: a configuration naming a port nobody listens
    on)."""
    if unavailable() and "not installed" in unavailable():
        pytest.skip(unavailable())
    from e2e_helpers import free_port
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=none\nSlurmctldHost=localhost\nSlurmctldPort={free_port()}\n"
                    f"AuthType=auth/munge\nAuthInfo=socket={tmp_path / 'no-munge'}\n"
                    "NodeName=localhost CPUs=1\nPartitionName=p Nodes=ALL Default=YES\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_CONF", str(conf))
    rc = launch_main([str(_sweep_here(tmp_path)), "--backend", "slurm", "--train_dir", "td"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Slurm is not reachable: sinfo: " in err, err
    assert "Unable to contact slurm controller" in err
    assert not (tmp_path / "td").exists()
