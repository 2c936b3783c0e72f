"""A worker layout that fits this machine, chosen by measurement: `python -m sf.autolayout --env ENV`.

    python -m sf.autolayout --env doom_battle [--minutes 2] [--device auto|cpu|cuda] [--tune_batch_size]
                            [train.py flags...]
    python train.py --env doom_battle --num_workers auto     # the cached layout (measured first if there is none)

It measures, in this process, what one sample costs in each engine of a run, predicts the env frames/s of every
candidate layout with the cost model below, picks the best whose predicted policy lag stays within bounds, then runs
that layout briefly with train.py and prints the measured frames/s and lag beside the prediction. The measurements
and the choice are saved as JSON in `cache_dir()` (<env>-<host>.json), which `train.py --num_workers auto` applies.

Measurements (the run's own configuration: the env's preset, configs/<family>.json, under the flags given; each the
lower quartile of repeated timings, `robust_time`):
    env[k]    seconds per env step of one process stepping k envs in turn with random actions (k = 1, 2, 4, 8, 16)
    fwd[b]    seconds of one policy forward (`forward_step`) on b rows, with --policy_worker_torch_threads threads
              (b = 1, 2, 4, ..., 64)
    step      seconds per sample a real rollout worker (sf.sampling) spends outside its env steps (buffers, slots,
              episode statistics, requests) and
    call      seconds per call a real policy worker spends outside the forward (gathering, sampling actions, writing
              them, replies): both on the sampling stage stepped in this process, timed around its env steps and
              forwards
    msg       seconds of one request/reply round trip between two processes over the run's queue (sf.ipc.Queue)
    learn[B, th]  seconds per sample of `APPO.train` on one training batch of the preset's shape (B = --batch_size x
              --num_batches_per_epoch samples, --num_epochs passes) with th learner threads (th = 1 and every core)

Cost model of a layout (W rollout workers x E envs in S splits, P policy workers, learner threads th, A agents per
env; all in samples/s, one sample = one agent step = frameskip env frames):
    rows per forward   b = (E / S) x A x ceil(W / P)          (a policy worker serves one split of each of its workers)
    CPU per sample     c = env[E] / A + step + msg / (E / S x A)                   rollout worker
                         + (fwd[b] x threads + call) / b + msg / (E / S x A)       policy worker
                         + learn[B, th] x th                                        learner (th cores while it trains)
    sampler capacity   min(W x E x A / round, P x b / (fwd[b] + call)), where one round of a worker (every env
                       stepped once) is S x (g x (env[E] / A + step) + msg + wait), g = E / S x A rows, and wait =
                       max(0, fwd[b] + call + msg - (S - 1) x g x (env[E] / A + step)): the time a split waits for its
                       actions beyond stepping the other splits
    learner capacity   1 / learn[B, th]
    cores              C / c: every engine shares the C cores
    predicted          min(sampler capacity, learner capacity, cores) x frameskip env frames/s
    policy lag         batches in flight x SGD steps per batch, with batches in flight = W x E x A x T / 2 / B (a sample
                       waits on average half a trajectory in its env) + 1/2 (its batch fills) + 1 if the learner is the
                       bottleneck (a full batch waits while the previous one trains); SGD steps per batch =
                       --num_batches_per_epoch x --num_epochs
The choice: the candidate of highest predicted frames/s whose lag is at most MAX_LAG SGD steps (or the preset layout's
lag where that is higher: a preset of many SGD steps per batch lags more by construction); among those within 1% of
the best, the one with the fewest processes, then the fewest envs, then the least lag. Candidates: W = 1 .. 2C, S in
{2, 4}, E a multiple of S up to twice the preset's (at most 64), W x E at most twice the preset's envs in all (at
least 16: every env costs memory and start-up time, which the model does not count), P in {1, 2}, th in {1, C}; flags
given on the command line are kept as given. S = 1 (a worker idle during each forward) is searched only where the
envs given leave no other: what it costs on a busy machine is the scheduling delay of every hand-over, which the model
does not see. --batch_size changes learning (SGD steps per sample, the gradient's noise): it is the preset's unless
--tune_batch_size adds half and twice it to the candidates. The layout applied is W, E, S, P and th
(--learner_torch_threads), and the batch size where it was tuned.

Where the model is rough: it assumes the run has the machine to itself (other load slows every engine, so measured
frames/s fall short of the prediction), one policy (--num_policies 1), and CPU costs measured one engine at a time;
the check run shows how far off it is on this machine. The cache is per env and host: measure again after changing
the model or the batch shape (python -m sf.autolayout overwrites it).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from sf.cfg import ConfigError, RunError, parse_cfg, run_guarded
from sf.processes.control import usable_cores
from sf.utils.files import write_json_atomic

MAX_LAG = 10.0  # SGD steps: the bound on the predicted average policy lag
TIE = 0.01  # layouts within this fraction of the best prediction are equals; the smallest of them wins
LAYOUT_KEYS = ("num_workers", "num_envs_per_worker", "worker_num_splits", "policy_workers_per_policy",
               "learner_torch_threads")
ENV_COUNTS = (1, 2, 4, 8, 16)  # envs per process measured
FORWARD_ROWS = (1, 2, 4, 8, 16, 32, 64)  # policy forward batch sizes measured
ENVS_PER_WORKER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
QUICK_SECONDS = 40.0  # train.py --num_workers auto without a cached layout: measuring takes about this long
CACHE_VERSION = 1


def cache_dir() -> Path:
    """Where layouts are cached: $XDG_CACHE_HOME/sf/autolayout (default ~/.cache/sf/autolayout)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sf" / "autolayout"


def cache_path(env: str) -> Path:
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"
    return cache_dir() / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', env)}-{host}.json"


# --- the cost model ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    num_workers: int
    num_envs_per_worker: int
    worker_num_splits: int
    policy_workers_per_policy: int
    learner_torch_threads: int
    batch_size: int


@dataclass
class Measurements:
    """What one sample costs in each engine (seconds; see the module docstring) and the run's batch shape."""
    cores: int
    env: dict  # envs per process -> seconds per env step
    step: float  # a rollout worker's seconds per sample beside its env steps
    msg: float
    fwd: dict  # rows -> seconds per forward call
    learn: dict  # "B/threads" -> seconds per sample of APPO.train
    call: float = 0.0  # a policy worker's seconds per call beside the forward
    policy_threads: int = 1
    agents: int = 1
    frameskip: int = 1
    rollout: int = 32
    batch_size: int = 1024
    num_batches_per_epoch: int = 1
    num_epochs: int = 1
    gpu: bool = False  # forward and learner on a GPU: one core drives each
    seconds: float = 0.0  # how long measuring took
    done_rate: float = 0.02  # episode ends per agent step with random actions (the learner's synthetic batch has them)

    def learn_at(self, batch_size: int, threads: int) -> float:
        return self.learn[f"{batch_size}/{threads}"]


def _interp(table: dict, x: float, extrapolate_linear: bool) -> float:
    """table (number -> value) at x: linear between measured points; below the first its value; above the last its
    value (extrapolate_linear: scaled by x / last, e.g. a forward on more rows than measured)."""
    pts = sorted((float(k), float(v)) for k, v in table.items())
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1] * (x / pts[-1][0] if extrapolate_linear else 1.0)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise AssertionError("unreachable")


def predict(lay: Layout, m: Measurements) -> dict:
    """The cost model's terms and prediction for one layout (see the module docstring): samples/s of each capacity,
    predicted env frames/s, policy lag in SGD steps."""
    W, E, S, P, th, B = (lay.num_workers, lay.num_envs_per_worker, lay.worker_num_splits,
                         lay.policy_workers_per_policy, lay.learner_torch_threads, lay.batch_size)
    A = m.agents
    g = E / S * A  # rows (agents) per split
    b = g * math.ceil(W / P)  # rows per forward call
    env = _interp(m.env, E, False) / A
    fwd = _interp(m.fwd, b, True)
    learn = m.learn_at(B, th)
    worker_cpu = env + m.step + m.msg / g
    policy_cpu = fwd * (1 if m.gpu else m.policy_threads) / b + m.call / b + m.msg / g
    learner_cpu = learn * (1 if m.gpu else th)
    wait = max(0.0, fwd + m.call + m.msg - (S - 1) * g * (env + m.step))
    round_s = S * (g * (env + m.step) + m.msg + wait)
    rollout_cap = W * E * A / round_s
    policy_cap = P * b / (fwd + m.call)
    sampler = min(rollout_cap, policy_cap)
    learner = 1.0 / learn
    cores = m.cores / (worker_cpu + policy_cpu + learner_cpu)
    samples = min(sampler, learner, cores)
    per_batch = B * m.num_batches_per_epoch
    in_flight = W * E * A * m.rollout / 2 / per_batch + 0.5 + (1.0 if learner <= sampler else 0.0)
    lag = in_flight * m.num_batches_per_epoch * m.num_epochs
    return {"rows_per_forward": b, "cpu_per_sample": {"rollout_worker": worker_cpu, "policy_worker": policy_cpu,
                                                      "learner": learner_cpu},
            "sampler": sampler, "learner": learner, "cores": cores, "samples_per_s": samples,
            "frames_per_s": samples * m.frameskip, "lag": lag,
            "bound": min((("sampler", sampler), ("learner", learner), ("cores", cores)), key=lambda t: t[1])[0]}


def batch_sizes(batch_size: int, rollout: int, tune: bool) -> list[int]:
    """The --batch_size candidates: the configuration's; tune: also half and twice it (whole trajectories)."""
    return [batch_size] + ([b for b in (batch_size // 2, batch_size * 2) if b >= rollout and b % rollout == 0]
                           if tune else [])


def candidates(m: Measurements, preset: Layout, fixed: dict, tune_batch_size: bool) -> list[Layout]:
    """Every layout the search considers (see the module docstring); `fixed` (parameter -> value) are kept as given."""
    C = m.cores
    e_max = max(min(64, max(2 * preset.num_envs_per_worker, 8)), preset.num_envs_per_worker)
    values = {"num_workers": sorted(set(range(1, 2 * C + 1)) | {preset.num_workers}),
              "num_envs_per_worker": sorted(e for e in set(ENVS_PER_WORKER) | {preset.num_envs_per_worker}
                                            if e <= e_max),
              "worker_num_splits": (2, 4), "policy_workers_per_policy": (1, 2),
              "learner_torch_threads": sorted({1, C, preset.learner_torch_threads}),
              "batch_size": batch_sizes(preset.batch_size, m.rollout, tune_batch_size)}
    values.update({k: [v] for k, v in fixed.items()})
    if "worker_num_splits" not in fixed and all(e % 2 for e in values["num_envs_per_worker"]):
        values["worker_num_splits"] = (1,)  # an odd number of envs given: one split is all there is
    grid = itertools.product(*(values[k] for k in Layout.__dataclass_fields__))
    most_envs = max(2 * preset.num_workers * preset.num_envs_per_worker, 16)
    return [lay for lay in itertools.starmap(Layout, grid) if lay.num_envs_per_worker % lay.worker_num_splits == 0
            and ("policy_workers_per_policy" in fixed or lay.policy_workers_per_policy <= lay.num_workers)
            and (fixed.keys() & {"num_workers", "num_envs_per_worker"} or lay.num_workers * lay.num_envs_per_worker
                 <= most_envs)]


def choose(m: Measurements, preset: Layout, fixed: dict | None = None, tune_batch_size: bool = False,
           max_lag: float = MAX_LAG) -> tuple[Layout, dict, float]:
    """(the chosen layout, its prediction, the lag bound used): the highest predicted frames/s within the lag bound,
    ties (within TIE of the best) to the fewest processes, then the fewest envs, then the least lag."""
    fixed = dict(fixed or {})
    bound = max(max_lag, predict(preset, m)["lag"])
    scored = [(lay, predict(lay, m)) for lay in candidates(m, preset, fixed, tune_batch_size)]
    ok = [(lay, p) for lay, p in scored if p["lag"] <= bound + 1e-9]
    if not ok:  # every candidate lags more (fixed flags): the least lag
        ok = [min(scored, key=lambda t: t[1]["lag"])]
    best = max(p["frames_per_s"] for _, p in ok)
    near = [(lay, p) for lay, p in ok if p["frames_per_s"] >= (1 - TIE) * best]
    lay, p = min(near, key=lambda t: (t[0].num_workers + t[0].policy_workers_per_policy,
                                     t[0].num_workers * t[0].num_envs_per_worker, t[1]["lag"],
                                     t[0].learner_torch_threads, -t[1]["frames_per_s"]))
    return lay, p, bound


# --- measuring -----------------------------------------------------------------------------------------------------
def _spaces_and_envs(cfg, count: int):
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


def measure_sampling(cfg, obs_space, action_space, envs: int, device: str, seconds: float) -> tuple[float, float, int]:
    """The sampling stage stepped in this process: one real rollout worker (sf.sampling.rollout_worker) of `envs` envs
    and one real policy worker over real shared buffers and queues, the learner's part done by recycling full slots.
    Returns (the rollout worker's seconds per sample outside its env steps, the policy worker's seconds per call
    outside the forward, rows per call): the Python of each, timed around the env steps and forwards it makes."""
    import copy
    from types import SimpleNamespace
    import torch
    from sf.buffers.shared_weights import SharedWeights
    from sf.buffers.trajectory_buffers import TrajectoryBuffers
    from sf.ipc import Queue
    from sf.model.actor_critic import create_actor_critic
    from sf.processes.shared_state import SharedState
    from sf.sampling.policy_worker import PolicyWorker
    from sf.sampling.rollout_worker import RolloutWorker
    from sf_envs.registry import env_spec
    c = copy.copy(cfg)
    c.num_workers, c.num_envs_per_worker, c.worker_num_splits, c.num_policies = 1, envs, 1, 1
    c.sync_mode = "async"
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
    from queue import Empty
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
    import multiprocessing as mp
    from sf.ipc import Queue
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
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


def measure_forward(cfg, obs_space, action_space, device: str, seconds: float) -> dict:
    """rows -> seconds of one `forward_step` of the run's model on that many rows (inference mode), as a policy
    worker computes it (its precision, its acting copy of the weights)."""
    import numpy as np
    import torch
    from sf.model.actor_critic import create_actor_critic, run_precision
    model = run_precision(cfg, create_actor_critic(cfg, obs_space, action_space).to(device).eval(), device)
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


def measure_learner(cfg, obs_space, action_space, device: str, frameskip: int, batch_sizes, thread_counts,
                    seconds: float, done_rate: float = 0.02) -> dict:
    """"B/threads" -> seconds per sample of APPO.train on one training batch of B x --num_batches_per_epoch samples
    (the run's model, precision, loss and --num_epochs; episode ends at `done_rate` per step), with that many torch
    threads."""
    import copy
    import torch
    from sf.learning.appo import APPO
    from sf.model.actor_critic import create_actor_critic, run_precision
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    out = {}
    each = seconds / (len(batch_sizes) * len(thread_counts))
    for B in batch_sizes:
        c = copy.copy(cfg)
        c.batch_size = B
        model = run_precision(c, create_actor_critic(c, obs_space, action_space).to(device), device)
        appo = APPO(model, c, device, frames_per_sample=frameskip)
        samples = B * c.num_batches_per_epoch
        exp = synthetic_batch(model, obs_space, action_space, max(1, samples // c.rollout), c.rollout, device,
                              done_rate)
        for th in thread_counts:
            torch.set_num_threads(th)
            out[f"{B}/{th}"] = _timed(lambda: appo.train(exp, 0), each, sync) / samples
    return out


def measure(cfg, seconds: float, tune_batch_size: bool = False, log=print) -> Measurements:
    """Measure what the run configured by `cfg` (a parse_cfg result) costs per sample on this machine, in about
    `seconds` (shares: envs 35%, policy forward 15%, learner 45%, buffers and queue 5%). Torch threads are restored."""
    import torch
    from sf.cfg import resolve_device
    from sf_envs.registry import check_env_available
    t_start = time.perf_counter()
    from sf.processes.control import bind_device
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


def preset_layout(cfg) -> Layout:
    from sf.learning.learner import learner_threads
    return Layout(cfg.num_workers, cfg.num_envs_per_worker, cfg.worker_num_splits, cfg.policy_workers_per_policy,
                  learner_threads(cfg), cfg.batch_size)


def layout_flags(lay: Layout | dict, with_batch: bool) -> list[str]:
    d = asdict(lay) if isinstance(lay, Layout) else lay
    keys = LAYOUT_KEYS + (("batch_size",) if with_batch else ())
    return [x for k in keys for x in (f"--{k}", str(d[k]))]


# --- a short training run --------------------------------------------------------------------------------------------
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


# --- the cache -----------------------------------------------------------------------------------------------------
def save(path: Path, cfg, m: Measurements, chosen: Layout, pred: dict, preset: Layout, preset_pred: dict,
         tune_batch_size: bool, check: Optional[dict]) -> None:
    data = {"version": CACHE_VERSION, "env": cfg.env, "host": socket.gethostname(), "cores": m.cores,
            "device": "cuda" if m.gpu else "cpu", "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
            "batch_size_tuned": tune_batch_size, "choice": asdict(chosen), "predicted": pred,
            "preset": asdict(preset), "preset_predicted": preset_pred, "measurements": asdict(m),
            "check": None if check is None else {k: check[k] for k in ("frames_per_s", "lag", "reports", "rc")}}
    write_json_atomic(path, _finite(json.loads(json.dumps(data, default=float))))


def _finite(x):
    """`x` with every NaN or infinite float as None (JSON has no NaN: a check run too short for a figure)."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def cached_layout(env: str, explicit=frozenset()) -> tuple[str, dict, str] | None:
    """(the cache file, the layout values to apply, a description) from the cached file of `env`, or None when there
    is none. Values given on the command line (`explicit`) are left out: they win."""
    from sf.cfg.parse import read_json_object
    path = cache_path(env)
    if not path.exists():
        return None
    data = read_json_object(path, str(path))
    choice = data.get("choice")
    if not isinstance(choice, dict) or any(k not in choice for k in LAYOUT_KEYS):
        raise ConfigError(f"{path}: no layout in it (key 'choice' with {', '.join(LAYOUT_KEYS)}); delete it or measure "
                          f"again: python -m sf.autolayout --env {env}")
    keys = LAYOUT_KEYS + (("batch_size",) if data.get("batch_size_tuned") else ())
    values = {k: choice[k] for k in keys if k == "num_workers" or k not in explicit}
    pred = data.get("predicted", {}).get("frames_per_s")
    desc = f"measured {data.get('measured_at', '?')}" + (f", predicted {pred:,.0f} env frames/s"
                                                         if isinstance(pred, (int, float)) else "")
    return str(path), values, desc


def _describe(values: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items())


def _measure_and_save(cfg, seconds: float) -> None:
    """Quick measurement for train.py --num_workers auto, in a child process of the runner started with spawn (a fresh
    interpreter): the runner forks its workers' fork server later, and a parent that ran torch's OpenMP threads must
    not fork; and a child forked from a process that had initialized CUDA (the runner's device check may) cannot use
    CUDA at all."""
    m = measure(cfg, seconds, log=lambda s: None)
    preset = preset_layout(cfg)
    chosen, pred, _ = choose(m, preset)
    save(cache_path(cfg.env), cfg, m, chosen, pred, preset, predict(preset, m), False, None)


def _measure_child(cfg, seconds: float, send) -> None:
    """The child of resolve_auto: measures and caches; sends None, or (error kind, one line)."""
    try:
        _measure_and_save(cfg, seconds)
        send.send(None)
    except ConfigError as e:
        send.send(("ConfigError", str(e)))
    except Exception as e:  # reported by the parent as one line
        send.send(("RunError", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))


def resolve_auto(cfg, explicit=frozenset()) -> tuple[str, dict, str]:
    """`train.py --num_workers auto` (sf.cfg.parse_cfg's auto_layout): (source, values, the run log's line). The cached
    layout of cfg.env on this host; none cached: measured now (QUICK_SECONDS) and cached. Flags given win."""
    found = cached_layout(cfg.env, explicit)
    how = "the cached layout"
    if found is None:
        import multiprocessing as mp
        print(f"--num_workers auto: no cached layout for {cfg.env} on this machine ({cache_path(cfg.env)}): "
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
        found = cached_layout(cfg.env, explicit)
        how = f"a layout measured now in {time.time() - t0:.0f} s"
    path, values, desc = found
    given = sorted(k for k in (*LAYOUT_KEYS, "batch_size") if k in explicit and k != "num_workers")
    note = (f"--num_workers auto: {_describe(values)} ({how}, {path}, {desc})"
            + (f"; given on the command line: {', '.join('--' + k for k in given)}" if given else ""))
    return path, values, note


# --- the command line ----------------------------------------------------------------------------------------------
def _ms(x: float) -> str:
    return f"{x * 1e3:.3f} ms" if x < 0.01 else f"{x * 1e3:.1f} ms"


def _report_lines(m: Measurements, rows: list[tuple[str, Layout, dict]]) -> list[str]:
    lines = [f"measured in {m.seconds:.0f} s ({m.cores} cores, {'GPU' if m.gpu else 'CPU'}):",
             "  env step, per process: " + ", ".join(f"{k} envs {_ms(v)}" for k, v in m.env.items()),
             f"  rollout worker beside its envs {_ms(m.step)} per sample; policy worker beside the forward "
             f"{_ms(m.call)} per call; queue round trip between processes {_ms(m.msg)}",
             f"  policy forward ({m.policy_threads} thread(s)): " + ", ".join(f"{b} rows {_ms(v)}"
                                                                               for b, v in m.fwd.items()),
             "  learner APPO.train: " + ", ".join(f"batch {k.split('/')[0]} x {k.split('/')[1]} thread(s) "
                                                   f"{1 / v:,.0f} samples/s" for k, v in m.learn.items()),
             "", f"{'layout':<8} workers envs/worker splits policy_workers learner_threads batch | rows/fwd | "
                 f"samples/s: sampler learner cores | frames/s  lag  bound"]
    for name, lay, p in rows:
        lines.append(f"{name:<8} {lay.num_workers:>7} {lay.num_envs_per_worker:>11} {lay.worker_num_splits:>6} "
                     f"{lay.policy_workers_per_policy:>14} {lay.learner_torch_threads:>15} {lay.batch_size:>5} | "
                     f"{p['rows_per_forward']:>8.0f} | {p['sampler']:>17,.0f} {p['learner']:>7,.0f} {p['cores']:>5,.0f}"
                     f" | {p['frames_per_s']:>8,.0f} {p['lag']:>4.1f}  {p['bound']}")
    return lines


def main(argv=None, prog: str = "python -m sf.autolayout") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_guarded(prog, lambda: _main(argv))


def _main(argv: list[str]) -> int:
    own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    own.add_argument("--minutes", default="2")
    own.add_argument("--tune_batch_size", action="store_true")
    own.add_argument("-h", "--help", action="store_true")
    args, train_flags = own.parse_known_args(argv)
    if args.help:
        print(__doc__)
        return 0
    try:
        minutes = float(args.minutes)
    except ValueError:
        minutes = math.nan
    if not (math.isfinite(minutes) and minutes > 0):
        raise ConfigError(f"--minutes must be a number of minutes > 0 (got {args.minutes!r})")
    if "--num_workers=auto" in train_flags:  # the layout is what this measures
        train_flags.remove("--num_workers=auto")
    if "--num_workers" in train_flags and train_flags[train_flags.index("--num_workers") + 1:][:1] == ["auto"]:
        i = train_flags.index("--num_workers")
        del train_flags[i:i + 2]
    with tempfile.TemporaryDirectory(prefix="sf-autolayout-") as tmp:
        cfg = parse_cfg([*train_flags, "--train_dir", tmp], mode="train", prog="python -m sf.autolayout")
        total, t_start = minutes * 60.0, time.time()
        check_s = 0.55 * total
        print(f"sf.autolayout: {cfg.env} on {socket.gethostname()} ({usable_cores()} cores), budget "
              f"{minutes:g} min: measuring {total - check_s:.0f} s, then a {check_s:.0f} s training run", flush=True)
        m = measure(cfg, total - check_s, args.tune_batch_size, log=lambda s: print(s, flush=True))
        preset = preset_layout(cfg)
        fixed = {k: getattr(cfg, k) for k in LAYOUT_KEYS + ("batch_size",) if k in cfg._explicit}
        if "learner_torch_threads" in fixed:
            fixed["learner_torch_threads"] = preset.learner_torch_threads  # 0 means the default (learner_threads)
        chosen, pred, bound = choose(m, preset, fixed, args.tune_batch_size)
        preset_pred = predict(preset, m)
        for line in _report_lines(m, [("preset", preset, preset_pred), ("chosen", chosen, pred)]):
            print(line)
        print(f"chosen: the highest predicted env frames/s with predicted policy lag <= {bound:.1f} SGD steps "
              f"({pred['frames_per_s'] / preset_pred['frames_per_s']:.2f}x the preset's prediction)")
        if chosen.batch_size != cfg.batch_size:
            print(f"batch size: {cfg.batch_size} -> {chosen.batch_size} (--tune_batch_size; this changes learning: "
                  "SGD steps per sample and the gradient's noise)")
        else:
            print(f"batch size: kept at {cfg.batch_size} (it changes learning; --tune_batch_size lets it change)")
        flags = [*train_flags, *layout_flags(chosen, args.tune_batch_size)]
        budget_left = max(total - (time.time() - t_start), 0.25 * total)  # measuring may overrun its share a little
        print(f"checking: python -m sf.train {' '.join(flags)} for {budget_left:.0f} s", flush=True)
        check = run_training(flags, budget_left, tmp)
        if check["rc"] != 0 and math.isnan(check["frames_per_s"]):
            tail = [ln for ln in check["log"].splitlines() if ln.strip()][-1:] or ["no output"]
            print(f"check run failed (exit {check['rc']}): {tail[0][:200]}")
        print(f"measured: {check['frames_per_s']:,.0f} env frames/s (predicted {pred['frames_per_s']:,.0f}), average "
              f"policy lag {check['lag']:.1f} (predicted {pred['lag']:.1f}) over {check['reports']} steady reports"
              + ("" if check["reports"] >= 2 else " (too short a run for a steady figure: give more --minutes)"))
    path = cache_path(cfg.env)
    save(path, cfg, m, chosen, pred, preset, preset_pred, args.tune_batch_size, check)
    print(f"saved {path}: train.py --env {cfg.env} --num_workers auto uses this layout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
