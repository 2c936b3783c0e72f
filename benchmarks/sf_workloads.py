#!/usr/bin/env python
"""Sample Factory's own workloads, here and on Sample Factory 2.1.1, in one invocation: frames/s, reward, wall time.

Workloads (Sample Factory's example commands with shorter budgets; both sides get the same flags and --seed):
  mujoco  mujoco_halfcheetah with each side's MuJoCo preset (configs/mujoco.json here, applied for mujoco_* envs;
          sf_examples/mujoco/mujoco_params.py there): synchronous PPO, [64, 64] tanh MLP.
  atari   atari_breakout with --encoder_conv_architecture resnet_impala and --batch_size 256 (sf_examples.atari).
          Ours also gets ATARI_AS_SF: the values of Sample Factory's Atari configuration (its preset and defaults)
          where configs/atari.json and our defaults differ, so that both train the same PPO.
          4 envs per worker: Sample Factory's synchronous mode (its Atari preset) collects exactly what one training
          iteration takes, 2 workers x 4 envs x rollout 128 = 4 minibatches x 256 samples, as its preset's 8 x 1 envs.
  doom    doom_battle, asynchronous APPO with each side's Doom defaults (configs/doom.json here; sf_examples.vizdoom
          there), 2 workers x 8 envs, --doom_seconds (150 by default): the speed comparison (frames/s and policy
          lag; the reward of so short a run says little). Both are stopped by SIGINT that long after their first frames.
Both: --num_workers 2 --device cpu --decorrelate_experience_max_seconds 0 (MuJoCo: --num_envs_per_worker 8).

Runs alternate per round (round 1: ours then SF, round 2: SF then ours, ...). frames/s: the median of the
10-second windows of each side's "Fps is" reports, less the first two (start-up) and the last (shutdown), and the
frames between those reports over their time ("steady": the windows of synchronous PPO alternate between collecting
and training, so their median says less than their mean). The reward is the last "Avg episode reward" of the log
(the mean of the last 100 episodes on both sides; Atari: the unclipped full-game score), else TensorBoard's
reward/reward. Sample Factory runs in its own scratch directory;
every log stays under --scratch. A run whose frame count stops growing for --stall_sec is killed and its last
error line recorded (Sample Factory waits forever when an env fails to start).

    python benchmarks/sf_workloads.py                                   # defaults: 1M MuJoCo, 300k Atari frames
    python benchmarks/sf_workloads.py --mujoco_steps 300000 --atari_steps 100000 --rounds 2
    python benchmarks/sf_workloads.py --workloads doom --rounds 3       # the speed comparison: doom_battle, 150 s each
    python benchmarks/sf_workloads.py --workloads atari --sf_python /path/to/sf-venv/bin/python
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import psutil  # noqa: E402

from common import FPS_RE, header, table  # noqa: E402
from sf.runner.stats import read_event_scalars  # noqa: E402

# Sample Factory 2.1.1's values for the Atari command (sf_examples/atari/atari_params.py and its defaults) where ours
# differ. --lr_schedule linear_decay is its preset's, but its command line refuses it (not among the choices).
ATARI_AS_SF = ["--worker_num_splits", "1", "--rollout", "128", "--num_epochs", "4", "--num_batches_per_epoch", "4",
               "--async_rl", "False", "--lr_schedule", "linear_decay", "--adam_eps", "1e-5", "--nonlinearity", "relu",
               "--normalize_returns", "True", "--shuffle_minibatches", "False", "--value_bootstrap", "False",
               "--with_vtrace", "False"]

# gymnasium 0.29 (Sample Factory 2.1.1's) finds ale-py's Atari ids only once ale_py is imported, and ale-py >= 0.11
# registers them on import only under gymnasium 1.x: every Sample Factory process imports this first.
SITECUSTOMIZE = """\
try:
    import ale_py
    import gymnasium
    if "BreakoutNoFrameskip-v4" not in gymnasium.registry:
        from ale_py.registration import register_v0_v4_envs
        register_v0_v4_envs()
except ImportError:
    pass
"""

ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
FRAMES_RE = re.compile(r"Total num frames: (\d+)")
STAMP_RE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:,(\d+))?\]")  # both sides' log line prefix
OURS_DONE_RE = re.compile(r"Done: (\d+) env frames")
SF_DONE_RE = re.compile(r"Collected \{0: (\d+)\}")
OURS_LAG_RE = re.compile(r"Policy lag \(min: [\d.na-]+, avg: ([\d.na-]+)")
SF_LAG_RE = re.compile(r"Policy #0 lag: \(min: [\d.-]+, avg: ([\d.-]+)")
OURS_REWARD_RE = re.compile(r"Avg episode reward: ([-\d.]+) \((\d+) episodes\)")
SF_REWARD_RE = re.compile(r"Avg episode reward: \[\(0, '([-\d.]+)'\)\]")
ERROR_RE = re.compile(r"(\w*(?:Error|Exception|error)\b.*)$")


def workloads(args) -> dict[str, dict]:
    """name -> the module Sample Factory runs, the flags both sides get, and ours' extra flags."""
    both = ["--num_workers", str(args.num_workers), "--seed", str(args.seed), "--device", "cpu",
            "--decorrelate_experience_max_seconds", "0"]
    return {
        "mujoco": {"module": "sf_examples.mujoco.train_mujoco", "ours_extra": [],
                   "flags": ["--env", "mujoco_halfcheetah", "--train_for_env_steps", str(args.mujoco_steps),
                             "--num_envs_per_worker", str(args.num_envs_per_worker), *both]},
        "atari": {"module": "sf_examples.atari.train_atari", "ours_extra": ATARI_AS_SF,
                  "flags": ["--env", args.atari_env, "--encoder_conv_architecture", "resnet_impala",
                            "--batch_size", "256", "--num_envs_per_worker", str(args.atari_envs_per_worker),
                            "--train_for_env_steps", str(args.atari_steps), *both]},
        "doom": {"module": "sf_examples.vizdoom.train_vizdoom", "ours_extra": [],
                 "seconds": args.doom_seconds,
                 "flags": ["--env", args.doom_env, "--num_envs_per_worker", str(args.doom_envs_per_worker), *both]},
    }


def sf_environment(scratch: Path) -> dict:
    """The environment of Sample Factory's runs: SITECUSTOMIZE first on their path (written to scratch/sf/shim)."""
    (scratch / "sf" / "shim").mkdir(parents=True, exist_ok=True)
    (scratch / "sf" / "shim" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(scratch / "sf" / "shim"),
                                                                     os.environ.get("PYTHONPATH")])))


def stop_session(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """SIGINT the process group of `proc` (a run started in its own session) if it still runs, SIGKILL it after
    `grace` seconds; then every process left in the group (engines, workers) is killed, and what the session's
    processes leave in /dev/shm is removed."""
    session = session_processes(proc.pid)  # (its main process, once it has exited, is not found below)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=grace)
        except (ProcessLookupError, subprocess.TimeoutExpired, KeyboardInterrupt):  # a second Ctrl-C: kill at once
            pass
    session.update(session_processes(proc.pid))
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in session_processes(proc.pid):  # in process groups of their own (our fork server's)
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()
    remove_shm_of(session)


def session_processes(sid: int) -> dict[int, list[str]]:
    """pid -> command line of every live process of session `sid` (a run started with start_new_session)."""
    found = {}
    for p in psutil.process_iter(["cmdline"]):
        try:
            if os.getsid(p.pid) == sid:
                found[p.pid] = p.info["cmdline"] or []
        except (ProcessLookupError, PermissionError):
            pass
    return found


def remove_shm_of(processes: dict[int, list[str]]) -> None:
    """Remove what these (killed) processes leave in /dev/shm: Sample Factory shares its tensors with torch's
    file_system strategy (/dev/shm/torch_<pid>_*, freed by torch_shm_manager, which its session's SIGKILL kills too)
    and VizDoom engines' files (their hosts never closed the games)."""
    from sf_envs.doom.engine_shm import engine_shm_files
    alive = []
    for pid in processes:
        try:
            alive.append(psutil.Process(pid))
        except psutil.NoSuchProcess:  # (gone already; checking pid_exists first would race with its exit)
            pass
    psutil.wait_procs(alive, timeout=10)
    files = [f for cmdline in processes.values() for f in engine_shm_files(cmdline)]
    files += [f for pid in processes for f in Path("/dev/shm").glob(f"torch_{pid}_*")]
    for f in files:
        f.unlink(missing_ok=True)


def run(cmd: list[str], cwd: Path, log_path: Path, stall_sec: float, env: dict | None = None,
        seconds: float | None = None, frames_re: re.Pattern = FRAMES_RE) -> dict:
    """Run cmd to the end (its output into log_path); kill its process group when its frame count (`frames_re`'s
    number in its output) stops growing. seconds: SIGINT its process group this long after its first frames (both
    sides stop on it with a final checkpoint; Sample Factory's --train_for_seconds counts only the time up to its last
    checkpoint save, so a short run would go on, and its start-up takes from 15 s to over a minute on a loaded
    machine)."""
    t0 = time.time()
    interrupted, first_frames = False, None
    frames, progress_at, loads, stalled = -1, t0, [], False
    with open(log_path, "w") as log:
        # SIGINT back to its default in the child: started from a background job, this script inherits it ignored,
        # and Python then installs no KeyboardInterrupt handler (Sample Factory stops on KeyboardInterrupt)
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            while proc.poll() is None:
                time.sleep(2)
                loads.append(os.getloadavg()[0])
                seen = max([int(x) for x in frames_re.findall(log_path.read_text(errors="replace"))] or [0])
                if seen > 0 and first_frames is None:
                    first_frames = time.time()
                if seconds is not None and not interrupted and first_frames and time.time() - first_frames > seconds:
                    os.killpg(proc.pid, signal.SIGINT)
                    interrupted, progress_at = True, time.time()
                if seen > frames:
                    frames, progress_at = seen, time.time()
                elif time.time() - progress_at > stall_sec:
                    stop_session(proc, grace=0.0)  # its own session: the run's workers go with it
                    stalled = True
        finally:  # this script stopped (Ctrl-C, SIGTERM, an error): the run in its own session would go on alone
            stop_session(proc)
    return {"rc": proc.returncode, "stalled": stalled, "interrupted": interrupted, "wall": time.time() - t0,
            "log": ANSI_RE.sub("", log_path.read_text(errors="replace")),
            "load": statistics.mean(loads) if loads else os.getloadavg()[0]}


def steady_fps(log: str) -> tuple[float, float]:
    """(median of the steady 10-s windows, frames per second between the first and the last steady report)."""
    reports = []  # (seconds, total frames, 10-s window) of each "Fps is" report with a window
    for line in log.splitlines():
        fps, frames, stamp = FPS_RE.search(line), FRAMES_RE.search(line), STAMP_RE.search(line)
        if fps and frames and stamp and fps.group(1) != "nan":
            t = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")) + float(f"0.{stamp.group(2) or 0}")
            reports.append((t, int(frames.group(1)), float(fps.group(1))))
    steady = reports[2:-1] if len(reports) > 4 else reports
    if not steady:
        return float("nan"), float("nan")
    (t0, f0, _), (t1, f1, _) = steady[0], steady[-1]
    return statistics.median(r[2] for r in steady), (f1 - f0) / (t1 - t0) if t1 > t0 else float("nan")


def parse(side: str, result: dict, summary_dir: Path) -> dict:
    """frames, steady frames/s, final average reward and an error line out of a run's log (and TensorBoard)."""
    log = result["log"]
    done = (OURS_DONE_RE if side == "ours" else SF_DONE_RE).findall(log) or FRAMES_RE.findall(log)
    frames = int(done[-1]) if done else 0
    rewards = (OURS_REWARD_RE if side == "ours" else SF_REWARD_RE).findall(log)
    reward = float(rewards[-1][0] if side == "ours" else rewards[-1]) if rewards else float("nan")
    if rewards == [] and summary_dir.exists():
        points = read_event_scalars(summary_dir).get("reward/reward", [])
        reward = points[-1][1] if points else reward
    error = ""
    # (Sample Factory exits with 2 when SIGINT stops it: a stop we asked for is no error)
    if (result["rc"] != 0 and not result.get("interrupted")) or result["stalled"]:
        errors = [m.group(1) for line in log.splitlines() if (m := ERROR_RE.search(line.strip()))]
        lines = [line for line in log.splitlines() if line.strip()]
        error = (f"stalled {result['rc']}: " if result["stalled"] else f"exit {result['rc']}: ") + \
            (errors[-1] if errors else lines[-1] if lines else "no output")[:160]
    fps, steady = steady_fps(log)
    lags = [float(x) for x in (OURS_LAG_RE if side == "ours" else SF_LAG_RE).findall(log) if x not in ("nan", "-1.0")]
    lag = statistics.mean(lags[2:] if len(lags) > 4 else lags) if lags else float("nan")  # steady reports
    return {"frames": frames, "lag": lag, "fps": fps, "steady": steady, "overall": frames / result["wall"],
            "reward": reward, "wall": result["wall"], "load": result["load"], "error": error}


def fmt(x: float, digits: int = 0) -> str:
    return "n/a" if x != x else f"{x:.{digits}f}"


def ratio(a: float, b: float) -> str:
    return fmt(a / b, 2) if b and b == b else "n/a"


def main() -> None:
    # SIGTERM as SystemExit: the `finally` of run() then stops the run it started (in its own session)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sf_python", default=str(ROOT / ".venv-sf" / "bin" / "python"),
                    help="a Python with sample-factory 2.1.1 (and mujoco, ale-py) installed")
    ap.add_argument("--workloads", nargs="+", default=["mujoco", "atari"], choices=["mujoco", "atari", "doom"])
    ap.add_argument("--mujoco_steps", type=int, default=1_000_000, help="env frames of the MuJoCo workload")
    ap.add_argument("--atari_steps", type=int, default=300_000, help="env frames (frameskip included) of the Atari "
                    "workload")
    ap.add_argument("--atari_env", default="atari_breakout")
    ap.add_argument("--doom_env", default="doom_battle")
    ap.add_argument("--doom_envs_per_worker", type=int, default=8)
    ap.add_argument("--doom_seconds", type=int, default=150, help="seconds of each Doom run (then SIGINT)")
    ap.add_argument("--num_workers", type=int, default=2)
    ap.add_argument("--num_envs_per_worker", type=int, default=8, help="MuJoCo's (both presets': 8)")
    ap.add_argument("--atari_envs_per_worker", type=int, default=4, help="Atari's: Sample Factory's synchronous "
                    "mode needs num_workers x this x 128 to be a multiple of 4 x 256")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1, help="ours/SF pairs per workload, alternating who goes first")
    ap.add_argument("--stall_sec", type=float, default=300.0, help="kill a run whose frame count stays the same "
                    "this long")
    ap.add_argument("--ours_extra", nargs=argparse.REMAINDER, default=[], help="last: more train.py flags, ours "
                    "only (e.g. --learner_torch_threads 1: Sample Factory's learner runs one torch thread)")
    ap.add_argument("--scratch", default=None, help="directory for the runs (logs, train dirs); default: a new "
                    "one under /tmp, kept")
    args = ap.parse_args()
    if not Path(args.sf_python).exists():
        print(f"--sf_python: {args.sf_python} does not exist; give a Python with sample-factory 2.1.1 installed",
              file=sys.stderr)
        sys.exit(2)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="sf_workloads_"))
    sf_env = sf_environment(scratch)
    header("Sample Factory's workloads: this implementation and Sample Factory 2.1.1")
    print(f"scratch (logs, train dirs): {scratch}\n")
    specs = {name: dict(spec, ours_extra=spec["ours_extra"] + args.ours_extra)
             for name, spec in workloads(args).items() if name in args.workloads}
    for name, spec in specs.items():
        print(f"{name}, ours (cwd {ROOT}):\n  {sys.executable} train.py --experiment {name}_rN --train_dir "
              f"{scratch / 'ours'} --restart_behavior overwrite {shlex.join(spec['flags'] + spec['ours_extra'])}")
        print(f"{name}, Sample Factory (cwd {scratch / 'sf'}, PYTHONPATH={scratch / 'sf' / 'shim'}):\n  "
              f"{args.sf_python} -m {spec['module']} --experiment {name}_rN --train_dir {scratch / 'sf' / 'td'} "
              f"{shlex.join(spec['flags'])}\n")
    results: dict[tuple[str, str], list[dict]] = {}
    rows = []
    for r in range(1, args.rounds + 1):
        for name, spec in specs.items():
            for side in ("ours", "sf") if r % 2 else ("sf", "ours"):
                exp = f"{name}_r{r}"
                if side == "ours":
                    cmd = [sys.executable, str(ROOT / "train.py"), "--experiment", exp, "--train_dir",
                           str(scratch / "ours"), "--restart_behavior", "overwrite", *spec["flags"],
                           *spec["ours_extra"]]
                    out = run(cmd, ROOT, scratch / f"ours_{exp}.log", args.stall_sec, seconds=spec.get("seconds"))
                    res = parse(side, out, scratch / "ours" / exp)
                else:
                    cmd = [args.sf_python, "-m", spec["module"], "--experiment", exp, "--train_dir",
                           str(scratch / "sf" / "td"), *spec["flags"]]
                    out = run(cmd, scratch / "sf", scratch / f"sf_{exp}.log", args.stall_sec, sf_env,
                              seconds=spec.get("seconds"))
                    res = parse(side, out, scratch / "sf" / "td" / exp / ".summary" / "0")
                results.setdefault((name, side), []).append(res)
                rows.append([r, name, "ours" if side == "ours" else "SF 2.1.1", res["frames"], fmt(res["wall"]),
                             fmt(res["fps"]), fmt(res["steady"]), fmt(res["reward"], 1), fmt(res["lag"], 1),
                             fmt(res["load"], 1), res["error"]])
                print(f"round {r} {name} {side}: {rows[-1][3:]}", flush=True)
    print("\n" + table(rows, ["round", "workload", "side", "env frames", "wall s", "frames/s (median 10-s)",
                              "frames/s (steady)", "avg episode reward", "policy lag avg", "load avg (1-min, mean)",
                              "error"]))
    ratio_rows = []
    for name in specs:
        ours, sf = results[(name, "ours")], results[(name, "sf")]

        def med(side: list[dict], key: str) -> float:
            values = [x[key] for x in side if not x["error"] and x[key] == x[key]]
            return statistics.median(values) if values else float("nan")

        ratio_rows.append([name, ratio(med(ours, "fps"), med(sf, "fps")), ratio(med(ours, "steady"), med(sf, "steady")),
                           ratio(med(ours, "overall"), med(sf, "overall")), ratio(med(ours, "wall"), med(sf, "wall")),
                           f"{fmt(med(ours, 'reward'), 1)} vs {fmt(med(sf, 'reward'), 1)}",
                           f"{fmt(med(ours, 'lag'), 1)} vs {fmt(med(sf, 'lag'), 1)}",
                           " ".join(ratio(o["fps"], s["fps"]) for o, s in zip(ours, sf))])
    print("\nRatios ours/SF (medians over rounds):\n" + table(
        ratio_rows, ["workload", "frames/s (median 10-s)", "frames/s (steady)", "frames / wall", "wall time",
                     "avg episode reward, ours vs SF", "policy lag avg, ours vs SF",
                     "frames/s ratio per round (median 10-s)"]))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("sf_workloads: interrupted (the run in progress was stopped; finished rounds' logs are in --scratch)")
