"""Runner: builds buffers and queues once, starts and supervises every process, gathers statistics,
stops on budget or signal (always with a final checkpoint from the learner).

    rollout workers --(w, group)--> policy queue --> policy workers --group--> worker queues
    rollout workers --slot--> learner queue --> learner --slot--> free queue --> rollout workers
    everyone --(kind, ...)--> report queue --> runner (episodes, train stats, checkpoints, errors)
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from queue import Empty
from types import SimpleNamespace

import psutil
import torch

from sf.buffers.shared_weights import SharedWeights
from sf.buffers.trajectory_buffers import TrajectoryBuffers, shm_available_bytes
from sf.cfg import ConfigError, experiment_dir, resolve_device, save_cfg
from sf.ipc import Queue
from sf.learning.learner import Learner, checkpoint_meta, run_learner
from sf.model.actor_critic import create_actor_critic
from sf.runner.checkpoint import CheckpointError, CheckpointManager, check_compatible
from sf.runner.shared_state import ENV_STEPS, FINISHED, SharedState
from sf.runner.stats import RunStats
from sf.runner.supervision import (LOG_DATEFMT, LOG_FORMAT, become_subreaper, child_main, kill_adopted, kill_tree,
                                   read_stack)
from sf.sampling.policy_worker import PolicyWorker, run_policy_worker
from sf.sampling.rollout_worker import RolloutWorker, run_rollout_worker
from sf_envs.registry import env_spec, make_env

log = logging.getLogger("sf")
STOP_TIMEOUT_SEC = 8.0  # the learner's final save included; stragglers are killed after it (budget: 10 s)


def run_training(cfg) -> int:
    """train.py's body: experiment directory, config.json, logging, then the runner."""
    exp_dir = prepare_experiment_dir(cfg)
    save_cfg(cfg, exp_dir)
    setup_logging(exp_dir)
    return Runner(cfg, exp_dir).run()


def prepare_experiment_dir(cfg) -> Path:
    """--restart_behavior: resume keeps the directory, restart moves it aside, overwrite deletes it."""
    exp_dir = experiment_dir(cfg)
    if exp_dir.exists() and cfg.restart_behavior == "restart":
        stamp, n = time.strftime("%Y%m%d_%H%M%S"), 0
        aside = exp_dir.with_name(f"{exp_dir.name}_old_{stamp}")
        while aside.exists():  # two restarts within a second
            n += 1
            aside = exp_dir.with_name(f"{exp_dir.name}_old_{stamp}_{n}")
        exp_dir.rename(aside)
        print(f"Moved the old experiment directory to {aside}")
    elif exp_dir.exists() and cfg.restart_behavior == "overwrite":
        shutil.rmtree(exp_dir)
    exp_dir.mkdir(parents=True, exist_ok=True)
    return exp_dir


def setup_logging(exp_dir: Path) -> None:
    fmt = logging.Formatter(LOG_FORMAT, LOG_DATEFMT)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in (logging.StreamHandler(sys.stdout), logging.FileHandler(exp_dir / "sf_log.txt")):
        h.setFormatter(fmt)
        root.addHandler(h)


def probe_env(cfg):
    """Make one env in the runner to read its spaces (and fail early, in one line, if it cannot run)."""
    try:
        env = make_env(cfg, env_index=0)
    except (ImportError, FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e).splitlines()[0] if str(e) else repr(e)) from None
    obs_space, action_space = env.observation_space, env.action_space
    env.close()
    return obs_space, action_space


class Runner:
    def __init__(self, cfg, exp_dir: Path):
        self.cfg, self.exp_dir = cfg, exp_dir
        self.device = resolve_device(cfg)
        self.spec = env_spec(cfg.env, cfg)
        self.obs_space, self.action_space = probe_env(cfg)
        model = create_actor_critic(cfg, self.obs_space, self.action_space)
        self.check_checkpoint(checkpoint_meta(cfg, self.obs_space, self.action_space, model))
        self.trajs_per_batch = cfg.batch_size * cfg.num_batches_per_epoch // cfg.rollout
        num_envs = cfg.num_workers * cfg.num_envs_per_worker
        num_slots = cfg.num_traj_buffers or num_envs + 2 * self.trajs_per_batch
        if num_slots < num_envs + self.trajs_per_batch:
            raise ConfigError(f"--num_traj_buffers {num_slots} is too small: need at least num_workers*num_envs_per_worker"
                              f" + batch_size*num_batches_per_epoch/rollout = {num_envs + self.trajs_per_batch}")
        need = TrajectoryBuffers.bytes_needed(num_slots, cfg.rollout, self.obs_space, self.action_space, model.rnn_state_size)
        have = shm_available_bytes()
        if need > 0.9 * have:
            raise ConfigError(f"not enough shared memory: trajectory buffers need {need / 2**20:.0f} MiB, /dev/shm has "
                              f"{have / 2**20:.0f} MiB free; lower --num_envs_per_worker/--batch_size or enlarge /dev/shm")
        self.buffers = TrajectoryBuffers(num_slots, cfg.rollout, self.obs_space, self.action_space, model.rnn_state_size)
        self.shared_weights = SharedWeights(model, self.device)
        self.state = SharedState(cfg.num_workers, cfg.policy_workers_per_policy)
        self.env_slots = torch.zeros((cfg.num_workers, cfg.num_envs_per_worker, 2), dtype=torch.int64).share_memory_()
        msg_bytes = 64  # a small int tuple; capacities hold every message that can be in flight at once
        self.queues = SimpleNamespace(
            policy=Queue(maxsize=cfg.num_workers * cfg.worker_num_splits + 1, max_size_bytes=max(2**16, msg_bytes * cfg.num_workers * cfg.worker_num_splits * 2)),
            workers=[Queue(maxsize=cfg.worker_num_splits + 1, max_size_bytes=2**12) for _ in range(cfg.num_workers)],
            learner=Queue(maxsize=num_slots + 1, max_size_bytes=max(2**16, msg_bytes * num_slots * 2)),
            free=Queue(maxsize=num_slots + 1, max_size_bytes=max(2**16, msg_bytes * num_slots * 2)),
            report=Queue(max_size_bytes=2**25),
        )
        self.queues.free.put_many(list(range(num_slots)))
        self.stats = RunStats(exp_dir, cfg.stats_avg, self.spec.frameskip)
        self.procs: dict[str, torch.multiprocessing.Process] = {}
        self.stack_files: dict[str, int] = {}  # process name -> descriptor of its stack-dump file (in that process)
        self.last_watch = time.monotonic()  # the stall watchdog's last look
        self.exit_code = 0
        self.interrupts = 0
        log.info("Experiment %s: env %s, device %s, %d rollout workers x %d envs, %d trajectory slots (%.0f MiB)",
                 exp_dir, cfg.env, self.device, cfg.num_workers, cfg.num_envs_per_worker, num_slots, need / 2**20)

    def check_checkpoint(self, meta: dict) -> None:
        """Before any process starts: the checkpoint to resume from must fit this env and model."""
        if self.cfg.restart_behavior != "resume":
            return
        try:
            manager = CheckpointManager(self.exp_dir, policy_id=0, keep_checkpoints=self.cfg.keep_checkpoints)
            state = manager.load("latest")
            if state is not None:
                check_compatible(state["meta"], meta, state.get("path", self.exp_dir / "checkpoint_p0"))
        except CheckpointError as e:
            raise ConfigError(str(e)) from None

    def worker_queues(self, w: int):
        q = self.queues
        return SimpleNamespace(policy=q.policy, worker=q.workers[w], learner=q.learner, free=q.free, report=q.report)

    # --- processes ---
    def _start(self, name: str, target, *args) -> None:
        ctx = torch.multiprocessing.get_context("spawn")
        p = ctx.Process(target=child_main, args=(name, self.queues.report, target, *args), name=name, daemon=False)
        self.state.beat(self.state.heartbeat_slot(name))  # its start-up (imports, envs) counts toward a stall
        p.start()
        self.procs[name] = p
        log.info("Started %s (pid %d)", name, p.pid)

    def start_processes(self) -> None:
        cfg, b, q, st = self.cfg, self.buffers, self.queues, self.state
        self._start("learner", run_learner, cfg, self.obs_space, self.action_space, b, q, self.shared_weights, st,
                    self.device, self.exp_dir)
        for i in range(cfg.policy_workers_per_policy):
            self._start(f"policy_worker_{i}", run_policy_worker, cfg, i, self.obs_space, self.action_space, b,
                        self.env_slots, q, self.shared_weights, st, self.device)
        while self.shared_weights.version < 0:  # learner ready (checkpoint loaded, weights published)
            if not self._check_processes() or not self._check_stalls():
                return
            self._drain_reports()
            time.sleep(0.05)
        self.stats.start_frames = int(st.learner[ENV_STEPS])
        for w in range(cfg.num_workers):
            self._start(f"rollout_worker_{w}", run_rollout_worker, cfg, w, b, self.env_slots, self.worker_queues(w), st, w)

    def _check_processes(self) -> bool:
        """False (and a stop with exit code 1) if any process died while the run was not stopping."""
        for name, p in self.procs.items():
            if p.exitcode is not None and not self.state.stopping():
                self._drain_reports()
                log.error("%s exited unexpectedly (exit code %s); stopping the run", name, p.exitcode)
                self.exit_code = 1
                self.state.request_stop()
                return False
        return True

    def _check_stalls(self) -> bool:
        """False (and a stop with exit code 1) if a process gave no sign of life for --stall_timeout_sec: alive but
        stuck in a call that never returns (an env engine that hangs, say). Its Python stack goes to the log; the stop
        then kills it (and its engines) after the others have stopped and the learner saved a final checkpoint."""
        timeout = self.cfg.stall_timeout_sec
        if timeout <= 0 or self.state.stopping():
            return True
        now = time.monotonic()
        if now - self.last_watch > 5.0:  # the runner itself was stopped (Ctrl-Z, then fg) or starved: all silence so far
            self.state.beat_all()         # is nobody's fault
        self.last_watch = now
        for name, p in self.procs.items():
            idle = self.state.seconds_since_beat(name)
            if idle > timeout and p.is_alive():
                self._drain_reports()  # the stack file of a process that only just started
                log.error("%s gave no sign of life for %.0f s (--stall_timeout_sec %g): it is stuck; stopping the run. "
                          "Its stack:\n%s", name, idle, timeout, read_stack(p.pid, self.stack_files.get(name)))
                self.exit_code = 1
                self.state.request_stop()
                return False
        return True

    # --- reports ---
    def _drain_reports(self) -> None:
        while True:
            try:
                msgs = self.queues.report.get_many(timeout=0.0, max_messages_to_get=1000)
            except Empty:
                return
            for msg in msgs:
                kind = msg[0]
                if kind == "episodes":
                    self.stats.add_episodes(msg[2])
                    metric = self.stats.mean(self.cfg.save_best_metric)
                    if metric == metric:
                        self.state.best_metric[0], self.state.best_metric[1] = metric, self.stats.num_episodes
                elif kind == "train":
                    self.stats.add_train(msg[1], msg[2], msg[3])
                elif kind == "stack_file":
                    self.stack_files[msg[1]] = msg[2]
                elif kind == "checkpoint":
                    log.info("Saved %scheckpoint %s", "final " if msg[2] else "", msg[1])
                elif kind == "error":
                    log.error("%s crashed:\n%s", msg[1], msg[2])
                    self.exit_code = 1
                    self.state.request_stop()

    def _update_memory(self) -> None:
        groups: dict[str, float] = {"runner": psutil.Process().memory_info().rss}
        for name, p in self.procs.items():
            try:
                rss = psutil.Process(p.pid).memory_info().rss
            except (psutil.Error, TypeError):
                continue
            key = name.rsplit("_", 1)[0] + "s" if name[-1].isdigit() else name
            groups[key] = groups.get(key, 0) + rss
        self.stats.memory = {k: v / 2**20 for k, v in groups.items()}

    # --- signals ---
    def _on_signal(self, signum, frame) -> None:
        self.interrupts += 1
        if self.interrupts > 1:  # second Ctrl-C: exit at once
            for p in self.procs.values():
                if p.is_alive():
                    kill_tree(p)
            os._exit(130)
        log.info("%s received: stopping (final checkpoint); press Ctrl-C again to exit at once", signal.Signals(signum).name)
        self.state.request_stop()

    # --- main loop ---
    def budget_reached(self, start: float) -> bool:
        return (int(self.state.learner[ENV_STEPS]) >= self.cfg.train_for_env_steps
                or time.time() - start >= self.cfg.train_for_seconds)

    def run(self) -> int:
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        start = last_report = last_summary = time.time()
        try:
            if self.cfg.serial_mode:
                self.run_serial(start)
            else:
                become_subreaper()
                self.start_processes()
                own_children = {c.pid for c in psutil.Process().children()}  # workers and multiprocessing's helpers
                while not self.state.stopping():
                    self._drain_reports()
                    if not self._check_processes() or not self._check_stalls() or self.budget_reached(start):
                        break
                    self._update_frames()
                    now = time.time()
                    if now - last_report >= self.cfg.report_interval_sec:
                        self._update_memory()
                        self._log_progress(start)
                        last_report = now
                    if now - last_summary >= self.cfg.experiment_summaries_interval:
                        self.stats.write_summaries()
                        last_summary = now
                    time.sleep(0.1)
                self.stop_processes()
                kill_adopted(own_children)  # engines of a worker that died without closing them
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self._drain_reports()
            self._update_frames()
            self._log_progress(start)  # a final report line, however short the run
            self.stats.write_summaries()
            self.stats.close()
            self.close_queues()
        log.info("Done: %d env frames, policy version %d. Checkpoints: %s; TensorBoard: tensorboard --logdir %s",
                 int(self.state.learner[ENV_STEPS]), self.stats.version, self.exp_dir / "checkpoint_p0", self.exp_dir.parent)
        return self.exit_code

    def _update_frames(self) -> None:
        self.stats.add_frames(int(self.state.worker_frames.sum()))

    def _log_progress(self, start: float) -> None:
        """The report line, with a progress bar and ETA toward whichever budget is closer to its end."""
        line = self.stats.report_line()
        cfg, elapsed = self.cfg, time.time() - start
        steps, first = int(self.state.learner[ENV_STEPS]), self.stats.start_frames  # a resumed run starts at `first`
        done = max((steps - first) / max(cfg.train_for_env_steps - first, 1), elapsed / cfg.train_for_seconds)
        if done >= 0.01:  # earlier, the rate (start-up included) says nothing yet
            eta = elapsed * max(1 - done, 0) / done
            filled = int(20 * min(done, 1))
            line += f" [{'#' * filled}{'.' * (20 - filled)}] {100 * min(done, 1):.0f}% ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}"
        log.info(line)

    def stop_processes(self) -> None:
        """Ask everyone to stop, let the learner write its final checkpoint, then reap every process."""
        self.state.request_stop()
        deadline = time.time() + STOP_TIMEOUT_SEC
        learner = self.procs.get("learner")
        while learner is not None and learner.is_alive() and self.state.learner[FINISHED] == 0 and time.time() < deadline:
            self._drain_reports()
            time.sleep(0.05)
        for p in self.procs.values():
            p.join(timeout=max(0.1, deadline - time.time()))
        for name, p in self.procs.items():
            if p.is_alive():
                log.warning("%s did not stop in time; killing it", name)
                kill_tree(p)
                p.join(timeout=2)

    def close_queues(self) -> None:
        q = self.queues
        for queue in [q.policy, q.learner, q.free, q.report, *q.workers]:
            queue.close()

    # --- serial mode ---
    def run_serial(self, start: float) -> None:
        """Every component in this process, stepped round-robin (for debugging)."""
        cfg = self.cfg
        learner = Learner(cfg, self.obs_space, self.action_space, self.buffers, self.queues, self.shared_weights,
                          self.state, self.device, self.exp_dir)
        self.stats.start_frames = learner.env_steps
        policy = PolicyWorker(cfg, self.obs_space, self.action_space, self.buffers, self.env_slots, self.queues,
                              self.shared_weights, self.device)
        policy.wait_for_weights(self.state.stopping)
        workers = [RolloutWorker(cfg, w, self.buffers, self.env_slots, self.worker_queues(w), self.state)
                   for w in range(cfg.num_workers)]
        for w in workers:
            w.start()
        last_report = time.time()
        try:
            while not self.state.stopping() and not self.budget_reached(start):
                policy.run_once(timeout=0.0)
                for w in workers:
                    w.run_once(timeout=0.0)
                learner.run_once(timeout=0.0)
                self._drain_reports()
                self._update_frames()
                if time.time() - last_report >= cfg.report_interval_sec:
                    self._log_progress(start)
                    last_report = time.time()
        finally:
            learner.finish()
            self._drain_reports()
            for w in workers:
                w.close()
