"""Measuring what one sample costs in each engine of a run on this machine (the measurements: sf.autolayout's
docstring), the check run of a layout (a short train.py run and its steady frames/s), and train.py --num_workers auto:
the cached layout, or one measured now in a spawned child process."""
from __future__ import annotations

import math
import multiprocessing as mp
import re
import statistics
import subprocess
import sys
import time
from queue import Empty
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from sf.autolayout.cache import cache_path, cached_layout, layout_key, save
from sf.autolayout.model import LAYOUT_KEYS, Layout, Measurements, batch_sizes, choose, predict
from sf.cfg import ConfigError, RunError, resolve_device
from sf.processes.control import bind_device, usable_cores

if TYPE_CHECKING:
    from sf.cfg.config import Config

ENV_COUNTS = (1, 2, 4, 8, 16)  # envs per process measured
FORWARD_ROWS = (1, 2, 4, 8, 16, 32, 64)  # policy forward batch sizes measured
QUICK_SECONDS = 40.0  # train.py --num_workers auto without a cached layout: measuring takes about this long


def _spaces_and_envs(cfg: Config, count: int):
    from sf_envs.registry import env_spec, make_env
    spec = env_spec(cfg.env, cfg)
    envs = []
    try:
        for i in range(count):
            envs.append(make_env(cfg, env_index=i))
    except BaseException:
        for env in envs:
            env.close()
        raise
    return spec, envs


def measure_envs(envs, counts, seconds_each: float, multiagent: bool) -> tuple[dict, float]:
    """(counts -> seconds per env step of stepping the first k envs in turn with random actions (one process), the
    episode ends per step seen meanwhile)."""
    import numpy as np
    space = envs[0].action_space
    agents = getattr(envs[0], "num_agents", 1) if multiagent else 1
    actions = [[space.sample() for _ in range(agents)] if multiagent else space.sample() for _ in range(256)]
    for env in envs:
        env.reset()
    out, n, ends = {}, 0, 0
    for k in counts:
        chunks, t_end = [], time.perf_counter() + seconds_each
        while not chunks or time.perf_counter() < t_end:  # chunks of about 50 ms: a robust_time of them
            steps, t0 = 0, time.perf_counter()
            while steps < k or time.perf_counter() - t0 < 0.05:
                for env in envs[:k]:
                    _, _, terminated, truncated, _ = env.step(actions[n % 256])
                    n += 1
                    steps += 1
                    if not multiagent and (terminated or truncated):
                        ends += 1
                        env.reset()
                    elif multiagent:
                        ends += int(np.sum(terminated)) if np.ndim(terminated) else int(terminated)
            chunks.append((time.perf_counter() - t0) / steps)
        out[k] = robust_time(chunks)
    return out, ends / max(n * agents, 1)


def measure_sampling(cfg: Config, obs_space, action_space, envs: int, device: str,
                     seconds: float) -> tuple[float, float, int]:
    """The sampling stage stepped in this process: one real rollout worker (sf.sampling.rollout_worker) of `envs` envs
    and one real policy worker over real shared buffers and queues, the learner's part done by recycling full slots.
    Returns (the rollout worker's seconds per sample outside its env steps, the policy worker's seconds per call
    outside the forward, rows per call): the Python of each, timed around the env steps and forwards it makes."""
    import torch
    from sf.buffers.shared_weights import SharedWeights
    from sf.buffers.trajectory_buffers import TrajectoryBuffers
    from sf.ipc import Queue
    from sf.model.actor_critic import create_actor_critic
    from sf.processes.shared_state import SharedState
    from sf.sampling.policy_worker import PolicyWorker
    from sf.sampling.rollout_worker import RolloutWorker
    from sf_envs.registry import env_spec
    c = cfg.replace(num_workers=1, num_envs_per_worker=envs, worker_num_splits=1, num_policies=1, sync_mode="async")
    agents = env_spec(cfg.env, cfg).num_agents
    model = create_actor_critic(c, obs_space, action_space)
    n = 2 * envs * agents
    buffers = TrajectoryBuffers(n, c.rollout, obs_space, action_space, model.rnn_state_size)
    weights = SharedWeights(model)
    weights.publish(model, 0)
    state = SharedState(1, num_slots=n)
    env_slots = torch.zeros((1, envs * agents, 2), dtype=torch.int64).share_memory_()
    q = SimpleNamespace(policy=Queue(), workers=[Queue()], learner=Queue(), free=Queue(), report=Queue(2**22))
    q.free.put_many(list(range(n)))
    worker = None
    try:
        policy = PolicyWorker(c, obs_space, action_space, buffers, env_slots, q, weights, device, shared_state=state)
        policy.wait_for_weights(lambda: False)
        worker = RolloutWorker(c, 0, buffers, env_slots, SimpleNamespace(
            policy=q.policy, worker=q.workers[0], learner=q.learner, free=q.free, report=q.report), state)
        worker.start()
        inner = [0.0, 0.0]  # seconds inside the env steps, inside the forward
        for env in worker.envs:
            env.step = _timing(env.step, inner, 0)
        policy.model.forward_step = _timing(policy.model.forward_step, inner, 1)
        t_policy = t_worker = 0.0
        calls = rows = 0
        warm = False
        t_end = time.perf_counter() + seconds
        while calls < 3 or time.perf_counter() < t_end:
            t0 = time.perf_counter()
            served = policy.run_once(timeout=1.0)
            t1 = time.perf_counter()
            worker.run_once(timeout=1.0)
            t2 = time.perf_counter()
            if served and not warm:  # the first call of each warms up
                warm, inner[:] = True, [0.0, 0.0]
            elif served:
                t_policy, t_worker, calls, rows = t_policy + t1 - t0, t_worker + t2 - t1, calls + 1, rows + served
            for slot in _drain(q.learner):  # the learner's part: full slots back to the free list
                q.free.put(slot)
            _drain(q.report)
        return max(0.0, t_worker - inner[0]) / rows, max(0.0, t_policy - inner[1]) / calls, rows // calls
    finally:
        if worker is not None:
            worker.close()
        for queue in (q.policy, q.learner, q.free, q.report, *q.workers):
            queue.close()


def _timing(fn, acc: list, i: int):
    """fn, adding the seconds of each call to acc[i]."""
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[i] += time.perf_counter() - t0
    return timed


def _drain(queue) -> list:
    try:
        return queue.get_many_nowait()
    except Empty:
        return []


def _echo(q_in, q_out) -> None:
    while True:
        m = q_in.get()
        if m == -1:
            return
        q_out.put(m)


def measure_msg(seconds: float) -> float:
    """Seconds of one request/reply round trip between two processes over sf.ipc.Queue (a rollout worker's request to
    a policy worker and its reply: two wake-ups)."""
    from sf.ipc import Queue
    ctx: Any = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")  # (typeshed: no Process)
    q_in, q_out = Queue(), Queue()
    child = ctx.Process(target=_echo, args=(q_in, q_out), daemon=True)
    child.start()
    try:
        q_in.put(0)
        q_out.get(timeout=30)
        n, t0 = 0, time.perf_counter()
        while n < 20 or time.perf_counter() - t0 < seconds:
            q_in.put(n)
            q_out.get(timeout=30)
            n += 1
        return (time.perf_counter() - t0) / n
    finally:
        q_in.put(-1)
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
        q_in.close()
        q_out.close()


def robust_time(times: list) -> float:
    """The lower quartile of repeated timings (the least of fewer than four): what the work costs when it has its core,
    not what other processes of a busy machine took from one measurement or another."""
    return sorted(times)[len(times) // 4]


def _timed(fn, seconds: float, sync) -> float:
    """robust_time of fn() over the calls that fit in `seconds` after one unmeasured call (at least one call: a call
    slower than the budget is measured once)."""
    t_end = time.perf_counter() + seconds
    fn()
    sync()
    times = []
    while not times or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return robust_time(times)


def measure_forward(cfg: Config, obs_space, action_space, device: str, seconds: float) -> dict:
    """rows -> seconds of one `forward_step` of the run's model on that many rows (inference mode), as a policy
    worker computes it (its precision, its acting copy of the weights)."""
    import numpy as np
    import torch
    from sf.model.actor_critic import create_actor_critic, run_precision
    model = run_precision(cfg, create_actor_critic(cfg, obs_space, action_space).to(device).eval(), device,
                          cfg.mode.deterministic)
    model.cast_for_inference()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    out = {}
    for b in FORWARD_ROWS:
        obs = {k: torch.as_tensor(np.stack([s.sample() for _ in range(b)])).to(device)
               for k, s in obs_space.spaces.items()}
        rnn = torch.zeros(b, model.rnn_state_size, device=device)
        with torch.inference_mode():
            out[b] = _timed(lambda: model.forward_step(obs, rnn), seconds / len(FORWARD_ROWS), sync)
    return out


def synthetic_batch(model, obs_space, action_space, n: int, rollout: int, device: str,
                    done_rate: float = 0.02) -> dict:
    """One training batch of n trajectories of `rollout` steps in the learner's layout (TrajectoryBuffers.gather):
    random observations, actions, behaviour outputs and rewards, episode ends with p = done_rate per step (the RNN
    runs one segment between steps where any trajectory ended, as in training), every step acted by policy version 0."""
    import numpy as np
    import torch
    from sf.buffers.trajectory_buffers import TrajectoryBuffers
    buffers = TrajectoryBuffers(n, rollout, obs_space, action_space, model.rnn_state_size)
    g = torch.Generator().manual_seed(0)
    for k, s in obs_space.spaces.items():
        v = buffers.obs[k]
        if v.dtype == torch.uint8:
            v.copy_(torch.randint(0, 256, v.shape, dtype=torch.uint8, generator=g))
        else:
            v.copy_(torch.from_numpy(np.stack([s.sample() for _ in range(v.shape[0] * v.shape[1])]).reshape(v.shape)))
    acts = np.stack([np.asarray(action_space.sample()) for _ in range(n * rollout)])
    buffers.actions.copy_(torch.from_numpy(acts).reshape(buffers.actions.shape).to(buffers.actions.dtype))
    buffers.action_logits.copy_(torch.randn(buffers.action_logits.shape, generator=g))
    buffers.log_probs.copy_(-1.0 - torch.rand(buffers.log_probs.shape, generator=g))
    buffers.values.copy_(torch.randn(buffers.values.shape, generator=g))
    buffers.rewards.copy_(torch.randn(buffers.rewards.shape, generator=g))
    buffers.dones.copy_((torch.rand(buffers.dones.shape, generator=g) < done_rate).float())
    buffers.rnn_states.copy_(torch.randn(buffers.rnn_states.shape, generator=g) * 0.1)
    for t in (buffers.truncated, buffers.policy_versions, buffers.policy_ids, buffers.final_rnn):
        t.zero_()
    buffers.final_t.fill_(-1)
    for v in buffers.final_obs.values():
        v.zero_()
    return buffers.gather(torch.arange(n), device)


def measure_learner(cfg: Config, obs_space, action_space, device: str, frameskip: int, batch_sizes, thread_counts,
                    seconds: float, done_rate: float = 0.02) -> dict:
    """"B/threads" -> seconds per sample of APPO.train on one training batch of B x --num_batches_per_epoch samples
    (the run's model, precision, loss and --num_epochs; episode ends at `done_rate` per step), with that many torch
    threads."""
    import torch
    from sf.learning.appo import APPO
    from sf.model.actor_critic import create_actor_critic, run_precision
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    out = {}
    each = seconds / (len(batch_sizes) * len(thread_counts))
    for B in batch_sizes:
        c = cfg.replace(batch_size=B)
        model = run_precision(c, create_actor_critic(c, obs_space, action_space).to(device), device,
                              c.mode.deterministic)
        appo = APPO(model, c, device, frames_per_sample=frameskip)
        samples = B * c.num_batches_per_epoch
        exp = synthetic_batch(model, obs_space, action_space, max(1, samples // c.rollout), c.rollout, device,
                              done_rate)
        for th in thread_counts:
            torch.set_num_threads(th)
            out[f"{B}/{th}"] = _timed(lambda: appo.train(exp, 0), each, sync) / samples
    return out


def measure(cfg: Config, seconds: float, tune_batch_size: bool = False, log=print) -> Measurements:
    """Measure what the run configured by `cfg` (a parse_cfg result) costs per sample on this machine, in about
    `seconds` (shares: envs 35%, policy forward 15%, learner 45%, buffers and queue 5%). Torch threads are restored."""
    import torch
    from sf_envs.registry import check_env_available
    t_start = time.perf_counter()
    prev_threads = torch.get_num_threads()
    device = resolve_device(cfg)
    bind_device(device)
    C = usable_cores()
    preset_e = cfg.num_envs_per_worker
    most = 16 if seconds >= 60 else 8  # making engines takes time (VizDoom: about a second each on a busy machine)
    counts = [k for k in ENV_COUNTS if k <= max(1, min(most, 2 * preset_e))]
    try:
        try:
            check_env_available(cfg)
        except ValueError as e:  # the env's package or data is missing: the user's to install
            raise ConfigError(f"--env {cfg.env}: {e}") from None
        torch.set_num_threads(1)
        spec, envs = _spaces_and_envs(cfg, max(counts))
        try:
            obs_space, action_space = envs[0].observation_space, envs[0].action_space
            multiagent = spec.num_agents > 1
            left = 0.25 * seconds - (time.perf_counter() - t_start)  # making the envs counts against their share
            log(f"measuring: env steps ({', '.join(map(str, counts))} envs per process)")
            env, done_rate = measure_envs(envs, counts, max(0.2, left / len(counts)), multiagent)
        finally:
            for e in envs:
                e.close()
        msg = measure_msg(0.03 * seconds)
        log(f"measuring: policy forward ({FORWARD_ROWS[0]}..{FORWARD_ROWS[-1]} rows, "
            f"{cfg.policy_worker_torch_threads} torch thread(s))")
        torch.set_num_threads(cfg.policy_worker_torch_threads)
        fwd = measure_forward(cfg, obs_space, action_space, device, 0.12 * seconds)
        e0 = min(cfg.num_envs_per_worker, most)
        log(f"measuring: a rollout worker of {e0} envs and a policy worker, stepped in this process")
        step, call, _ = measure_sampling(cfg, obs_space, action_space, e0, device, 0.1 * seconds)
        torch.set_num_threads(1)
        batches = batch_sizes(cfg.batch_size, cfg.rollout, tune_batch_size)
        from sf.learning.learner import learner_threads
        threads = sorted({1, C, learner_threads(cfg)})
        log(f"measuring: learner (APPO.train, batch {'/'.join(map(str, batches))} x {cfg.num_batches_per_epoch} "
            f"minibatch(es) x {cfg.num_epochs} epoch(s), {'/'.join(map(str, threads))} thread(s))")
        left = seconds - (time.perf_counter() - t_start)
        learn = measure_learner(cfg, obs_space, action_space, device, spec.frameskip, batches, threads, max(1.0, left),
                                done_rate)
    finally:
        torch.set_num_threads(prev_threads)
    return Measurements(cores=C, env=env, step=step, msg=msg, fwd=fwd, learn=learn, call=call,
                        policy_threads=cfg.policy_worker_torch_threads, agents=spec.num_agents,
                        frameskip=spec.frameskip, rollout=cfg.rollout, batch_size=cfg.batch_size,
                        num_batches_per_epoch=cfg.num_batches_per_epoch, num_epochs=cfg.num_epochs,
                        gpu=device.startswith("cuda"), seconds=time.perf_counter() - t_start, done_rate=done_rate)


def preset_layout(cfg: Config) -> Layout:
    from sf.learning.learner import learner_threads
    return Layout(cfg.num_workers, cfg.num_envs_per_worker, cfg.worker_num_splits, cfg.policy_workers_per_policy,
                  learner_threads(cfg), cfg.batch_size)



REPORT_RE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:,(\d+))?\].*Total num frames: (\d+)\."
                       r"(?:.*Policy lag \(min: [\d.na-]+, avg: ([\d.na-]+))?")


def steady_rate(log: str) -> tuple[float, float, int]:
    """(env frames/s between the first report after the warm-up and the last one, the mean of those reports' average
    policy lag, the number of reports used) out of a train.py log; nan where there are too few reports. The warm-up:
    the reports before the first one with frames, and a third of the rest."""
    reports = []
    for line in log.splitlines():
        m = REPORT_RE.search(line)
        if m:
            t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + float(f"0.{m.group(2) or 0}")
            reports.append((t, int(m.group(3)), float(m.group(4)) if m.group(4) not in (None, "nan") else math.nan))
    reports = [r for i, r in enumerate(reports) if r[1] > 0 or (i + 1 < len(reports) and reports[i + 1][1] > 0)]
    steady = reports[len(reports) // 3:]
    if len(steady) < 2 or steady[-1][0] <= steady[0][0]:
        return math.nan, math.nan, len(steady)
    lags = [r[2] for r in steady if not math.isnan(r[2])]
    fps = (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])
    return fps, (statistics.mean(lags) if lags else math.nan), len(steady)


def run_training(flags: list[str], seconds: float, train_dir: str, experiment: str = "autolayout_check") -> dict:
    """Run `python -m sf.train` with `flags` for about `seconds` (its budget: --train_for_seconds, start-up included;
    killed 60 s past it); returns frames/s and lag of its steady reports (steady_rate), its exit code and log."""
    report = max(1.0, min(5.0, seconds / 15))
    cmd = [sys.executable, "-m", "sf.train", *flags, "--train_dir", train_dir, "--experiment", experiment,
           "--restart_behavior", "overwrite", "--train_for_seconds", str(max(1, int(seconds))),
           "--report_interval_sec", str(report)]
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, start_new_session=True)
        log, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:  # its process group ends with it (the runner reaps its children)
        log, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), -9
    fps, lag, n = steady_rate(log)
    return {"frames_per_s": fps, "lag": lag, "reports": n, "rc": rc, "wall": time.time() - t0, "log": log}


def _describe(values: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items())


def _measure_and_save(cfg: Config, seconds: float) -> None:
    """Quick measurement for train.py --num_workers auto, in a child process of the runner started with spawn (a fresh
    interpreter): the runner forks its workers' fork server later, and a parent that ran torch's OpenMP threads must
    not fork; and a child forked from a process that had initialized CUDA (the runner's device check may) cannot use
    CUDA at all."""
    m = measure(cfg, seconds, log=lambda s: None)
    preset = preset_layout(cfg)
    chosen, pred, _ = choose(m, preset)
    save(cache_path(layout_key(cfg)), cfg, m, chosen, pred, preset, predict(preset, m), False, None)


def _measure_child(cfg: Config, seconds: float, send) -> None:
    """The child of resolve_auto: measures and caches; sends None, or (error kind, one line)."""
    try:
        _measure_and_save(cfg, seconds)
        send.send(None)
    except ConfigError as e:
        send.send(("ConfigError", str(e)))
    except Exception as e:  # reported by the parent as one line
        send.send(("RunError", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))


def resolve_auto(cfg: Config, explicit=frozenset()) -> tuple[str, dict, str]:
    """`train.py --num_workers auto` (sf.cfg.parse_cfg's auto_layout): (source, values, the run log's line). The cached
    layout of cfg.env on this host; none cached: measured now (QUICK_SECONDS) and cached. Flags given win."""
    found = cached_layout(cfg, explicit)
    how = "the cached layout"
    if found is None:
        print(f"--num_workers auto: no cached layout for {cfg.env} on this machine ({cache_path(layout_key(cfg))}): "
              f"measuring one now (about {QUICK_SECONDS:.0f} s; python -m sf.autolayout --env {cfg.env} measures "
              "longer and checks it with a training run)", file=sys.stderr, flush=True)
        t0 = time.time()
        ctx = mp.get_context("spawn")  # (see _measure_and_save)
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_measure_child, args=(cfg, QUICK_SECONDS, send))
        child.start()
        send.close()
        try:
            outcome = receive.recv()
        except EOFError:
            outcome = ("RunError", f"the measuring process died (exit code {child.join() or child.exitcode})")
        child.join()
        if outcome is not None:
            kind, text = outcome
            raise (ConfigError if kind == "ConfigError" else RunError)(f"--num_workers auto: measuring the layout "
                                                                         f"failed: {text}")
        found = cached_layout(cfg, explicit)
        how = f"a layout measured now in {time.time() - t0:.0f} s"
    path, values, desc = found
    given = sorted(k for k in (*LAYOUT_KEYS, "batch_size") if k in explicit and k != "num_workers")
    note = (f"--num_workers auto: {_describe(values)} ({how}, {path}, {desc})"
            + (f"; given on the command line: {', '.join('--' + k for k in given)}" if given else ""))
    return path, values, note
