"""Run statistics: FPS over sliding windows, episode statistics, learner statistics, TensorBoard.

TensorBoard tags follow Sample Factory's habits (one writer per policy, under train_dir/EXPERIMENT/):
    perf/_fps, perf/_sample_throughput, perf/fps_{10,60,300}s, perf/total_frames
    reward/reward{,_min,_max}, len/len{,_min,_max}, reward/score{,...} (unshaped game score)
    train/{policy_loss,value_loss,exploration_loss,kl_loss,entropy,kl_divergence,clip_fraction,grad_norm}
    train/skipped_steps (optimizer steps skipped so far in this run: a non-finite gradient, no valid step)
    train/lr (the learning rate in force: --learning_rate as --lr_schedule has it)
    train/policy_lag_{min,avg,max} (SGD steps), train/masked_fraction, train/policy_version
    train/policy_lag_batches (hts/ppo modes: one point per training batch, the lag measured on its data)
    memory/rss_mb_{runner,rollout_workers,policy_workers,learner}
A population (--num_policies N > 1): the episode and training series of policy i are tagged p{i}/... (p0/reward/reward,
p1/train/policy_lag_avg, ...; Sample Factory writes one directory per policy instead), the perf/ and memory/ series stay
global, and PBT adds p{i}/pbt/<hyperparameter> and the text pbt/decisions. One policy: the tags above, unprefixed.
With --with_wandb, the same scalars go to Weights & Biases as well (sf/runner/tracking.py, `tracker`).
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from sf.cfg.mode import MODES, RunMode
from sf.utils.events import read_scalar_events

log = logging.getLogger("sf")
FPS_WINDOWS = (10, 60, 300)
TRAIN_KEYS = ("policy_loss", "value_loss", "exploration_loss", "kl_loss", "entropy", "kl_divergence", "clip_fraction",
              "grad_norm", "lr", "masked_fraction")


class PolicyStats:
    """What one policy's learner and episodes report."""

    def __init__(self, stats_avg: int, version: int = 0, env_steps: int = 0):
        """version, env_steps: where a resumed run starts (its checkpoint's): what the console shows until the learner
        reports a training batch, so that a run that trains nothing shows the experiment's counters, not zeros."""
        self.lag_batches = float("nan")  # hts/ppo: policy lag in training batches of the last batch
        self.lag_batches_unwritten: list[float] = []  # ... and of every batch since the last summary
        self.episodes: dict[str, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=stats_avg))
        self.num_episodes = 0
        self.train_stats: list[dict] = []  # SGD steps since the last summary
        self.last_train: dict = {}
        self.lag = {"min": float("nan"), "avg": float("nan"), "max": float("nan")}
        self.version, self.learner_env_steps = version, env_steps
        self.hyperparams: dict[str, float] = {}  # PBT: the values in force, written as p{i}/pbt/<name>
        self.sgd_steps = self.skipped_steps = 0  # this run's optimizer steps, and those the optimizer skipped

    def add_episodes(self, episodes: list[dict]) -> None:
        for ep in episodes:
            self.num_episodes += 1
            for k, v in ep.items():
                if k != "policy":
                    self.episodes[k].append(v)

    def add_train(self, stats: list[dict], version: int, env_steps: int, skipped: int = 0) -> None:
        self.train_stats.extend(stats)
        self.sgd_steps, self.skipped_steps = self.sgd_steps + len(stats), self.skipped_steps + skipped
        if stats:
            self.last_train = stats[-1]
            self.lag = {"min": min(s["lag_min"] for s in stats), "avg": float(np.mean([s["lag_avg"] for s in stats])),
                        "max": max(s["lag_max"] for s in stats)}
            if "policy_lag_batches" in stats[-1]:
                self.lag_batches = stats[-1]["policy_lag_batches"]
                self.lag_batches_unwritten.append(self.lag_batches)
        self.version, self.learner_env_steps = version, env_steps

    def mean(self, key: str) -> float:
        d = self.episodes.get(key)
        return float(np.mean(d)) if d else float("nan")

    def scalars(self) -> dict[str, float]:
        """This policy's summary since the last one (unprefixed tags); clears the training steps it covered."""
        scalars: dict[str, float] = {}
        for key, tag in (("reward", "reward/reward"), ("length", "len/len"), ("score", "reward/score"),
                         ("win", "reward/win_rate")):
            d = self.episodes.get(key)
            if d:
                scalars[tag], scalars[tag + "_min"], scalars[tag + "_max"] = (
                    float(np.mean(d)), float(min(d)), float(max(d)))
        if self.train_stats:
            for k in TRAIN_KEYS:
                vals = [s[k] for s in self.train_stats if k in s]
                if vals:
                    scalars[f"train/{k}"] = float(np.mean(vals))
            for k, v in self.lag.items():
                scalars[f"train/policy_lag_{k}"] = v
            scalars["train/policy_version"] = self.version
            scalars["train/skipped_steps"] = self.skipped_steps
            self.train_stats = []
        for k, v in self.hyperparams.items():
            scalars[f"pbt/{k}"] = v
        return scalars


class RunStats:
    def __init__(self, exp_dir: Path, stats_avg: int, frameskip: int, mode: RunMode = MODES["async"],
                 num_policies: int = 1, resumed: list[tuple[int, int]] | None = None):
        """resumed: (policy version, env frames) of each policy's checkpoint that a resumed run starts from (the
        experiment's counters: the console's total frames and versions go on from them)."""
        self.frameskip, self.mode = frameskip, mode
        self.frames_history: collections.deque = collections.deque(maxlen=4000)  # (time, total frames)
        resumed = resumed or [(0, 0)] * num_policies
        self.start_frames = sum(steps for _, steps in resumed)  # frames trained before this run (all policies)
        self.policies = [PolicyStats(stats_avg, version, steps) for version, steps in resumed]
        self.memory: dict[str, float] = {}
        self.faults: dict[str, float] = {}  # restarts per process kind, env frames lost (self-healing)
        self.texts: list[tuple[str, str]] = []  # (tag, text) to write with the next summary (PBT decisions)
        self._writer = None
        self.exp_dir = exp_dir
        self.tracker = None  # a tracking.WandbTracker (--with_wandb): receives what goes to TensorBoard
        self.enabled = True  # False: nothing written (data-parallel ranks other than 0)
        self.shown = list(range(len(self.policies)))  # the policies this process reports (torchrun: its rank's)
        self.file_suffix = ""  # of the event file (ranks writing into one shared directory: each its own)

    # one policy's figures under the names a one-policy run always had
    @property
    def num_episodes(self) -> int:
        return sum(p.num_episodes for p in self.policies)

    @property
    def version(self) -> int:
        return self.policies[0].version

    def mean(self, key: str, policy: int = 0) -> float:
        return self.policies[policy].mean(key)

    @property
    def writer(self):
        if self._writer is None:
            from tensorboardX import SummaryWriter
            # tensorboardX's writer thread fsyncs the event file every flush; on a loaded VM one fsync has taken 26 s,
            # and with the default queue of 10 events the runner's add_scalar then waits for it: supervision,
            # reports and Ctrl-C handling stalled with it. A queue that never fills keeps the runner free of disk I/O.
            self._writer = SummaryWriter(str(self.exp_dir), flush_secs=5, max_queue=100_000,
                                         filename_suffix=self.file_suffix)
        return self._writer

    # --- inputs ---
    def add_frames(self, collected_frames: int, now: float | None = None) -> None:
        self.frames_history.append((now or time.time(), self.start_frames + collected_frames))

    def add_episodes(self, episodes: list[dict]) -> list[int]:
        """Episode reports (each with the "policy" that played it); returns the policies that got episodes."""
        by_policy: dict[int, list[dict]] = collections.defaultdict(list)
        for ep in episodes:
            by_policy[int(ep.get("policy", 0))].append(ep)
        for p, eps in by_policy.items():
            self.policies[p].add_episodes(eps)
        return sorted(by_policy)

    def add_train(self, stats: list[dict], version: int, env_steps: int, policy: int = 0, skipped: int = 0) -> None:
        self.policies[policy].add_train(stats, version, env_steps, skipped)

    def skipped_note(self) -> str:
        """The Done line's count of optimizer steps skipped (every policy's): "S of N optimizer steps skipped"."""
        steps = sum(p.sgd_steps for p in self.policies)
        return f"{sum(p.skipped_steps for p in self.policies)} of {steps} optimizer steps skipped"

    # --- outputs ---
    @property
    def total_frames(self) -> int:
        return self.frames_history[-1][1] if self.frames_history else self.start_frames

    def fps(self, window: float) -> float:
        if len(self.frames_history) < 2:
            return float("nan")
        t_now, f_now = self.frames_history[-1]
        for t, f in self.frames_history:  # oldest entry inside the window
            if t_now - t <= window:
                return (f_now - f) / max(t_now - t, 1e-9) if t_now > t else float("nan")
        return float("nan")

    def report_line(self) -> str:
        """The console's report: one line; a population adds one line per policy."""
        fps = ", ".join(f"{w} sec: {self.fps(w):.1f}" for w in FPS_WINDOWS)
        if len(self.policies) == 1:
            p = self.policies[0]
            return (f"Fps is ({fps}). Total num frames: {self.total_frames}. Policy version: {p.version}. "
                    f"{self._lag_text(p)}. {self._episodes_text(p)}")
        shown = [(i, self.policies[i]) for i in self.shown]
        idle = [str(i) for i, p in shown if p.learner_env_steps == 0 and p.num_episodes == 0]
        idle_text = f" (no experience yet: {', '.join(idle)})" if idle else ""
        of = f" of {len(self.policies)}" if len(shown) < len(self.policies) else ""
        lines = [f"Fps is ({fps}). Total num frames: {self.total_frames}. {len(shown)} policies{of}{idle_text}:"]
        for i, p in shown:
            lines.append(f"  policy {i}: version {p.version}, {p.learner_env_steps} frames trained. "
                         f"{self._lag_text(p)}. {self._episodes_text(p)}")
        return "\n".join(lines)

    @staticmethod
    def _episodes_text(p: PolicyStats) -> str:
        text = f"Avg episode reward: {p.mean('reward'):.3f} ({p.num_episodes} episodes)"
        if "score" in p.episodes:
            text += f", score: {p.mean('score'):.3f}"
        if "win" in p.episodes:
            text += f", win rate: {p.mean('win'):.2f}"
        return text

    def _lag_text(self, p: PolicyStats) -> str:
        lag = f"Policy lag (min: {p.lag['min']:.1f}, avg: {p.lag['avg']:.1f}, max: {p.lag['max']:.1f})"
        if not self.mode.intervals:
            return lag
        return f"Mode {self.mode.name}: policy lag {p.lag_batches:.0f} batch{'es' if p.lag_batches != 1 else ''} " \
               f"(in SGD steps: {lag[len('Policy lag ('):]}"

    def write_summaries(self) -> None:
        if not self.enabled:
            return
        step = self.total_frames
        w = self.writer
        fps10 = self.fps(10)
        scalars = {"perf/_fps": fps10, "perf/_sample_throughput": fps10 / self.frameskip, "perf/total_frames": step}
        for win in FPS_WINDOWS:
            scalars[f"perf/fps_{win}s"] = self.fps(win)
        prefix = (lambda i: "") if len(self.policies) == 1 else (lambda i: f"p{i}/")  # noqa: E731
        lag_batches = {}
        for i in self.shown:
            p = self.policies[i]
            scalars.update({prefix(i) + tag: v for tag, v in p.scalars().items()})
            lag_batches[prefix(i) + "train/policy_lag_batches"] = p.lag_batches_unwritten
            p.lag_batches_unwritten = []
        for k, v in self.memory.items():
            scalars[f"memory/rss_mb_{k}"] = v
        for k, v in self.faults.items():
            scalars[f"faults/{k}"] = v
        scalars = {tag: v for tag, v in scalars.items() if v == v}  # skip NaN (no data yet)
        for tag, v in scalars.items():
            w.add_scalar(tag, v, step)
        for tag, values in lag_batches.items():  # one point per training batch: the mode's guarantee, batch by batch
            for v in values:
                w.add_scalar(tag, v, step)
        for tag, text in self.texts:
            w.add_text(tag, text, step)
        self.texts = []
        if self.tracker is not None:  # W&B: the same points (never blocks: a queue drained by its own thread)
            self.tracker.log(scalars, step, lag_batches)

    def close(self, timeout: float = 5.0) -> None:
        """Close the TensorBoard writer (final write and fsync), waiting at most `timeout`: a run does not outlive its
        stop for the disk's sake. On a disk that slow, the last summaries may be lost; checkpoints are not (learner)."""
        if self._writer is None:
            return
        closer = threading.Thread(target=self._writer.close, name="tensorboard_close", daemon=True)
        closer.start()
        closer.join(max(timeout, 0.0))
        if closer.is_alive():
            # tensorboardX's atexit hook closes each event writer again at interpreter exit, in the main thread, where
            # it would wait for the same fsync (a minute, on a loaded CI machine: past a SIGTERM's grace). Marked
            # closed, the hook returns at once; the closing thread is a daemon and dies with the process.
            for file_writer in self._writer.all_writers.values():
                file_writer.event_writer._closed = True
            log.warning("TensorBoard's event file was not closed within %.1f s (a slow disk's fsync): the last "
                        "summaries may be lost (checkpoints are written by the learners, not here)", timeout)


def progress_bar(frames: int, frames_total: int, elapsed: float, seconds_total: float) -> str:
    """The console's progress bar and ETA (rendered by tqdm) toward whichever budget is closer to its end: `frames` of
    `frames_total` env frames (both counted from where this run started), or `elapsed` of `seconds_total` seconds;
    e.g. ' |##########..........| 50% 200k/400k frames, ETA 01:40'. Empty before 1%: the rate says nothing yet."""
    frames_total = max(frames_total, 1)
    by_frames = frames / frames_total >= elapsed / seconds_total
    n, total = (frames, frames_total) if by_frames else (elapsed, seconds_total)
    if n / total < 0.01:
        return ""
    amount = "{n_fmt}/{total_fmt} frames" if by_frames else "{elapsed}/" + tqdm.format_interval(total)
    # the ETA is tqdm's: what is left at the average rate so far, (total - n) * elapsed / n
    return " " + tqdm.format_meter(min(n, total), total, elapsed, ascii=".#", unit_scale=by_frames,
                                   bar_format="|{bar:20}| {percentage:.0f}% " + amount + ", ETA {remaining}")


def format_duration(seconds: float) -> str:
    """'45 s', '6 min 12 s', '2 h 05 min 09 s'."""
    m, s = divmod(int(round(max(seconds, 0.0))), 60)
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min {s:02d} s" if h else f"{m} min {s} s" if m else f"{s} s"


def read_event_scalars(exp_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from the TensorBoard event files in exp_dir, in file order (for tests and benchmark
    scripts). Read with TensorBoard's own reader: sf.utils.events.read_scalar_events, less the wall times."""
    return {tag: [(step, value) for step, _, value in points] for tag, points in read_scalar_events(exp_dir).items()}
