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
the check run shows how far off it is on this machine. The cache is per env (and engine: --env_engine envpool with its
--env_agents is its own entry) and host: measure again after changing
the model or the batch shape (python -m sf.autolayout overwrites it).
"""
# The package: model.py (the cost model and the choice: arithmetic only), measure.py (measuring this machine, the
# check run, the measuring child of train.py --num_workers auto), cache.py (the cached layouts), __main__.py (the
# command line, which prints this docstring as its --help).
from sf.autolayout.cache import cache_path
from sf.autolayout.measure import resolve_auto, run_training

__all__ = ["cache_path", "resolve_auto", "run_training"]
