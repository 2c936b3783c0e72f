"""Pre-flight: everything train.py does before the run starts, in the order run_training does it. The console (and a
buffer for the log file) first, background errors as one line each, torchrun's world; then the checks, each refusing a
run in one line before anything is written or allocated: the env runs (probe_env), the trajectory slots hold a batch
(RunShape.of, sf/cfg/shape.py), the run fits in memory (check_memory), the checkpoint to resume fits this env and model
(check_checkpoint), a resumed experiment has frames left to train (already_trained); only then, under the
experiment's lock, the experiment directory (prepare_experiment_dir) and its log file (setup_logging).

With torchrun, rank 0 alone decides whether the run starts (it alone may see the experiment: there may be no shared
filesystem), and tells the other ranks before the learners' group exists (telling_other_ranks, follow_rank0): a
finished experiment, or a refusal on rank 0, then ends every rank at once with rank 0's line.
"""
from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import psutil
import torch

from sf.buffers.trajectory_buffers import obs_bytes, shm_available_bytes, shm_used_bytes
from sf.cfg import Config, ConfigError, RunError, experiment_dir
from sf.cfg.shape import num_envs
from sf.learning.checkpoint import CheckpointError, check_compatible
from sf.learning.checkpoint_store import CheckpointManager
from sf.processes import ranks
from sf.runner.startup.supervision import LOG_DATEFMT, LOG_FORMAT, TRACE_LOG
from sf.seeding import rank_seed
from sf.utils.files import first_line
from sf_envs.registry import make_env, remove_stale_leftovers

log = logging.getLogger("sf")



def setup_logging(exp_dir: Path | None = None, early: logging.handlers.MemoryHandler | None = None):
    """Without exp_dir: the console, plus a buffer of what is logged before the experiment directory may be written
    (returned). With exp_dir: also exp_dir/sf_log.txt, which first receives that buffer. Tracebacks of crashed processes
    go to the file only (TRACE_LOG): the console gets one line per crash, naming the file."""
    fmt = logging.Formatter(LOG_FORMAT, LOG_DATEFMT)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    if exp_dir is None:
        for h in list(root.handlers):
            root.removeHandler(h)
        console = logging.StreamHandler(sys.stdout)
        console.setFormatter(fmt)
        early = logging.handlers.MemoryHandler(capacity=10_000, flushLevel=logging.CRITICAL + 1)
        for h in (console, early):
            root.addHandler(h)
        return early
    file_handler = logging.FileHandler(exp_dir / "sf_log.txt")
    file_handler.setFormatter(fmt)
    if early is not None:
        early.setTarget(file_handler)
        early.close()  # flushes into the file
        root.removeHandler(early)
    root.addHandler(file_handler)
    trace = logging.getLogger(TRACE_LOG)
    trace.propagate = False
    for h in list(trace.handlers):
        trace.removeHandler(h)
    trace.addHandler(file_handler)
    return None


def report_background_errors() -> None:
    """An exception in a background thread or an atexit callback of this process (tensorboardX's writer thread when the
    disk is full, say) is one warning line on the console, its traceback in the log file, instead of a traceback on the
    console; a log file that cannot be written any more is not reported by logging with tracebacks of its own."""
    def thread_hook(args) -> None:
        where = args.thread.name if args.thread is not None else "a thread"
        log.warning("error in background thread %s: %s: %s", where, args.exc_type.__name__, args.exc_value)
        logging.getLogger(TRACE_LOG).warning("in thread %s", where, exc_info=(args.exc_type, args.exc_value,
                                                                             args.exc_traceback))

    def unraisable_hook(unraisable) -> None:
        exc = unraisable.exc_value
        log.warning("error %s: %s: %s", unraisable.err_msg or "ignored", type(exc).__name__, exc)
        logging.getLogger(TRACE_LOG).warning("%s", unraisable.err_msg, exc_info=(unraisable.exc_type, exc,
                                                                                unraisable.exc_traceback))

    threading.excepthook = thread_hook
    sys.unraisablehook = unraisable_hook
    logging.raiseExceptions = False


def data_parallel_world(cfg: Config) -> tuple[Config, ranks.World]:
    """This process's rank when torchrun started it (sf/learning/collectives.py: the learners of all ranks average their
    gradients, or a population's policies are placed on the ranks); one rank otherwise. Refuses what runs under
    torchrun do not support, gives the rank its share of the
    machine's cores (ranks of one machine split them) and, past rank 0, streams of its own for envs, actions and
    minibatches (the weights are rank 0's, broadcast at start). Returns (the rank's cfg, world)."""
    try:
        world = ranks.world_from_env()
    except ValueError as e:
        raise ConfigError(f"torchrun's environment: {e}") from None
    if not world.distributed:
        return cfg, world
    for refused, why in ((not cfg.mode.distributable, f"--sync_mode {cfg.mode.name}"),
                         (cfg.mode.serial, "--serial_mode")):
        if refused:
            raise ConfigError(f"{why}: runs under torchrun train asynchronously (--sync_mode async, no --serial_mode)")
    population = cfg.num_policies > 1
    if population and cfg.num_policies < world.world_size:
        raise ConfigError(f"--num_policies {cfg.num_policies}: a population under torchrun places policy p on rank p "
                          f"mod {world.world_size}; give at least one policy per rank ({world.world_size}) or start "
                          "fewer ranks")
    if population and cfg.with_pbt and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise ConfigError("--with_pbt: population-based training across ranks talks through torchrun's store "
                          "(TORCHELASTIC_USE_AGENT_STORE=True, which torchrun sets); launch with torchrun, or run "
                          "without --with_pbt")
    cores = sorted(os.sched_getaffinity(0))
    if world.local_world_size > 1 and len(cores) >= world.local_world_size:
        os.sched_setaffinity(0, cores[world.local_rank::world.local_world_size])  # inherited by every process started
    cfg = cfg.replace(seed=rank_seed(cfg.seed, world.rank))  # past rank 0, streams of its own (sf.seeding)
    shown = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    if population:
        log.info("Rank %d of %d (local rank %d of %d, cores %s): policies %s of the population of %d (policy p on rank "
                 "p mod %d); their checkpoints go to this rank's %s", world.rank, world.world_size, world.local_rank,
                 world.local_world_size, shown, ", ".join(map(str, world.policies(cfg.num_policies))),
                 cfg.num_policies, world.world_size, experiment_dir(cfg))
    else:
        log.info("Data-parallel rank %d of %d (local rank %d of %d, cores %s), learners' group at %s:%d; --batch_size "
                 "%d per rank", world.rank, world.world_size, world.local_rank, world.local_world_size, shown,
                 world.master_addr, world.master_port, cfg.batch_size)
    return cfg, world


def probe_env(cfg: Config):
    """Make one env in the runner to read its spaces (and fail early, in one line, if it cannot run). Also returns
    what one env costs in memory (bytes: the processes it starts, e.g. a VizDoom engine, plus what it allocates here),
    the modules making it imported (the fork server imports them once for every worker) and its reward-shaping
    coefficients (name -> value; {} for envs without: population-based training mutates them)."""
    modules_before = set(sys.modules)
    me = psutil.Process()
    children_before = {c.pid for c in me.children(recursive=True)}
    uss_before, shm_before = _uss(me), shm_used_bytes()
    try:
        env = make_env(cfg, env_index=0)
    except (ImportError, FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e).splitlines()[0] if str(e) else repr(e)) from None
    try:
        env_bytes = (max(0, _uss(me) - uss_before)
                     + max(0, shm_used_bytes() - shm_before))  # VizDoom: screen buffers in /dev/shm
        env_bytes += sum(_uss(c) for c in me.children(recursive=True) if c.pid not in children_before)
        obs_space, action_space = env.observation_space, env.action_space
        shaping = dict(sorted(env.reward_shaping_defaults().items())) if hasattr(env, "reward_shaping_defaults") else {}
    finally:
        env.close()
    modules = sorted({m.split(".")[0] for m in set(sys.modules) - modules_before if not m.startswith("_")})
    return obs_space, action_space, env_bytes, modules, shaping


def _uss(process) -> int:
    """Memory private to `process` (bytes; RSS where USS cannot be read)."""
    try:
        return process.memory_full_info().uss
    except (psutil.Error, AttributeError):
        try:
            return process.memory_info().rss
        except psutil.Error:
            return 0


# Private memory of one worker process forked from the fork server (torch and the envs' modules are shared with it),
# with a margin: measured on the 2-core VM with doom_battle, a rollout worker 13 MiB (USS; 43 MiB PSS), a policy worker
# 41 MiB. The learner's activations and batches come on top, in proportion to the samples of an SGD step (~1 GiB
# measured with the paper's model and batch 2048: a population of small models is not refused for 1 GiB per learner).
WORKER_PROCESS_BYTES = 80 * 2**20
LEARNER_WORKSPACE_BYTES, LEARNER_WORKSPACE_BATCH = 2**30, 2048
# Copies of the model's parameters the learner holds: the model, its gradients, Adam's two moments, the shared copy
# the policy workers read (each policy worker holds one more).
LEARNER_MODEL_COPIES = 5
# A process that uses CUDA (a learner, a policy worker) costs the host its CUDA context instead: the driver's state, the
# kernels it loads, the cuBLAS/cuDNN handles. Not measured here (no GPU on the dev VM); reported: +116 MB of peak RSS
# for a first CUDA tensor (pytorch#113326, cu118), ~310 MB per process (pytorch#2045), +1.2 GB at a first CUDA use
# (pytorch#106511). Their low end: RSS also counts library pages that the processes share.
CUDA_PROCESS_HOST_BYTES = 256 * 2**20
# Device memory of one CUDA context, a lower bound: 274 MiB measured with lazy kernel loading (pytorch#86509, torch's
# default since 1.13; 636 MiB loading eagerly), ~300-400 MiB quoted by torch's maintainers (pytorch#107667,
# pytorch#109888), ~534 MiB per context on an H100 (meta-pytorch/torchcomms#777). Below the lowest, so that a
# refusal is never wrong: a context grows as the process loads kernels.
CUDA_CONTEXT_DEVICE_BYTES = 256 * 2**20


def device_memory(device: str) -> tuple[int, int]:
    """(free, total) bytes of the GPU `device`. Creates this process's CUDA context (the runner needs one anyway, for
    the shared weights; nothing forks from it), so that free no longer counts it."""
    return torch.cuda.mem_get_info(torch.device(device))


def check_memory(cfg: Config, buffer_bytes: int, model_bytes: int, env_bytes: int, device: str = "cpu",
                 batch_trajs: int = 0, obs_space=None, rnn_state_size: int = 0) -> None:
    """Refuse, in one line with the estimate, a run that cannot fit in this machine's memory, before anything of it is
    allocated or started. env_bytes: what one env was measured to take (probe_env). On a CUDA `device` also the GPU's:
    a learner's batch of `batch_trajs` trajectories of `obs_space` observations and RNN states of `rnn_state_size`
    floats lies there, with the model copies and one CUDA context per learner and policy worker."""
    envs = num_envs(cfg)
    policies = cfg.num_policies
    cuda = torch.device(device).type == "cuda"
    if cuda:  # first: the runner's own context is then used memory, on the host and on the device
        free, total = device_memory(device)
    # each learner and policy worker creates a CUDA context (--serial_mode: one policy worker per policy, all of them
    # in the runner's process)
    policy_workers = policies if cfg.mode.serial else policies * cfg.policy_workers_per_policy
    cuda_processes = policies + policy_workers if cuda and not cfg.mode.serial else 0
    processes = cfg.num_workers + policies * (cfg.policy_workers_per_policy + 1)
    parts = {
        "trajectory buffers": buffer_bytes,
        f"{envs} envs": envs * env_bytes,
        f"{processes} processes" + (f" ({cuda_processes} with CUDA)" if cuda_processes else ""):
        (processes - cuda_processes) * WORKER_PROCESS_BYTES + cuda_processes * CUDA_PROCESS_HOST_BYTES
        + policies * LEARNER_WORKSPACE_BYTES * cfg.batch_size // LEARNER_WORKSPACE_BATCH,
    }
    if not cuda:  # (on CUDA they lie on the device)
        parts["model copies"] = model_bytes * policies * (LEARNER_MODEL_COPIES + cfg.policy_workers_per_policy)
    need, have = sum(parts.values()), psutil.virtual_memory().available
    shm_need, shm_have = buffer_bytes + (0 if cuda else model_bytes * policies), shm_available_bytes()
    gib = lambda b: f"{b / 2**30:.1f} GiB"  # noqa: E731
    detail = ", ".join(f"{k} {gib(v)}" for k, v in parts.items())
    if need > 0.9 * have:
        raise ConfigError(f"this configuration needs about {gib(need)} of memory ({detail}) but {gib(have)} "
                          "is available; lower --num_workers, --num_envs_per_worker, --num_policies, --batch_size "
                          "or the model size")
    if shm_need > 0.9 * shm_have:
        raise ConfigError(f"not enough shared memory: trajectory buffers and weights need {gib(shm_need)}, /dev/shm "
                          f"has {gib(shm_have)} free; lower --num_envs_per_worker/--batch_size or enlarge /dev/shm")
    if not cuda:
        return
    # the batch's observations and RNN states ([T+1] and the final one); its other per-step entries are left out
    batch = batch_trajs * (cfg.rollout + 2) * (obs_bytes(obs_space) + 4 * rnn_state_size)
    gpu = {
        f"{cuda_processes} CUDA processes x context": cuda_processes * CUDA_CONTEXT_DEVICE_BYTES,
        # the model, its gradients, Adam's two moments and one training batch (a second one while the next is
        # gathered only when training is the slower of the two)
        f"{policies} learners": policies * (4 * model_bytes + batch),
        "shared weights and policy workers' models": model_bytes * (policies + policy_workers),
    }
    gpu_need, index = sum(gpu.values()), torch.device(device).index or 0
    if gpu_need > free:
        detail = ", ".join(f"{k} {gib(v)}" for k, v in gpu.items())
        raise ConfigError(f"--device {cfg.device}: this layout needs at least {gib(gpu_need)} of GPU memory ({detail}) "
                          f"but GPU {index} has {gib(free)} free (of {gib(total)}); lower --num_policies, "
                          "--policy_workers_per_policy or --batch_size")


def check_checkpoint(cfg: Config, exp_dir: Path, meta: dict, world: ranks.World) -> list[tuple[int, int]]:
    """Before anything is written: the checkpoint to resume from must fit this env and model (meta: checkpoint_meta of
    this run's model), and have been trained by as many data-parallel ranks. Returns each policy's checkpoint as
    (version, frames); (0, 0) where there is none, and for every policy unless --restart_behavior resume."""
    resumed: list[tuple[int, int]] = [(0, 0)] * cfg.num_policies
    if cfg.restart_behavior != "resume":
        return resumed
    try:
        for p in range(cfg.num_policies):
            manager = CheckpointManager(exp_dir, policy_id=p, keep_checkpoints=cfg.keep_checkpoints)
            state = manager.load("latest")
            if state is not None:
                check_compatible(state["meta"], meta, state.get("path", exp_dir / f"checkpoint_p{p}"))
                resumed[p] = (int(state["policy_version"]), int(state["env_steps"]))
                ranks = int(state.get("world_size", 1))
                if ranks != world.world_size:
                    how = ("by a run of {} rank(s) (policy p on rank p mod {})" if cfg.num_policies > 1 else
                           "by {} data-parallel rank(s)").format(ranks, ranks)
                    raise CheckpointError(
                        f"{state.get('path', exp_dir)} was trained {how}, this run has {world.world_size}: resume "
                        f"with the same number (torchrun --nnodes x --nproc-per-node = {ranks}), or start a new "
                        "experiment")
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    return resumed


def already_trained(cfg: Config, resumed: list[tuple[int, int]], world: ranks.World) -> bool:
    """A resumed experiment whose checkpoints reached --train_for_env_steps already (every policy's; with torchrun,
    all ranks' frames together, each rank having trained as many as rank 0's checkpoint records)."""
    trained = (world.world_size if world.data_parallel(cfg.num_policies) else 1) * min(steps for _, steps in resumed)
    return cfg.restart_behavior == "resume" and trained >= cfg.train_for_env_steps


def nothing_to_train(cfg: Config, resumed: list[tuple[int, int]], world: ranks.World, exp_dir: Path) -> int:
    """A finished experiment resumed with the same budget: start nothing, write nothing (no checkpoint re-saved, no
    best relabelled, no config.json, log or event file); say so with the experiment's counters (rank 0: to the other
    ranks too). Exit code 0."""
    if world.rank == 0:
        ranks.publish_start(world, 0, "nothing to train: the experiment reached --train_for_env_steps "
                                  f"{cfg.train_for_env_steps} already", cfg.distributed_timeout_sec)
    if cfg.num_policies > 1:
        counters = (f"policy versions {', '.join(str(v) for v, _ in resumed)}; env frames "
                    f"{', '.join(str(f) for _, f in resumed)}")
    else:
        version, frames = resumed[0]
        counters = f"policy version {version}, {frames} env frames" + (
            f" per rank, {world.world_size} ranks" if world.distributed else "")
    log.info("Done: nothing to train: the experiment reached --train_for_env_steps %d already (%s); raise "
             "--train_for_env_steps to train on. Nothing was written. Checkpoints: %s", cfg.train_for_env_steps,
             counters, exp_dir / ("checkpoint_p*" if cfg.num_policies > 1 else "checkpoint_p0"))
    return 0



@contextlib.contextmanager
def telling_other_ranks(world: ranks.World, timeout_sec: float):
    """Rank 0's start-up (torchrun): if it raises before the run starts, the other ranks get its exit code (bad input
    2, Ctrl-C 130, else 1) and its line (ranks.publish_start; once the run started, they already know)."""
    try:
        yield
    except BaseException as e:
        if world.distributed:
            code = 2 if isinstance(e, ConfigError) else 130 if isinstance(e, KeyboardInterrupt) else 1
            ranks.publish_start(world, code, first_line(e, limit=None), timeout_sec)
        raise


def follow_rank0(cfg: Config, world: ranks.World, resumed: list[tuple[int, int]], exp_dir: Path) -> int | None:
    """Ranks > 0: None to train (a population's: check_rank_directory first), else the exit code to end with: its own
    files show the budget reached (a shared filesystem), or rank 0 stopped (its line is repeated here: 0 is logged, 2
    raises ConfigError, others RunError)."""
    if already_trained(cfg, resumed, world):
        return nothing_to_train(cfg, resumed, world, exp_dir)
    try:
        verdict = ranks.await_start(world, cfg.distributed_timeout_sec)
    except RuntimeError as e:
        raise RunError(str(e)) from None
    if verdict is None:
        check_rank_directory(cfg, world, exp_dir)
        return None
    code, line = verdict
    if code == 0:
        log.info("Done: rank 0: %s. Nothing was written on this rank.", line)
        return 0
    raise (ConfigError if code == 2 else RunError)(f"rank 0 did not start the run: {line}")


def check_rank_directory(cfg: Config, world: ranks.World, exp_dir: Path) -> None:
    """Past rank 0, a population's new run (not --restart_behavior resume): this rank writes its policies' checkpoints
    into its own experiment directory, which rank 0 moved aside or deleted only if the filesystem is shared. One left
    from an earlier run would be resumed from later: refused in one line (called once rank 0 started the run)."""
    if cfg.restart_behavior == "resume" or world.rank == 0 or world.data_parallel(cfg.num_policies):
        return
    old = [p for p in world.policies(cfg.num_policies) if any((exp_dir / f"checkpoint_p{p}").glob("checkpoint_*.pth"))]
    if old:
        raise ConfigError(f"--restart_behavior {cfg.restart_behavior}: {exp_dir} on rank {world.rank}'s machine holds "
                          f"checkpoints of policies {', '.join(map(str, old))} from an earlier run (rank 0 moves or "
                          "deletes only its own machine's directory): remove them there, or resume")


def remove_leftovers() -> None:
    """Remove what the engines of killed runs left in /dev/shm (before the runner's memory check), saying so."""
    removed, freed = remove_stale_leftovers()
    if removed:
        log.info("Removed %d files (%.1f MiB of memory) from /dev/shm that engines of killed runs left there",
                 removed, freed / 2**20)


def prepare_experiment_dir(cfg: Config) -> Path:
    """--restart_behavior: resume keeps the directory, restart moves it aside, overwrite deletes it. Restart and
    overwrite act only on a real directory (not a link) inside the train dir that holds an experiment of ours (its
    config.json): anything else is refused in one line, so that nothing outside the experiment is ever touched."""
    exp_dir = experiment_dir(cfg)
    try:
        if cfg.restart_behavior in ("restart", "overwrite") and (exp_dir.exists() or exp_dir.is_symlink()):
            if exp_dir.is_symlink() or not exp_dir.is_dir() or not (exp_dir / "config.json").is_file():
                raise ConfigError(f"--restart_behavior {cfg.restart_behavior}: {exp_dir} is not an experiment "
                                  "directory (no config.json in it); refusing to move or delete it")
            if cfg.restart_behavior == "restart":
                stamp, n = time.strftime("%Y%m%d_%H%M%S"), 0
                aside = exp_dir.with_name(f"{exp_dir.name}_old_{stamp}")
                while aside.exists():  # two restarts within a second
                    n += 1
                    aside = exp_dir.with_name(f"{exp_dir.name}_old_{stamp}_{n}")
                exp_dir.rename(aside)
                print(f"Moved the old experiment directory to {aside}")
            else:
                shutil.rmtree(exp_dir)
        exp_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(f"cannot prepare the experiment directory {exp_dir}: {e.strerror or e}") from None
    return exp_dir
