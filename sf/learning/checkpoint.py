"""What a checkpoint holds: the state dict that is saved, what a run must match to load it, and what a loaded file
must contain to count as a checkpoint of ours.

A checkpoint is a dict (make_checkpoint_state) with the model and optimizer state, the policy version and env
steps, the learning rates, the RNG states and `meta` (env, spaces, model signature and options: check_compatible
compares them with the current run's). Everything stored is a tensor or a plain Python container/scalar (RNG
states are converted accordingly), so files load with `torch.load(weights_only=True)` and no pickled code runs
at load time.

Verification (verify_content). A file name is only a claim: a loaded content verifies when it is a dict with the
keys `model`, `policy_version`, `env_steps` and `meta`, and the name of its file is exactly the one its content
gives (`policy_version`, `env_steps` and, for a best file, `best_metric = {"name", "value"}`). What happens to
files that verify or fail is sf.learning.checkpoint_store's business.
"""
from __future__ import annotations

import hashlib
import math
import re
from typing import Any, NamedTuple

import torch

from sf.utils.files import one_line

CHECKPOINT_FORMAT = 1
# The names regular_name and best_name give; a file named otherwise is not looked at.
REGULAR_NAME_RE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pth$")
BEST_NAME_RE = re.compile(r"^best_(\d+)_(\d+)_(.+)_([-+]?(?:\d+\.?\d*|inf|nan))\.pth$")
# Keys every checkpoint written by make_checkpoint_state has; a file without them is not one of ours.
REQUIRED_KEYS = ("model", "policy_version", "env_steps", "meta")
# Types torch.load(weights_only=True) accepts (besides tensors); checked at save time so that a checkpoint
# that could not be loaded back is never written.
_SAFE_SCALARS = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


class CheckpointError(Exception):
    """A checkpoint cannot be used or written; the message is one line meant for the user (no traceback needed)."""
    stops_the_run = True  # self-healing: a replaced learner would meet it again (a full disk, a broken checkpoint)


# --------------------------------------------------------------------------------------------------------
# state content


def model_signature(model: torch.nn.Module) -> dict:
    """`{state_dict key: list(shape)}` of the model's parameters and buffers (normalizers included).

    Compact, made of plain types (stored in checkpoint meta) and comparable with `==`; check_compatible
    uses it to name the first differing entry instead of letting load_state_dict print a shape traceback.
    """
    return {name: list(t.shape) for name, t in model.state_dict().items()}


def weights_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of the model's state_dict (names, dtypes, shapes and bytes, in name order): equal digests mean bitwise
    identical weights (and normalizer statistics)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        flat = t.detach().cpu().contiguous().reshape(-1)  # (0-dim tensors cannot be viewed as bytes)
        h.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return h.hexdigest()


def _rng_states() -> dict:
    """The global generators the learner draws from, as weights_only-safe tensors: torch's (seeded from --seed, see
    sf.seeding). Python's `random` and numpy's global generator are not saved: the learner draws from neither, and
    they are not seeded, so saving them made two identical runs write different checkpoints."""
    states = {"torch": torch.get_rng_state()}
    # Only when CUDA is already in use: asking for its RNG state would otherwise create a CUDA context (and
    # take GPU memory) in a CPU-only learner; an untouched CUDA RNG is still at its seeded initial state.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return states


def make_checkpoint_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, policy_version: int,
                          env_steps: int, meta: dict, extra: dict | None = None) -> dict:
    """Everything needed to resume training exactly, in a form `torch.load(weights_only=True)` accepts.

    Keys: `model` (state_dict, normalizer buffers included), `optimizer` (state_dict or None),
    `policy_version`, `env_steps`, `lr` (one float per param group), `rng` (torch CPU, CUDA when in use),
    `meta` (what a run must match to load it, see check_compatible), `checkpoint_format`, plus the keys of `extra`
    (which must not clash with these).
    """
    state = {
        "checkpoint_format": CHECKPOINT_FORMAT,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "policy_version": int(policy_version),
        "env_steps": int(env_steps),
        "lr": [float(g["lr"]) for g in optimizer.param_groups] if optimizer is not None else [],
        "rng": _rng_states(),
        "meta": dict(meta),
    }
    for key, value in (extra or {}).items():
        # "path" is added by CheckpointManager.load, "best_metric" by save_best (and verified against the name)
        if key in state or key in ("path", "best_metric"):
            raise ValueError(f"extra checkpoint key {key!r} clashes with a standard key")
        state[key] = value
    return state


def restore_rng_states(state: dict) -> None:
    """Set the torch / CUDA RNGs to the states saved by make_checkpoint_state.

    Missing entries are skipped (a checkpoint from a CUDA run resumed on CPU keeps the CPU states only); the numpy and
    Python `random` states that older checkpoints hold are ignored (nothing in the learner draws from them).
    """
    rng = state.get("rng") or {}
    if "torch" in rng:
        # map_location may have moved the state onto a GPU; set_rng_state wants a CPU ByteTensor.
        torch.set_rng_state(rng["torch"].cpu().to(torch.uint8))
    if rng.get("cuda") and torch.cuda.is_available():
        saved = [s.cpu().to(torch.uint8) for s in rng["cuda"]]
        for i in range(min(len(saved), torch.cuda.device_count())):
            torch.cuda.set_rng_state(saved[i], i)


def check_weights_only_safe(obj: Any, where: str = "state") -> None:
    """Raise TypeError naming the first value that torch.load(weights_only=True) would refuse."""
    if torch.is_tensor(obj) or isinstance(obj, _SAFE_SCALARS):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, _SAFE_SCALARS):
                raise TypeError(f"checkpoint key {where}[{k!r}] has type {type(k).__name__}; "
                                "not loadable with weights_only=True")
            check_weights_only_safe(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, (list, tuple, set)):
        for i, v in enumerate(obj):
            check_weights_only_safe(v, f"{where}[{i}]")
        return
    raise TypeError(f"checkpoint value {where} has type {type(obj).__name__}; not loadable with weights_only=True "
                    "(store tensors, numbers, strings, lists or dicts)")


# --------------------------------------------------------------------------------------------------------
# compatibility


_META_LABELS = {"env": "env", "observation_space": "observation space", "action_space": "action space",
                "model": "model", "model_options": "model options"}
_META_OPTIONAL = {"model_options"}  # recorded since a later version: a checkpoint without it is taken as it is


def _model_mismatch(saved: dict, current: dict) -> str | None:
    """The first difference between two model signatures, as a phrase; None if they are equal."""
    for name, shape in current.items():
        if name not in saved:
            return f"has no model entry '{name}' that this run's model has (different model settings?)"
        if list(saved[name]) != list(shape):
            return (f"has model entry '{name}' of shape {list(saved[name])}; this run's model has {list(shape)} "
                    "(different model settings, e.g. --rnn_size/--hidden_size?)")
    for name in saved:
        if name not in current:
            return f"has model entry '{name}' that this run's model lacks (different model settings?)"
    return None


def check_compatible(saved_meta: dict, current_meta: dict, path) -> None:
    """Raise CheckpointError (one line naming `path` and the first mismatch) unless the checkpoint fits.

    Compared in this order: env, observation space, action space, model signature, model options, then any other key
    of `current_meta`. A key the current run has but the checkpoint lacks counts as a mismatch (except model options,
    which older checkpoints do not record).
    """
    if not isinstance(saved_meta, dict):
        raise CheckpointError(f"checkpoint {path} has no metadata (env, spaces, model); "
                              "it was not written by this trainer")
    ordered = [k for k in _META_LABELS if k in current_meta] + [k for k in current_meta if k not in _META_LABELS]
    for key in ordered:
        label = _META_LABELS.get(key, key)
        current = current_meta[key]
        if key not in saved_meta:
            if key in _META_OPTIONAL:
                continue
            raise CheckpointError(f"checkpoint {path} does not record its {label}; "
                                  f"this run has {label} {one_line(current)}")
        saved = saved_meta[key]
        if key == "model" and isinstance(saved, dict) and isinstance(current, dict):
            problem = _model_mismatch(saved, current)
            if problem:
                raise CheckpointError(f"checkpoint {path} {problem}")
            continue
        if saved == current:
            continue
        if key == "env":
            saved_as = saved_meta.get("action_space", "?")
            current_as = current_meta.get("action_space", "?")
            raise CheckpointError(f"checkpoint {path} is from env {saved} with action space {one_line(saved_as)}; "
                                  f"this run uses env {current} with action space {one_line(current_as)} "
                                  "(use another --experiment)")
        raise CheckpointError(f"checkpoint {path} has {label} {one_line(saved)}; "
                              f"this run has {label} {one_line(current)}")


def load_into(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict) -> None:
    """Load `state["model"]` (and `state["optimizer"]` when an optimizer is given) after checking shapes.

    The shapes are compared with check_compatible first, so a different model gives a one-line
    CheckpointError naming the checkpoint file instead of load_state_dict's multi-line error.
    """
    path = state.get("path", "checkpoint")
    saved_sig = {name: list(t.shape) for name, t in state["model"].items()}
    check_compatible({"model": saved_sig}, {"model": model_signature(model)}, path)
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {path} has optimizer state that does not fit this run's optimizer "
                                  f"({one_line(e, 200)})") from None


# --------------------------------------------------------------------------------------------------------
# names and verification


def regular_name(policy_version: int, env_steps: int) -> str:
    return f"checkpoint_{policy_version:09d}_{env_steps}.pth"


def best_name(policy_version: int, env_steps: int, metric: str, value: float) -> str:
    return f"best_{policy_version:09d}_{env_steps}_{metric}_{value:.3f}.pth"


class CheckpointInfo(NamedTuple):
    """What a verified checkpoint file is, taken from its content (its name agrees with it)."""
    policy_version: int
    env_steps: int
    metric: str | None = None  # best files only
    value: float | None = None


class NotACheckpoint(ValueError):
    """The content of a file proves it is not a checkpoint of ours under that name."""


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def verify_content(state: Any, name: str) -> CheckpointInfo:
    """The CheckpointInfo of `state` loaded from a file called `name`; NotACheckpoint (with the reason) unless it
    verifies."""
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
        raise NotACheckpoint(f"not a checkpoint (expected a dict with keys {', '.join(REQUIRED_KEYS)})")
    version, steps = state["policy_version"], state["env_steps"]
    if not (_is_count(version) and _is_count(steps)):
        raise NotACheckpoint(f"not a checkpoint (policy_version {one_line(version, 40)}, env_steps "
                             f"{one_line(steps, 40)} are not non-negative integers)")
    if not isinstance(state["model"], dict) or not isinstance(state["meta"], dict):
        raise NotACheckpoint("not a checkpoint (model or meta is not a dict)")
    if name.startswith("best_"):
        best = state.get("best_metric")
        if not (isinstance(best, dict) and isinstance(best.get("name"), str)
                and isinstance(best.get("value"), (int, float)) and not isinstance(best.get("value"), bool)
                and not math.isnan(best["value"])):
            raise NotACheckpoint("not a best checkpoint (no best_metric name and value)")
        info = CheckpointInfo(version, steps, best["name"], float(best["value"]))
        expected = best_name(version, steps, info.metric, info.value)
        claim = f"policy version {version}, {steps} env steps, {info.metric} {info.value!r}"
    else:
        info = CheckpointInfo(version, steps)
        expected = regular_name(version, steps)
        claim = f"policy version {version}, {steps} env steps"
    if name != expected:
        raise NotACheckpoint(f"its name does not match its content ({claim}: would be named {expected})")
    return info

