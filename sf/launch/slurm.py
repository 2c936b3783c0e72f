"""The Slurm backend: one job array per launch (`sbatch --array`), one array task per run of the sweep.

Submission. The runs not done yet (sf.launch.state) become the tasks 0..N-1 of one array (`%max_parallel` throttles
it when --max_parallel is given). Written before sbatch, under <train_dir>/.launch/slurm/<stamp>/: job.sbatch (the
script, with the #SBATCH options) and tasks.json (each task's run: its command, environment and experiment
directory). <train_dir>/.launch/slurm.json lists the submissions (job ids, their runs); each run's
<exp_dir>/launch.json gets {"backend": "slurm", "state": "queued", "job_id": "<array id>_<task>"}.

A task. The script execs `python -m sf.launch.slurm <tasks.json> $SLURM_ARRAY_TASK_ID` (run_task): a run found done
exits 0 at once (a requeued task of a finished run); otherwise train.py runs (under torchrun with
--slurm_ranks_per_task > 1), its output appended to <exp_dir>/launch.log, its state recorded in launch.json (running,
then done / failed / interrupted). The script carries `#SBATCH --requeue`: a preempted or `scontrol requeue`d task
runs again and train.py resumes from the run's latest checkpoint (--restart_behavior resume on every attempt after
the first, whatever the sweep's command says).

Signals. Slurm stops a job (cancel, requeue, preemption, time limit) by signalling every process of it (SIGTERM, then
SIGKILL after KillWait); the task records "interrupted" when it was signalled, whatever train.py's exit code. train.py's
workers get the SIGTERM too (not only its runner), so no final checkpoint is written: the run resumes from its latest
periodic one (--save_every_sec).

--status reads each run's files (sf.launch.state) and what Slurm says of its task: squeue (pending, running and, for
MinJobAge seconds, finished jobs), else sacct where accounting runs. --cancel scancels the sweep's arrays that still
have queued or running tasks.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from sf.launch.state import LAUNCH_DIR, LAUNCH_LOG, checkpoint_frames, read_launch, record_runs, run_state, \
    write_launch
from sf.launch.summary import status_table
from sf.launch.sweep import Run, Sweep, SweepError, train_command
from sf.utils.files import one_line, write_json_atomic, write_text_atomic

SLURM_JSON = "slurm.json"
CLIENT_TIMEOUT_SEC = 60  # an sbatch/squeue that slurmctld does not answer within this is "not reachable"
# Slurm's --time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; 0 / UNLIMITED / INFINITE
TIME_RE = re.compile(r"(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}|"
                     r"UNLIMITED|INFINITE|unlimited|infinite)")
# squeue/sacct job states -> the run's state while Slurm holds the task
QUEUED = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED"}
RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The Slurm backend's options (Sample Factory's names where it has them: --slurm_partition)."""
    g = parser.add_argument_group("Slurm backend (--backend slurm)")
    g.add_argument("--slurm_partition", default=None, help="partition of the jobs (sbatch --partition; default: "
                   "the cluster's default partition)")
    g.add_argument("--slurm_cpus_per_task", default=None, type=int, help="CPU cores of each run (sbatch "
                   "--cpus-per-task); unless the sweep gives --num_workers, a run gets one rollout worker per core "
                   "(per rank). Default: the cluster's (usually 1)")
    g.add_argument("--slurm_gpus_per_task", default=0, type=int, help="GPUs of each run (sbatch --gpus-per-task; "
                   "default 0)")
    g.add_argument("--slurm_time", default=None, help="time limit of each run (sbatch --time: minutes, HH:MM:SS, "
                   "D-HH:MM:SS); a run stopped by it resumes when the sweep is launched again. Default: the "
                   "partition's")
    g.add_argument("--slurm_ranks_per_task", default=1, type=int, help="data-parallel ranks of each run: > 1 runs "
                   "train.py under torchrun --standalone --nproc-per-node N inside the job (one node; "
                   "docs/distributed.md). Default 1")
    g.add_argument("--slurm_sbatch_args", default="", help="more sbatch options, as one string, e.g. "
                   "--slurm_sbatch_args=\"--account=rl --mem=16G\"")


def _options(args) -> SimpleNamespace:
    """The Slurm options of `args`, checked (SweepError: one line naming the flag)."""
    o = SimpleNamespace(partition=args.slurm_partition, cpus=args.slurm_cpus_per_task, gpus=args.slurm_gpus_per_task,
                        time=args.slurm_time, ranks=args.slurm_ranks_per_task, extra=args.slurm_sbatch_args,
                        max_parallel=args.max_parallel)
    if o.cpus is not None and o.cpus < 1:
        raise SweepError(f"--slurm_cpus_per_task {o.cpus}: give 1 or more cores")
    if o.gpus < 0:
        raise SweepError(f"--slurm_gpus_per_task {o.gpus}: give 0 or more GPUs")
    if o.ranks < 1:
        raise SweepError(f"--slurm_ranks_per_task {o.ranks}: give 1 or more ranks")
    if o.time is not None and not TIME_RE.fullmatch(o.time):
        raise SweepError(f"--slurm_time {o.time!r}: give minutes, HH:MM:SS or D-HH:MM:SS (sbatch --time)")
    if o.partition is not None and not re.fullmatch(r"[\w.,-]+", o.partition):
        raise SweepError(f"--slurm_partition {o.partition!r}: a partition name (letters, digits, _ . -)")
    if o.max_parallel is not None and o.max_parallel < 1:
        raise SweepError(f"--max_parallel {o.max_parallel}: give 1 or more runs at once")
    try:
        o.extra = shlex.split(o.extra)
    except ValueError as e:
        raise SweepError(f"--slurm_sbatch_args {o.extra!r}: {e}") from None
    own = [a for a in o.extra if re.match(r"(--array|-a|--requeue|--no-requeue|--output|-o|--open-mode)(=|$)", a)]
    if own:
        raise SweepError(f"--slurm_sbatch_args: {own[0]} is set by the launcher (one array task per run, requeued "
                         "on preemption, output in each run's launch.log)")
    return o


def task_command(run: Run, o: SimpleNamespace) -> list[str]:
    """The command of `run`'s task: train.py, or torchrun starting --slurm_ranks_per_task ranks of it; --num_workers
    is fitted to the task's cores (per rank) unless the sweep gives it."""
    argv = list(run.argv)
    if o.cpus is not None and "num_workers" not in run.explicit:
        argv += ["--num_workers", str(max(1, o.cpus // o.ranks))]
    if o.ranks == 1:
        return train_command() + argv
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={o.ranks}",
            "-m", "sf.train", *argv]


def sbatch_script(sweep: Sweep, o: SimpleNamespace, n: int, tasks_file: Path) -> str:
    """The batch script of an array of `n` tasks: the #SBATCH options, then the task wrapper."""
    sub = tasks_file.parent
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={sweep.name}",
             f"#SBATCH --array=0-{n - 1}" + (f"%{o.max_parallel}" if o.max_parallel else ""),
             "#SBATCH --requeue",  # preempted or requeued: the task runs again and train.py resumes
             "#SBATCH --ntasks=1",
             "#SBATCH --open-mode=append",
             f"#SBATCH --output={sub / 'task_%a.out'}",
             f"#SBATCH --chdir={Path.cwd()}"]
    if o.partition:
        lines.append(f"#SBATCH --partition={o.partition}")
    if o.cpus is not None:
        lines.append(f"#SBATCH --cpus-per-task={o.cpus}")
    if o.gpus:
        lines.append(f"#SBATCH --gpus-per-task={o.gpus}")
    if o.time:
        lines.append(f"#SBATCH --time={o.time}")
    lines += ["", "# each task: its run of the sweep (tasks.json), train.py's output in <exp_dir>/launch.log",
              f"exec {shlex.quote(sys.executable)} -m sf.launch.slurm {shlex.quote(str(tasks_file))} "
              '"$SLURM_ARRAY_TASK_ID"', ""]
    return "\n".join(lines)


def _client(*argv: str) -> subprocess.CompletedProcess:
    """A Slurm client command; SweepError (one line) when it is missing or slurmctld does not answer."""
    if shutil.which(argv[0]) is None:
        raise SweepError(f"Slurm is not reachable: no {argv[0]} on PATH (--backend slurm runs on a machine that can "
                         "submit jobs; --backend local runs here)")
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=CLIENT_TIMEOUT_SEC)
    except subprocess.TimeoutExpired:
        raise SweepError(f"Slurm is not reachable: {argv[0]} got no answer from slurmctld in "
                         f"{CLIENT_TIMEOUT_SEC} s") from None
    except OSError as e:
        raise SweepError(f"Slurm is not reachable: {argv[0]}: {e.strerror or e}") from None


def _last_line(r: subprocess.CompletedProcess) -> str:
    """What a failed Slurm client says: its last line (the earlier ones are the steps that led to it)."""
    lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
    return one_line(lines[-1] if lines else f"exit code {r.returncode}", 200)


def _check_reachable(partition: Optional[str] = None) -> None:
    """SweepError (one line) unless the Slurm clients are here and slurmctld answers (and knows `partition`)."""
    for prog in ("sbatch", "squeue", "scancel", "sinfo"):
        if shutil.which(prog) is None:
            _client(prog)  # raises
    r = _client("sinfo", "-h", "-o", "%P")
    if r.returncode != 0:
        raise SweepError(f"Slurm is not reachable: sinfo: {_last_line(r)}")
    known = [p.rstrip("*") for p in r.stdout.split()]
    unknown = [p for p in (partition or "").split(",") if p and p not in known]
    if unknown:
        raise SweepError(f"--slurm_partition {partition!r}: no partition {unknown[0]!r}; this cluster has: "
                         f"{', '.join(known)}")


def slurm_record(sweep: Sweep) -> dict:
    """<train_dir>/.launch/slurm.json ({} when the sweep was never submitted)."""
    try:
        data = json.loads((sweep.train_dir / LAUNCH_DIR / SLURM_JSON).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _job_states(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """'<array id>_<task>' -> (Slurm state, exit code or reason) of the sweep's array tasks that Slurm still knows:
    squeue (pending, running, and finished within MinJobAge), then sacct for the rest where accounting runs."""
    out: dict[str, tuple[str, str]] = {}
    if not job_ids:
        return out
    r = _client("squeue", "-h", "-r", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%r")
    if r.returncode != 0 and "Invalid job id" not in r.stderr:
        raise SweepError(f"Slurm is not reachable: squeue: {_last_line(r)}")
    for line in r.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            out[parts[0]] = (parts[1], parts[2])
    if shutil.which("sacct"):  # without slurmdbd sacct fails ("accounting storage is disabled"): squeue's is all
        r = subprocess.run(["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", "JobID,State,ExitCode"],
                           capture_output=True, text=True, timeout=CLIENT_TIMEOUT_SEC)
        if r.returncode == 0:
            for line in r.stdout.splitlines():
                parts = line.strip().split("|")
                if len(parts) == 3 and parts[0] not in out:
                    out[parts[0]] = (parts[1].split()[0], parts[2])
    return out


def _states(sweep: Sweep) -> list[tuple[Run, object, str, str]]:
    """[(run, RunState, Slurm's job id, Slurm's state or '')] with the run's state corrected by what Slurm says: a
    task still queued or running is that; one Slurm ended without the task recording it (killed) is interrupted."""
    rec = slurm_record(sweep)
    arrays = [s["job_id"] for s in rec.get("submissions", [])]
    by_job = _job_states(arrays)
    rows: list[tuple[Run, object, str, str]] = []
    for run in sweep.runs:
        st = run_state(run)
        launch = read_launch(run.exp_dir)
        job = launch.get("job_id") if launch.get("backend") == "slurm" else None
        slurm_state, detail = by_job.get(job, ("", "")) if job else ("", "")
        if job and st.state != "done":
            if slurm_state in QUEUED:
                st.state = "queued"
            elif slurm_state in RUNNING:
                st.state = "running"
            elif st.state in ("queued", "running"):
                # Slurm has ended it (or forgotten it) and the task did not record an end: killed (SIGKILL after
                # KillWait, a node lost) or cancelled before it started
                st.state = "failed" if slurm_state in ("FAILED", "OUT_OF_MEMORY") else "interrupted"
        rows.append((run, st, job or "", slurm_state))
    return rows


def status(sweep: Sweep, args=None, out=None) -> int:
    """Print each run's state (queued, running with frames and reward, done, failed with its last log line) as
    sf.launch.summary's table, then the Slurm task of each run that has one."""
    try:
        rows = _states(sweep)
    except SweepError as e:  # the files alone, then: a queued or running record may be stale
        rows = [(run, run_state(run), "", "") for run in sweep.runs]
        print(f"warning: {e}; the states below are the runs' files' alone", file=out)
    print(status_table(sweep, [(run.name, st) for run, st, _, _ in rows]), file=out)
    tasks = [f"{run.name} {job}" + (f" ({slurm_state})" if slurm_state else "")
             for run, _, job, slurm_state in rows if job]
    if tasks:
        print("Slurm tasks: " + ", ".join(tasks), file=out)
    return 0


def cancel(sweep: Sweep, args=None, out=None) -> int:
    """scancel every job the sweep submitted; the runs that had not started are recorded interrupted (the running
    ones record it themselves when Slurm's SIGTERM stops them)."""
    rec = slurm_record(sweep)
    jobs = [s["job_id"] for s in rec.get("submissions", [])]
    if not jobs:
        print(f"no Slurm job of the sweep in {sweep.train_dir}", file=out)
        return 0
    _check_reachable()
    active = {j for j, (s, _) in _job_states(jobs).items() if s in QUEUED | RUNNING}
    arrays = [j for j in jobs if any(t.split("_")[0] == j for t in active)]
    if not arrays:  # (scancel of an ended job is an error)
        print(f"no queued or running Slurm job of the sweep in {sweep.train_dir} (submitted: {', '.join(jobs)})",
              file=out)
        return 0
    r = _client("scancel", *arrays)
    if r.returncode != 0:
        raise SweepError(f"scancel {' '.join(arrays)}: {_last_line(r)}")
    for run in sweep.runs:
        launch = read_launch(run.exp_dir)
        if launch.get("backend") == "slurm" and launch.get("state") == "queued" and launch.get("job_id") in active:
            write_launch(run.exp_dir, state="interrupted", ended=None)
    print(f"cancelled job(s) {' '.join(arrays)}: {len(active)} task(s) were queued or running", file=out)
    return 0


def launch(sweep: Sweep, args, out=None) -> int:
    """Submit the runs not done yet as one job array (or print the script and command: --dry_run). Exit code: 0
    submitted (or nothing to do); SweepError (exit 2, nothing submitted) when Slurm cannot be reached or refuses."""
    o = _options(args)
    dry_run = bool(args.dry_run)
    todo, skipped = [], []
    for run in sweep.runs:
        st = run_state(run, read_events=False)
        if st.state == "done":
            skipped.append(f"skip {run.name}: done ({st.frames} frames)")
        elif st.state in ("queued", "running") and read_launch(run.exp_dir).get("backend") != "slurm":
            skipped.append(f"skip {run.name}: {st.state} (local launcher)")
        else:
            todo.append(run)
    if not dry_run:
        _check_reachable(o.partition)
        jobs = [s["job_id"] for s in slurm_record(sweep).get("submissions", [])]
        active = sorted(j for j, (s, _) in _job_states(jobs).items() if s in QUEUED | RUNNING)
        if active:
            raise SweepError(f"the sweep's Slurm job(s) {', '.join(active)} are still queued or running: --status "
                             "shows them, --cancel stops them")
    for line in skipped:
        print(line, file=out)
    if not todo:
        print(f"nothing to submit: {len(skipped)} run(s) skipped", file=out)
        return 0
    sub = sweep.train_dir.resolve() / LAUNCH_DIR / "slurm" / time.strftime("%Y%m%d_%H%M%S")
    n = 0
    while sub.exists():  # two launches within a second
        n += 1
        sub = sub.with_name(f"{sub.name.split('-')[0]}-{n}")
    script = sbatch_script(sweep, o, len(todo), sub / "tasks.json")
    cmd = ["sbatch", "--parsable", *o.extra, str(sub / "job.sbatch")]
    if dry_run:
        print(script, file=out)
        for i, run in enumerate(todo):
            print(f"# task {i}: {run.name}: {shlex.join(task_command(run, o))}", file=out)
        print(f"# {shlex.join(cmd)}", file=out)
        print(f"{len(todo)} run(s) as one job array, {len(skipped)} skipped; nothing submitted (--dry_run)", file=out)
        return 0
    record_runs(sweep)
    tasks = [{"name": r.name, "exp_dir": str(r.exp_dir.resolve()), "command": task_command(r, o),
              "env_vars": {str(k): str(v) for k, v in r.env_vars.items()}, "budget": r.budget,
              "num_policies": r.num_policies} for r in todo]
    sub.mkdir(parents=True)
    write_json_atomic(sub / "tasks.json", {"sweep": sweep.name, "tasks": tasks})
    write_text_atomic(sub / "job.sbatch", script)
    r = _client(*cmd)
    job_id = r.stdout.strip().split(";")[0]
    if r.returncode != 0 or not job_id.isdigit():
        shutil.rmtree(sub, ignore_errors=True)
        raise SweepError(f"sbatch refused the job array: {_last_line(r)}")
    for i, run in enumerate(todo):
        write_launch(run.exp_dir, backend="slurm", state="queued", rc=None, job_id=f"{job_id}_{i}")
    rec = slurm_record(sweep)
    rec.setdefault("submissions", []).append({"job_id": job_id, "dir": str(sub), "submitted": time.time(),
                                              "runs": [r.name for r in todo], "sbatch": cmd})
    rec.update(sweep=sweep.name, sweep_file=str(Path(sweep.path).resolve()))
    write_json_atomic(sweep.train_dir / LAUNCH_DIR / SLURM_JSON, rec)
    print(f"submitted job array {job_id}: {len(todo)} run(s) (tasks {job_id}_0..{job_id}_{len(todo) - 1}), "
          f"{len(skipped)} skipped; each run's output: <exp_dir>/{LAUNCH_LOG}; --status, --cancel", file=out)
    return 0


# --- inside a job: one array task ---
def run_task(tasks_file: str, index: int) -> int:
    """Run task `index` of a submission: exit 0 at once if its run is done, else train.py with its output appended to
    <exp_dir>/launch.log and its state in launch.json. Returns the exit code (train.py's)."""
    spec = json.loads(Path(tasks_file).read_text())["tasks"][index]
    exp_dir = Path(spec["exp_dir"])
    job_id = f"{os.environ.get('SLURM_ARRAY_JOB_ID', '?')}_{os.environ.get('SLURM_ARRAY_TASK_ID', index)}"
    attempt = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    budget, num_policies = spec.get("budget"), spec.get("num_policies", 1)

    def budget_reached() -> bool:
        return budget is not None and checkpoint_frames(exp_dir, num_policies) >= budget

    if budget_reached() or read_launch(exp_dir).get("state") == "done":
        # a finished run's task requeued (preempted after the end, scontrol requeue): nothing to run
        print(f"{spec['name']}: done already; nothing to run", flush=True)
        return 0
    cmd = list(spec["command"])
    if attempt > 0:  # a requeued task continues its run, even if the sweep's command restarts or overwrites it
        cmd += ["--restart_behavior", "resume"]
    before = read_launch(exp_dir)
    wall_before = float(before.get("wall_before") or 0.0)
    if before.get("started") is not None and before.get("ended") is not None:
        wall_before += max(0.0, float(before["ended"]) - float(before["started"]))
    exp_dir.mkdir(parents=True, exist_ok=True)
    signalled: list[int] = []
    # Slurm signals every process of the job: train.py stops itself; this wrapper only notes why it stopped
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, lambda signum, frame: signalled.append(signum))
    host = socket.gethostname()
    with open(exp_dir / LAUNCH_LOG, "ab") as log:
        log.write(f"=== Slurm job {job_id} (attempt {attempt + 1}) on {host}: {shlex.join(cmd)}\n".encode())
        log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **spec.get("env_vars", {}))
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
    write_launch(exp_dir, backend="slurm", state="running", rc=None, job_id=job_id, host=host, pid=p.pid,
                 started=time.time(), ended=None, wall_before=wall_before, attempt=attempt + 1, command=cmd)
    rc = p.wait()
    state = "done" if budget_reached() or (rc == 0 and not signalled) else \
        "interrupted" if signalled else "failed"
    write_launch(exp_dir, state=state, rc=rc, ended=time.time())
    print(f"{spec['name']}: {state} (exit code {rc})", flush=True)
    return 0 if state == "done" else (rc if rc > 0 else 128 - rc if rc < 0 else 1)


if __name__ == "__main__":
    sys.exit(run_task(sys.argv[1], int(sys.argv[2])))
