"""The cost model of a worker layout and the choice among the candidates (the formulas and the rule: sf.autolayout's
docstring): arithmetic on measured costs, no process, no torch."""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

MAX_LAG = 10.0  # SGD steps: the bound on the predicted average policy lag
TIE = 0.01  # layouts within this fraction of the best prediction are equals; the smallest of them wins
LAYOUT_KEYS = ("num_workers", "num_envs_per_worker", "worker_num_splits", "policy_workers_per_policy",
               "learner_torch_threads")
ENVS_PER_WORKER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


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
    """What one sample costs in each engine (seconds; see sf.autolayout's docstring) and the run's batch shape."""
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
    """The cost model's terms and prediction for one layout (see sf.autolayout's docstring): samples/s of each capacity,
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
    """Every layout the search considers (see sf.autolayout's docstring); `fixed` (parameter -> value) are kept as
    given."""
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


def layout_flags(lay: Layout | dict, with_batch: bool) -> list[str]:
    d = asdict(lay) if isinstance(lay, Layout) else lay
    keys = LAYOUT_KEYS + (("batch_size",) if with_batch else ())
    return [x for k in keys for x in (f"--{k}", str(d[k]))]
