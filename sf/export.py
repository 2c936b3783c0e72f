"""A trained policy as an ONNX graph that runs with onnxruntime alone (no torch, no this package).

    python -m sf.export EXP [--policy N] [--format onnx] [--checkpoint {best,latest}] [--train_dir DIR]

EXP is the experiment directory that train.py wrote (train_dir/<experiment>), or with --train_dir the experiment's
name in DIR. Writes EXP/export/policy_p{N}.onnx for policy N, or for every policy of a population (--num_policies > 1)
without --policy, from the policy's best checkpoint when it has one, else its latest (--checkpoint picks one kind).
The model is rebuilt and loaded as enjoy does (sf.policy_loading.load_policy: the saved config.json, the checkpoint
checked against it) and traced through its own `forward_step`, so the graph computes what the policy workers compute.

The graph (opset 17, every batch dimension B dynamic):
    inputs   one per observation key, named by the key ("obs", "measurements", ...): [B, *shape] in the env's dtype
             (uint8 frames stay uint8: the scaling to [0, 1] and the running mean/std input normalization are inside)
             rnn_state [B, H]        recurrent policies only (zeros at an episode's start)
    outputs  action_logits [B, L]    Discrete / MultiDiscrete: each sub-space's logits, concatenated in order
             or action_mean [B, A], action_log_std [B, A]   Box: the diagonal Gaussian (log-std as sampled: clamped)
             value [B]               in return units (denormalized, as forward_step returns it)
             new_rnn_state [B, H]    recurrent policies only
Its metadata (onnxruntime: session.get_modelmeta().custom_metadata_map) holds the env name, the policy, the checkpoint's
policy version and env frames, the spaces, and the experiment's configuration as JSON ("sf_config": what make_env needs
to build the same env, see examples/onnx_play.py).

Each file is checked before it is written: onnxruntime runs it on a batch of observations sampled from the spaces, at
another batch size than the one traced, and must agree with the torch model (else one line, exit code 1). Files are
written atomically (sf/utils/files.py). Bad input (no such experiment, a directory train.py did not write, no
checkpoint, a checkpoint of another model, --policy out of range, an export path that cannot be written) is one line on
stderr and exit code 2, with nothing written.

Needs the `export` extra: pip install -e .[export] (onnx, onnxruntime). The exporter is torch's TorchScript-based one
(torch.onnx.export(dynamo=False)): the torch.export-based one needs onnxscript and gains nothing for these models.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np

from sf.cfg import Config, ConfigError, OneLineArgumentParser, RunError, parse_cfg, run_guarded
from sf.cfg.parse import read_json_object
from sf.policy_loading import load_policy, open_env
from sf.utils.files import one_line, write_bytes_atomic
from sf_envs.registry import UnknownEnvError, env_spec

# torch and onnx are imported where used: --help and bad input answer at once.

OPSET = 17
EXPORT_DIR = "export"
CHECK_ATOL = 1e-4  # onnxruntime vs torch on the export's own check (float32; the tests hold 1e-5 on real episodes)


# --- the experiment (shared with sf.card, sf.eval) -------------------------------------------------------------------
def experiment_path(exp: str, train_dir: str | None) -> Path:
    """The experiment directory EXP names: DIR/EXP with --train_dir, else EXP itself (as python -m sf.eval reads it).
    One-line ConfigError when it is not an existing directory."""
    d = Path(train_dir) / exp if train_dir is not None else Path(exp)
    if d.name in ("", ".", ".."):  # `.` or `..`: the experiment is the name of the directory they stand for
        d = d.resolve()
    try:
        if d.is_dir():
            return d
        what = "is not a directory" if os.path.lexists(d) else "does not exist"
    except OSError as e:  # a name too long for the filesystem, say
        raise RunError(f"cannot read {d}: {e.strerror or e}") from None
    raise ConfigError(f"experiment directory {d} {what}; give train_dir/<experiment>, or <experiment> --train_dir DIR")


def add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    """EXP and --train_dir, as every command that reads an experiment takes them (resolved by experiment_path)."""
    parser.add_argument("experiment", metavar="EXP",
                        help="the experiment directory (train_dir/<experiment>), or its name with --train_dir")
    parser.add_argument("--train_dir", default=None, help="the directory holding the experiment EXP")


def experiment_env(exp_dir: Path) -> str:
    """The env the experiment in exp_dir trained on (its config.json). One-line ConfigError when exp_dir is not an
    experiment directory that train.py wrote, or its env is not one this installation knows."""
    saved = exp_dir / "config.json"
    if not saved.is_file():
        raise ConfigError(f"{exp_dir} is not an experiment directory (no config.json); give a directory that train.py "
                          f"wrote, such as train_dir/<experiment>")
    env = read_json_object(saved, str(saved)).get("env")
    if not isinstance(env, str) or not env:
        raise ConfigError(f"{saved}: no 'env' (a string) in it; it was not written by train.py")
    try:
        env_spec(env)
    except (UnknownEnvError, ValueError) as e:
        raise ConfigError(f"{saved}: key 'env': {e}") from None
    return env


def experiment_cfg(exp_dir: Path, prog: str) -> Config:
    """The configuration the experiment trained with (its config.json, as enjoy resolves it), on the CPU."""
    return parse_cfg(["--env", experiment_env(exp_dir), "--experiment", exp_dir.name, "--train_dir",
                      str(exp_dir.parent), "--device", "cpu"], mode="enjoy", prog=prog)


def checkpoint_kind(exp_dir: Path, policy_id: int, kind: str | None) -> str:
    """`kind` when given, else "best" when the policy has a best checkpoint, else "latest"."""
    if kind is not None:
        return kind
    from sf.learning.checkpoint import CheckpointError  # (imports torch)
    from sf.learning.checkpoint_store import CheckpointManager
    try:
        return "best" if CheckpointManager(exp_dir, policy_id=policy_id, read_only=True).best() else "latest"
    except CheckpointError as e:
        raise RunError(str(e)) from None


# --- the graph -------------------------------------------------------------------------------------------------------
def _exportable(model):
    """`model` as a module whose forward takes the graph's inputs positionally and returns its outputs (the module
    docstring's table)."""
    import torch
    from gymnasium import spaces

    class OnnxPolicy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.keys = list(model.obs_space.spaces)
            self.box = isinstance(model.action_space, spaces.Box)

        def forward(self, *inputs):
            """inputs: each obs key's [B, *shape], then rnn_state [B, H] if recurrent."""
            obs = dict(zip(self.keys, inputs))
            if model.is_recurrent:
                rnn = inputs[len(self.keys)]
            else:  # the feed-forward core ignores its state: zeros, so the graph has no such input
                rnn = torch.zeros((inputs[0].shape[0], model.rnn_state_size), dtype=torch.float32)
            out = model.forward_step(obs, rnn)
            if self.box:
                dist = model.action_distribution(out.action_logits)
                heads = (dist.mean, dist.log_std)
            else:
                heads = (out.action_logits,)
            return (*heads, out.values) + ((out.new_rnn_states,) if model.is_recurrent else ())

    return OnnxPolicy().eval()


def io_names(model) -> tuple[list[str], list[str]]:
    """(input names, output names) of the graph of `model`."""
    from gymnasium import spaces
    inputs = list(model.obs_space.spaces) + (["rnn_state"] if model.is_recurrent else [])
    heads = ["action_mean", "action_log_std"] if isinstance(model.action_space, spaces.Box) else ["action_logits"]
    return inputs, heads + ["value"] + (["new_rnn_state"] if model.is_recurrent else [])


def sample_inputs(model, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A batch of observations sampled from the spaces (each key's [batch, *shape] in its dtype) and, if recurrent,
    a rnn_state [batch, H] of small random values: the feeds of an onnxruntime session."""
    space = model.obs_space
    space.seed(seed)
    feeds = {k: np.stack([np.asarray(space[k].sample(), dtype=space[k].dtype) for _ in range(batch)])
             for k in space.spaces}
    if model.is_recurrent:
        feeds["rnn_state"] = np.random.default_rng(seed).normal(
            0, 0.5, (batch, model.rnn_state_size)).astype(np.float32)
    return feeds


def torch_outputs(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """What the graph must output for `feeds` (as sample_inputs gives them), computed by the torch model."""
    import torch
    inputs, _ = io_names(model)
    with torch.no_grad():
        return [t.numpy() for t in _exportable(model)(*(torch.as_tensor(feeds[k]) for k in inputs))]


def to_onnx(model, metadata: dict[str, str]) -> bytes:
    """The ONNX file of `model` (an ActorCritic on the CPU, eval mode) with `metadata` as its metadata_props."""
    import onnx
    import torch
    inputs, outputs = io_names(model)
    feeds = sample_inputs(model, batch=2)
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        # The legacy exporter's deprecation notice, and the tracer's notes on Python branches taken on the traced batch
        # size (the CPU conv blocking: both sides compute the same function; the check below runs another batch size).
        warnings.simplefilter("ignore")
        torch.onnx.export(_exportable(model), tuple(torch.as_tensor(feeds[k]) for k in inputs), buf, dynamo=False,
                          opset_version=OPSET, input_names=inputs, output_names=outputs,
                          dynamic_axes={n: {0: "batch"} for n in inputs + outputs})
    proto = onnx.load_from_string(buf.getvalue())
    for k, v in metadata.items():
        proto.metadata_props.add(key=k, value=v)
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def check_against_torch(data: bytes, model, batch: int = 3) -> float:
    """Runs the ONNX file `data` with onnxruntime on sampled inputs; returns the largest difference from the torch
    model's outputs. RunError when it is over CHECK_ATOL (relative to the output's size) or an output is missing."""
    import onnxruntime as ort
    feeds = sample_inputs(model, batch, seed=1)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)
    worst = 0.0
    for name, g, want in zip(io_names(model)[1], got, torch_outputs(model, feeds)):
        if g.shape != want.shape:
            raise RunError(f"the exported graph's {name} has shape {list(g.shape)}, the model's {list(want.shape)}")
        diff = float(np.max(np.abs(g - want) / (1.0 + np.abs(want)))) if g.size else 0.0
        if not diff <= CHECK_ATOL:
            raise RunError(f"the exported graph's {name} differs from the model's by {diff:.3g} (> {CHECK_ATOL})")
        worst = max(worst, diff)
    return worst


# --- the command -----------------------------------------------------------------------------------------------------
def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog=prog, allow_abbrev=False,
                                   description="Export a trained policy as an ONNX graph for onnxruntime.")
    add_experiment_arguments(parser)
    parser.add_argument("--policy", type=int, default=None, metavar="N",
                        help="the policy of a population to export (default: every policy)")
    parser.add_argument("--format", default="onnx", choices=["onnx"], help="the file format (default: onnx)")
    parser.add_argument("--checkpoint", default=None, choices=["best", "latest"],
                        help="the checkpoint to export (default: the best one if there is one, else the latest)")
    return parser


def _check_out_dir(out_dir: Path) -> None:
    """One-line ConfigError unless `out_dir` is (or can be made) a writable directory."""
    if os.path.lexists(out_dir) and not out_dir.is_dir():
        raise ConfigError(f"cannot write the export to {out_dir}: it exists and is not a directory; remove it")
    where = out_dir if out_dir.is_dir() else out_dir.parent
    if not os.access(where, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write the export to {out_dir}: directory {where} is not writable")


def run_export(args: argparse.Namespace, prog: str) -> list[Path]:
    """Checks everything (ConfigError), exports every requested policy, writes the files; returns their paths."""
    exp_dir = experiment_path(args.experiment, args.train_dir)
    cfg = experiment_cfg(exp_dir, prog)
    if args.policy is not None and not 0 <= args.policy < cfg.num_policies:
        have = "policy 0" if cfg.num_policies == 1 else f"policies 0-{cfg.num_policies - 1}"
        raise ConfigError(f"--policy {args.policy}: the experiment has {have} (--num_policies {cfg.num_policies})")
    policies = [args.policy] if args.policy is not None else list(range(cfg.num_policies))
    out_dir = exp_dir / EXPORT_DIR
    _check_out_dir(out_dir)
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"ONNX export needs the packages onnx and onnxruntime ({e}): "
                          "pip install -e .[export]") from None
    import torch

    env = open_env(cfg)
    try:
        obs_space, action_space = env.observation_space, env.action_space
    finally:
        env.close()

    files: list[tuple[Path, bytes, str]] = []  # every policy is loaded and exported before anything is written
    config_json = json.dumps(cfg.as_dict(), sort_keys=True)
    for p in policies:
        kind = checkpoint_kind(exp_dir, p, args.checkpoint)
        model, state = load_policy(cfg.replace(load_checkpoint_kind=kind), obs_space, action_space,
                                   torch.device("cpu"), p)
        model.eval()
        meta = {"env": cfg.env, "policy": str(p), "checkpoint": Path(state.get("path", "")).name,
                "policy_version": str(state["policy_version"]), "env_steps": str(state["env_steps"]),
                "observation_space": str(obs_space), "action_space": str(action_space),
                "recurrent": str(model.is_recurrent), "sf_config": config_json}
        try:
            data = to_onnx(model, meta)
        except Exception as e:  # noqa: BLE001 - an operator the exporter cannot translate: one line, not a traceback
            raise RunError(f"cannot export policy {p} to ONNX: {type(e).__name__}: {one_line(e, 300)}") from None
        worst = check_against_torch(data, model)
        note = (f"{kind} checkpoint {meta['checkpoint']} (policy version {state['policy_version']}, "
                f"{state['env_steps']} env frames); onnxruntime matches torch within {worst:.1e}")
        files.append((out_dir / f"policy_p{p}.onnx", data, note))
    try:
        out_dir.mkdir(exist_ok=True)
        for path, data, _ in files:
            write_bytes_atomic(path, data)
    except OSError as e:
        raise RunError(f"cannot write the export in {out_dir}: {e.strerror or e}") from None
    for path, _, note in files:
        print(f"Wrote {path}: {note}")
    return [path for path, _, _ in files]


def main(argv=None, *, prog: str = "python -m sf.export") -> int:
    """`python -m sf.export`: bad input is one line on stderr and exit code 2, an I/O failure one line and exit 1."""
    def body() -> int:
        run_export(build_parser(prog).parse_args(argv), prog)
        return 0

    return run_guarded(prog, body)


if __name__ == "__main__":
    sys.exit(main())
