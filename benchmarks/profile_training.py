"""Where every core-second of a full training run goes, per env frame, and the learner against its limit.

    python benchmarks/profile_training.py                        # doom_battle, 2 workers x 8 envs, cpu, 150 s
    python benchmarks/profile_training.py --duration 300 --skip 60 -- --worker_num_splits 1   # -- train.py flags

Runs `train.py --env doom_battle --num_workers 2 --num_envs_per_worker 8 --device cpu` (plus any train.py flags given)
for --duration seconds with SF_PROFILE set (sf/learning/phase_timing.py: the learner's phase times), and over a steady
window (from the first console report after --skip seconds of start-up to the first one after --duration) prints the
CPU seconds of each kind of process per env frame (microseconds) and their share of the machine's core-seconds:

- CPU time: utime + stime of /proc/<pid>/stat (every thread of the process, live or exited), at the window's start and
  end. Processes are found below the runner (the train.py process) by their names (sf.processes.control.process_title:
  sf:rollout_3, sf:policy_0, sf:learner, sf:fork_server); each env's engine (a VizDoom process) is a child of its
  rollout worker. A process that started inside the window counts whole; one that ended inside it is lost (counted).
- learner phases: its /proc CPU split in the proportions of the hook's phase CPU over the same window (the hook's file
  is rewritten after each training batch: its window is within one batch of this one's);
- the rest of the machine: /proc/stat's busy time not in this run's processes (other programs), and its idle time.
- frames: the env frames collected in the window (the console reports' "Total num frames").

Then the learner's samples/s in training (trained samples over the window; and over its time not spent waiting for a
batch) against its limit: APPO.train on a batch of the run's shape (its config: batch size, rollout, the model of
configs/*.json; episode ends at the rate the run's reports show) in a tight loop with the learner's torch threads, in
this process after the run ended (the timing loop of benchmarks/learner_step.py). The target is a ratio of at least 0.8.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402
import torch  # noqa: E402

from common import ROOT, header, table  # noqa: E402
from learner_step import timeit  # noqa: E402

FRAMES_RE = re.compile(r"Total num frames: (\d+)")
EPISODES_RE = re.compile(r"\((\d+) episodes\)")
HZ = os.sysconf("SC_CLK_TCK")
KINDS = (("sf:rollout", "rollout workers (Python)"), ("sf:policy", "policy workers"), ("sf:learner", "learner"),
         ("sf:fork_server", "fork server"))
ENGINES = "env engines (children of the rollout workers)"
# learner phases (sf/learning/appo.py, batcher.py, batch_schedule.py), in the order of one training batch
PHASES = ("copy", "wait_trajectories", "wait_batch", "prepare", "forward", "targets", "backward", "optimizer", "stats",
          "publish", "report")
PHASE_TEXT = {"copy": "batch copied out of the trajectory buffers",
              "wait_trajectories": "batcher: queue waits, wake-ups",
              "wait_batch": "main thread: waits for a batch", "prepare": "normalizer update",
              "forward": "forward", "targets": "targets (V-trace/GAE) + loss", "backward": "backward",
              "optimizer": "optimizer step + grad clipping", "stats": "step statistics",
              "publish": "weight publishing", "report": "report, checkpoints"}


def proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) of `pid`, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / HZ  # utime, stime: fields 14, 15 of proc(5)
    except (OSError, IndexError, ValueError):
        return None


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) core-seconds of the whole machine since boot (/proc/stat; idle includes iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(v) - v[3] - v[4]) / HZ, (v[3] + v[4]) / HZ


def run_processes(runner_pid: int) -> dict[int, tuple[str, float]]:
    """pid -> (kind, create time) of the runner and everything below it."""
    try:
        runner = psutil.Process(runner_pid)
        below = runner.children(recursive=True)
    except psutil.Error:
        return {}
    out, rollout = {runner_pid: ("runner (train.py)", runner.create_time())}, []
    for p in below:
        try:
            comm = p.name()
            kind = next((k for prefix, k in KINDS if comm.startswith(prefix)), f"other run processes ({comm})")
            out[p.pid] = (kind, p.create_time())
            if kind == KINDS[0][1]:
                rollout.append(p)
        except psutil.Error:
            pass
    for w in rollout:
        try:
            for e in w.children(recursive=True):
                out[e.pid] = (ENGINES, out.get(e.pid, ("", e.create_time()))[1])
        except psutil.Error:
            pass
    return out


def snapshot(runner_pid: int, profile: Path, frames: int) -> dict:
    procs = run_processes(runner_pid)
    try:
        hook = json.loads(profile.read_text())
    except (OSError, ValueError):
        hook = None
    return {"time": time.monotonic(), "machine": machine_cpu(), "frames": frames, "hook": hook,
            "procs": {pid: (kind, created, proc_cpu(pid)) for pid, (kind, created) in procs.items()}}


def cpu_by_kind(start: dict, end: dict) -> tuple[dict[str, float], int]:
    """CPU seconds per kind over the window, and how many processes ended inside it (their CPU there is lost)."""
    kinds: dict[str, float] = {}
    for pid, (kind, created, cpu) in end["procs"].items():
        if cpu is None:
            continue
        before = start["procs"].get(pid)
        same = before is not None and before[1] == created and before[2] is not None
        kinds[kind] = kinds.get(kind, 0.0) + cpu - (before[2] if same else 0.0)
    lost = sum(1 for pid, (_, created, _) in start["procs"].items()
               if pid not in end["procs"] or end["procs"][pid][1] != created)
    return kinds, lost


def phase_delta(start: dict, end: dict) -> dict:
    a, b = start["hook"], end["hook"]
    zero = {"wall": 0.0, "cpu": 0.0, "count": 0}
    return {"time": b["time"] - a["time"], "cpu": b["cpu"] - a["cpu"], "samples": b["samples"] - a["samples"],
            "batches": b["batches"] - a["batches"],
            "phases": {k: {f: v[f] - a["phases"].get(k, zero)[f] for f in ("wall", "cpu", "count")}
                       for k, v in b["phases"].items()}}


def fake_batch(cfg, model, obs_space, action_space, done_rate: float) -> dict:
    """A training batch of the run's shape (storage layout, sf.buffers.trajectory_buffers) as the learner copies it
    out: random observations and behaviour-policy outputs, episode ends at the run's rate per step (`done_rate`: the
    recurrent core runs one segment between steps where any trajectory ended, so their number sets its cost), no
    time limits."""
    from sf.buffers.trajectory_buffers import TrajectoryBuffers
    n, t = cfg.batch_size * cfg.num_batches_per_epoch // cfg.rollout, cfg.rollout
    b = TrajectoryBuffers(n, t, obs_space, action_space, model.rnn_state_size)
    g = torch.Generator().manual_seed(0)
    for obs in (*b.obs.values(), *b.final_obs.values()):
        if obs.dtype == torch.uint8:
            obs.copy_(torch.randint(0, 256, obs.shape, dtype=torch.uint8, generator=g))
        else:
            obs.copy_(torch.randn(obs.shape, generator=g).to(obs.dtype))
    b.rnn_states.copy_(torch.randn(b.rnn_states.shape, generator=g) * 0.1)
    b.action_logits.copy_(torch.randn(b.action_logits.shape, generator=g))
    dist = model.action_distribution(b.action_logits)
    actions = dist.sample()
    b.actions.copy_(actions.reshape(b.actions.shape))
    b.log_probs.copy_(dist.log_prob(actions))
    b.values.copy_(torch.randn(b.values.shape, generator=g))
    b.rewards.copy_(torch.randn(b.rewards.shape, generator=g))
    b.dones.copy_((torch.rand(b.dones.shape, generator=g) < done_rate).float())
    for tensor, value in ((b.policy_versions, 0), (b.policy_ids, 0), (b.truncated, 0.0), (b.final_t, -1),
                          (b.final_rnn, 0.0)):
        tensor.fill_(value)
    return b.gather(torch.arange(n), "cpu")


def learner_limit(cfg, iters: int, done_rate: float) -> tuple[float, int, float, float]:
    """APPO.train on a batch of the run's shape in a tight loop, on the learner's torch threads: (samples/s, torch
    threads, CPU seconds per batch, the share of the machine's core-seconds other programs used meanwhile: OpenMP
    threads that wait for each other spin, so that a busy machine slows a multi-threaded step far more than its
    share)."""
    from sf.learning.appo import APPO
    from sf.learning.learner import learner_threads
    from sf.model.actor_critic import create_actor_critic, run_precision
    from sf.processes.control import limit_threads
    from sf.runner.startup.preflight import probe_env
    threads = learner_threads(cfg)
    limit_threads(threads)
    obs_space, action_space = probe_env(cfg)[:2]
    torch.manual_seed(0)
    model = create_actor_critic(cfg, obs_space, action_space)
    # (the learner's own precision, as Learner.__init__'s)
    appo = APPO(run_precision(cfg, model, "cpu", cfg.mode.deterministic), cfg, "cpu")
    exp = fake_batch(cfg, model, obs_space, action_space, done_rate)
    samples = exp["rewards"].numel()
    machine0, cpu0 = machine_cpu(), time.process_time()
    sec = timeit(lambda: appo.train(exp, 0), warmup=1, iters=iters)
    machine1, own = machine_cpu(), time.process_time() - cpu0
    busy, idle = machine1[0] - machine0[0], machine1[1] - machine0[1]
    return samples / sec, threads, own / (iters + 1), max(busy - own, 0.0) / max(busy + idle, 1e-9)


def watch(proc: subprocess.Popen, lines: list, reports: queue.Queue) -> None:
    """Keep the run's output; put (monotonic time, total frames, episodes ended so far) for each console report."""
    for line in proc.stdout:
        lines.append(line)
        m = FRAMES_RE.search(line)
        if m:
            e = EPISODES_RE.search(line)
            reports.put((time.monotonic(), int(m.group(1)), int(e.group(1)) if e else 0))
    reports.put(None)


def fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="doom_battle")
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--num_envs_per_worker", type=int, default=8)
    p.add_argument("--duration", type=float, default=150.0, help="seconds of training (start-up included)")
    p.add_argument("--skip", type=float, default=30.0, help="seconds of start-up left out of the window")
    p.add_argument("--limit_iters", type=int, default=5, help="timed training batches of the learner's limit")
    p.add_argument("--train_dir", default="/tmp/profile_training")
    p.add_argument("train_flags", nargs="*", help="more train.py flags (after --)")
    args = p.parse_args()
    if args.skip <= 0 or args.duration <= args.skip:
        p.error(f"--duration ({args.duration:g}) must be longer than --skip ({args.skip:g}), and --skip positive")
    train_args = ["--env", args.env, "--num_workers", str(args.num_workers), "--num_envs_per_worker",
                  str(args.num_envs_per_worker), "--device", "cpu", "--experiment", "profile", "--train_dir",
                  args.train_dir, "--restart_behavior", "overwrite", *args.train_flags]
    from sf.cfg.parse import parse_cfg
    from sf_envs.registry import env_spec
    from sf.utils.errors import ConfigError
    try:
        cfg = parse_cfg(train_args)  # bad train.py flags: refused before anything starts
    except ConfigError as e:
        print(f"profile_training.py: train.py flags: {e}", file=sys.stderr)
        sys.exit(2)

    header("where the CPU goes in full training, per env frame")
    print("train.py " + " ".join(train_args))
    profile = Path(args.train_dir) / "learner_profile.json"
    profile.parent.mkdir(parents=True, exist_ok=True)
    profile.unlink(missing_ok=True)
    env = dict(os.environ, SF_PROFILE=str(profile), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *train_args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    reports: queue.Queue = queue.Queue()
    threading.Thread(target=watch, args=(proc, lines, reports), daemon=True).start()
    t0, start, end = time.monotonic(), None, None
    try:
        while end is None:
            report = reports.get(timeout=max(60.0, args.duration))
            if report is None:
                break
            at, frames, episodes = report
            if start is None and at - t0 >= args.skip:
                start = {**snapshot(proc.pid, profile, frames), "episodes": episodes}
            elif start is not None and at - t0 >= args.duration:
                end = {**snapshot(proc.pid, profile, frames), "episodes": episodes}
    except queue.Empty:
        pass
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # the runner stops its workers in order
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()  # its workers die with it (parent-death signal)
                proc.wait()
    if end is None:
        sys.exit("the run gave no steady window (did it end or stall early?); its output ends:\n"
                 + "".join(lines[-40:]))

    window, frames = end["time"] - start["time"], end["frames"] - start["frames"]
    kinds, lost = cpu_by_kind(start, end)
    machine = [e - s for e, s in zip(end["machine"], start["machine"])]
    machine_total = sum(machine)
    ours = sum(kinds.values())
    print(f"window: {window:.0f} s from {args.skip:g} s after the start; {frames:,} env frames "
          f"({frames / window:,.0f} frames/s); machine: {machine_total:.0f} core-seconds on {os.cpu_count()} cores"
          + (f"; {lost} process(es) of the run ended inside the window (their CPU there is not counted)"
             if lost else ""))

    hook = phase_delta(start, end) if start["hook"] and end["hook"] else None
    learner_cpu = kinds.pop("learner", 0.0)
    rows = []

    def row(name: str, sec: float) -> None:
        rows.append([name, fmt(sec * 1e6 / max(frames, 1), 1), f"{sec / machine_total:.1%}", fmt(sec, 1)])

    order = [ENGINES, "rollout workers (Python)", "policy workers"]
    for kind in order:
        if kind in kinds:
            row(kind, kinds[kind])
    row("learner (all)", learner_cpu)
    if hook and hook["cpu"] > 0:
        scale = learner_cpu / hook["cpu"]  # the hook's window -> this window
        for name in [*PHASES, *sorted(set(hook["phases"]) - set(PHASES))]:
            if name in hook["phases"]:
                row(f"  learner: {PHASE_TEXT.get(name, name)}", hook["phases"][name]["cpu"] * scale)
        row("  learner: outside the phases", (hook["cpu"] - sum(v["cpu"] for v in hook["phases"].values())) * scale)
    for kind in sorted(k for k in kinds if k not in order):  # the runner, the fork server, multiprocessing's helpers
        row(kind, kinds[kind])
    row("all of this run", ours)
    row("other programs on the machine", max(machine[0] - ours, 0.0))
    row("idle", machine[1])
    print()
    print(table(rows, ["process kind", "CPU us / env frame", "share of machine", "CPU s"]))

    if not hook or hook["batches"] <= 0:
        print("\nthe learner trained no batch in the window (or wrote no SF_PROFILE file): no learner figures")
        return
    batches = hook["batches"]
    print(f"\nlearner: {batches} training batches in {hook['time']:.0f} s; wall ms per batch by phase:")
    print(table([[PHASE_TEXT.get(k, k), fmt(v["wall"] * 1e3 / batches, 0), fmt(v["cpu"] * 1e3 / batches, 0)]
                 for k, v in sorted(hook["phases"].items(), key=lambda kv: PHASES.index(kv[0])
                                    if kv[0] in PHASES else len(PHASES))],
                ["phase", "wall ms / batch", "CPU ms / batch (hook)"]))
    rate = hook["samples"] / hook["time"]
    training = sum(v["wall"] for k, v in hook["phases"].items() if k in PHASES[3:])  # the main thread, not waiting
    busy_rate = hook["samples"] / training if training > 0 else float("nan")
    print(f"\nlearner limit: APPO.train in a tight loop, batch {cfg.batch_size * cfg.num_batches_per_epoch} samples "
          f"(rollout {cfg.rollout}), {cfg.encoder_conv_architecture}, after the run ...", flush=True)
    steps = frames / max(env_spec(cfg.env, cfg).frameskip, 1)  # agent steps of the window
    done_rate = min(max((end["episodes"] - start["episodes"]) / max(steps, 1.0), 0.0), 1.0)
    print(f"(its batch: episode ends at the run's rate, {done_rate:.4f} per step)")
    limit, threads, limit_cpu, others = learner_limit(cfg, args.limit_iters, done_rate)
    batch_cpu = learner_cpu / batches  # (the hook's window is within a batch of the /proc one)
    print(table([["in training (trained samples / window)", fmt(rate), f"{rate / limit:.2f}", f"{batch_cpu:.3f}"],
                 ["in training, its time not waiting for a batch", fmt(busy_rate), f"{busy_rate / limit:.2f}", ""],
                 [f"limit (tight loop, {threads} torch threads)", fmt(limit), "1.00", f"{limit_cpu:.3f}"]],
                ["learner", "samples/s", "/ limit (target >= 0.80)", "CPU s / batch"]))
    if others > 0.1:
        print(f"note: other programs used {others:.0%} of the machine while the limit was measured: it is low (it "
              "shared the cores; several torch threads also spin waiting for each other); measure on a quiet machine")


if __name__ == "__main__":
    main()
