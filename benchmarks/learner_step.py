"""Learner throughput: samples/s of `APPO.train` for the paper's Doom model on CPU, one row per image encoder.

Model: simplified Doom architecture (the encoder of --encoders, default each of convnet_simple (the paper's),
convnet_impala, convnet_atari and resnet_impala, on [3, 72, 128] uint8 frames (--frames), FC 512, GRU 512,
Discrete(7) actions), batch_size 2048 samples = 64 trajectories of T = 32 (+1 bootstrap step),
recurrence 32, 1 epoch, 1 minibatch per training batch (the paper's Table A.5). Episode ends are
sprinkled in (p = 0.02 per step) so the RNN takes the reset path as in real training.

    python benchmarks/learner_step.py                      # 1 and 2 torch threads, every encoder
    python benchmarks/learner_step.py --encoders convnet_simple resnet_impala --threads 2
    python benchmarks/learner_step.py --threads 2 --iters 5 --cpu_block 256 --no_channels_last
    python benchmarks/learner_step.py --per_step           # also time the per-time-step reference learner
    python benchmarks/learner_step.py --frames 4 84 84 --encoders convnet_atari --threads 2 --nchw_input_too
                                                           # Atari's frames; also with the first conv reading NCHW

Reference points:
- the project's naive single-threaded learner measured ~500 samples/s on this model (NAIVE_BASELINE;
  the ratio is printed);
- `--cpu_block 0` runs the encoder as one 2112-frame call (this learner without cache blocking:
  ~640 samples/s with 1 thread, ~1150 with 2 on the 2-core AMD EPYC dev VM);
- `--per_step` times a straightforward per-time-step learner on the same batch (encoder called once
  per time step on 64 frames, Python GRUCell loop, float copy plus separate /255 of the frames, a second
  forward for the bootstrap value). Its 64-frame encoder calls happen to be cache-sized too, so on CPU it
  runs about as fast as APPO.train: the learner is compute-bound in the convolutions.

Cost model (convnet_simple, per batch of 2048 samples): encoder forward 2112 frames x 17.9 MFLOP = 38 GFLOP, its
backward ~62 GFLOP (no input gradient for the first conv), GRU ~20 GFLOP: ~120 GFLOP. At ~1.9 s with
1 thread that is ~65 GFLOP/s, ~80% of this machine's single-thread sgemm peak (80 GFLOP/s); with 2 threads
~1.1 s, ~60% of the 2-thread sgemm peak (176 GFLOP/s).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gymnasium import spaces  # noqa: E402

from sf.cfg import default_cfg as make_cfg  # noqa: E402
from sf.learning.appo import APPO  # noqa: E402
from sf.model.actor_critic import create_actor_critic, resolve_precision  # noqa: E402
from sf.model import encoders  # noqa: E402
from sf.model.encoders import CONV_ARCHITECTURES, RESNET_ARCHITECTURES  # noqa: E402


NAIVE_BASELINE = 500.0  # samples/s, naive single-threaded learner (the reference, convnet_simple)
ENCODERS = (*CONV_ARCHITECTURES, *RESNET_ARCHITECTURES)
OBS_SPACE = spaces.Dict({"obs": spaces.Box(0, 255, (3, 72, 128), np.uint8)})  # (--frames replaces it)
ACTION_SPACE = spaces.Discrete(7)


def make_batch(model, n: int, t: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    frames = OBS_SPACE["obs"].shape
    h = model.rnn_state_size
    logits = torch.randn((n, t, ACTION_SPACE.n), generator=g)
    actions = torch.randint(0, ACTION_SPACE.n, (n, t, 1), generator=g)
    log_probs = torch.log_softmax(logits, -1).gather(-1, actions).squeeze(-1)
    return {
        "obs": {"obs": torch.randint(0, 256, (n, t + 1, *frames), dtype=torch.uint8, generator=g)},
        "rnn_states": torch.randn((n, t + 1, h), generator=g) * 0.1,
        "actions": actions,
        "action_logits": logits,
        "log_probs": log_probs,
        "values": torch.randn((n, t), generator=g),
        "policy_versions": torch.zeros((n, t), dtype=torch.int64),
        "rewards": torch.randn((n, t), generator=g),
        "dones": (torch.rand((n, t), generator=g) < 0.02).float(),
        "truncated": torch.zeros((n, t)),  # no time limits in this batch (APPO bootstraps truncated steps)
        "final_obs": {"obs": torch.zeros((n, *frames), dtype=torch.uint8)},  # (none kept: final_t -1)
        "final_rnn": torch.zeros((n, h)),
        "final_t": torch.full((n,), -1, dtype=torch.int64),
    }


class PerStepLearner:
    """The straightforward way: encode step by step, GRUCell loop, second forward for the bootstrap."""

    def __init__(self, model, cfg):
        self.model, self.cfg = model, cfg
        rnn = model.core.rnn
        self.cell = torch.nn.GRUCell(rnn.input_size, rnn.hidden_size)
        self.cell.load_state_dict({k.replace("_l0", ""): v for k, v in rnn.state_dict().items()})
        self.opt = torch.optim.Adam(list(model.parameters()) + list(self.cell.parameters()), lr=cfg.learning_rate)

    def _step(self, x, h):
        enc = self.model.encoder.obs_encoder
        x = x.float() / 255.0
        x = enc.features(enc.first_conv(x)).flatten(1)
        for fc in enc.fc_layers:
            x = enc.act(fc(x))
        h = self.cell(x, h)
        logits, values = self.model._heads(h, h)
        return logits, values, h

    def train(self, exp, version):
        from sf.learning.losses import appo_loss
        from sf.learning.vtrace import vtrace
        cfg = self.cfg
        obs, t = exp["obs"]["obs"], exp["rewards"].shape[1]
        h = exp["rnn_states"][:, 0]
        logits, values = [], []
        for s in range(t):
            if s > 0:
                h = h * (1 - exp["dones"][:, s - 1:s])
            lg, v, h = self._step(obs[:, s], h)
            logits.append(lg)
            values.append(v)
        with torch.no_grad():
            _, boot, _ = self._step(obs[:, t], h * (1 - exp["dones"][:, t - 1:t]))
        logits, values = torch.stack(logits), torch.stack(values)
        dist = self.model.action_distribution(logits)
        lp = dist.log_prob(exp["actions"].transpose(0, 1))
        vt = vtrace(exp["log_probs"].t(), lp.detach(), exp["rewards"].t(), values.detach(), boot,
                    cfg.gamma * (1 - exp["dones"].t()))
        terms = appo_loss(lp, exp["log_probs"].t(), vt.advantages, values, exp["values"].t(), vt.vs, dist.entropy(),
                          None,
                          clip_ratio=cfg.ppo_clip_ratio, clip_value=cfg.ppo_clip_value,
                          value_loss_coeff=cfg.value_loss_coeff, exploration_loss_coeff=cfg.exploration_loss_coeff)
        self.opt.zero_grad()
        terms["loss"].backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.opt.step()


def timeit(fn, warmup: int, iters: int, device: str = "cpu") -> float:
    """Median seconds per call (the median resists the noise of a shared machine); on CUDA each call is timed to the
    end of its kernels (a synchronize after it: the learner itself never synchronizes the host within a step)."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def to_device(tree, device):
    """The batch's nested dict of tensors on `device`."""
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    return tree.to(device)


def in_shared_memory(model, host: dict):
    """The batch `host` written into trajectory buffers (shared memory, as the rollout and policy workers leave it):
    (buffers, slots [n]) for TrajectoryBuffers.gather, the learner's copy to the device."""
    from sf.buffers.trajectory_buffers import TrajectoryBuffers
    n, t = host["rewards"].shape
    buffers = TrajectoryBuffers(n, t, OBS_SPACE, ACTION_SPACE, model.rnn_state_size)
    for k, v in host.items():
        dst = buffers.obs if k == "obs" else getattr(buffers, k)
        if isinstance(v, dict):
            for kk, vv in v.items():
                dst[kk].copy_(vv)
        else:
            dst.copy_(v)
    return buffers, torch.arange(n)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--encoders", nargs="+", default=list(ENCODERS), choices=ENCODERS,
                   help="image encoders (--encoder_conv_architecture) to time, one row each (default: all)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=2048)
    p.add_argument("--rollout", type=int, default=32)
    p.add_argument("--rnn_type", default="gru", choices=("gru", "lstm"))
    p.add_argument("--no_channels_last", action="store_true", help="conv activations in NCHW instead of NHWC")
    p.add_argument("--cpu_block", type=int, default=None, help="frames per conv call on CPU (default: the model's)")
    p.add_argument("--per_step", action="store_true", help="also time the per-time-step reference learner")
    p.add_argument("--frames", type=int, nargs=3, default=[3, 72, 128], metavar=("C", "H", "W"),
                   help="the uint8 frames' shape (Atari: 4 84 84)")
    p.add_argument("--nchw_input_too", action="store_true", help="also time each row with the first convolution "
                   "reading NCHW (on CPU in float32 it reads NHWC from NHWC_INPUT_CHANNELS channels on)")
    p.add_argument("--precision", default="float32", choices=("float32", "bfloat16", "auto"),
                   help="the encoder's arithmetic (train.py --precision; auto as in async training)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]: on CUDA, also timed with the batch's gather out "
                   "of shared memory in each step (TrajectoryBuffers.gather: the learner's pinned staging and "
                   "asynchronous copy; trajectories live in host shared memory)")
    args = p.parse_args()
    global OBS_SPACE
    OBS_SPACE = spaces.Dict({"obs": spaces.Box(0, 255, tuple(args.frames), np.uint8)})
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"--device {args.device}: torch sees no CUDA device (use --device cpu)")

    n, t = args.batch_size // args.rollout, args.rollout
    torch.manual_seed(0)
    try:
        from common import header  # benchmarks/common.py: machine, command, date
        header(f"learner step (APPO.train) throughput on {args.device}")
        print(f"torch {torch.__version__}" + (f", {torch.cuda.get_device_name(args.device)}"
                                              if args.device.startswith("cuda") else ""))
    except ImportError:
        print(f"machine: {os.cpu_count()} cores, {_cpu_name()}; torch {torch.__version__}; "
              f"python {platform.python_version()}")
        print("command: python " + " ".join(sys.argv))
    print(f"model: Doom simplified, ENCODER on {list(args.frames)} uint8, FC 512, {args.rnn_type.upper()} 512, "
          f"batch {args.batch_size} = {n} x T {t} (+1 bootstrap step), channels_last={not args.no_channels_last}")
    for arch, threads in [(a, th) for a in args.encoders for th in args.threads]:
        cfg = make_cfg(rollout=args.rollout, recurrence=args.rollout, batch_size=args.batch_size,
                       rnn_type=args.rnn_type, encoder_conv_architecture=arch)
        torch.set_num_threads(threads)
        model = create_actor_critic(cfg, OBS_SPACE, ACTION_SPACE, channels_last=not args.no_channels_last)
        if args.cpu_block is not None:
            model.encoder.obs_encoder.cpu_block = args.cpu_block
        model.to(args.device)
        model.compute_dtype = resolve_precision(args.precision, model, args.device, deterministic=False)
        appo = APPO(model, cfg, args.device)
        host = make_batch(model, n, t)
        exp = to_device(host, args.device)
        version = [0]

        def step():
            appo.train(exp, version[0])
        sec = timeit(step, args.warmup, args.iters, args.device)
        line = (f"{arch} threads={threads} encoder {model.compute_dtype or torch.float32}: "
                f"APPO.train {sec * 1000:.0f} ms/batch (median), {args.batch_size / sec:.0f} samples/s")
        if arch == "convnet_simple" and OBS_SPACE["obs"].shape == (3, 72, 128):
            line += f" (x{args.batch_size / sec / NAIVE_BASELINE:.1f} the naive baseline's {NAIVE_BASELINE:.0f})"
        if args.nchw_input_too:
            kept, encoders.NHWC_INPUT_CHANNELS = encoders.NHWC_INPUT_CHANNELS, sys.maxsize
            try:
                nsec = timeit(step, args.warmup, args.iters, args.device)
            finally:
                encoders.NHWC_INPUT_CHANNELS = kept
            line += f"; first conv reading NCHW {args.batch_size / nsec:.0f} samples/s (this row x{nsec / sec:.2f})"
        if torch.device(args.device).type == "cuda":
            buffers, slots = in_shared_memory(model, host)
            csec = timeit(lambda: appo.train(buffers.gather(slots, args.device), version[0]),
                          args.warmup, args.iters, args.device)
            line += (f"; with the batch gathered from shared memory as the learner does it (pinned staging, "
                     f"asynchronous copy) {args.batch_size / csec:.0f} samples/s")
        if args.per_step and args.rnn_type == "gru":
            ref = PerStepLearner(create_actor_critic(cfg, OBS_SPACE, ACTION_SPACE), cfg)
            nsec = timeit(lambda: ref.train(exp, 0), args.warmup, args.iters)
            line += f"; per-step reference {args.batch_size / nsec:.0f} samples/s (APPO.train x{nsec / sec:.2f})"
        print(line, flush=True)


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown cpu"


if __name__ == "__main__":
    main()
