"""Checkpoints of one policy: atomic writes, pruning, a best checkpoint, fallback over corrupted files.

Layout (docs/architecture.md, "Checkpoints"):

    exp_dir/checkpoint_p{policy_id}/checkpoint_{policy_version:09d}_{env_steps}.pth     (the latest few)
    exp_dir/checkpoint_p{policy_id}/best_{policy_version:09d}_{env_steps}_{metric}_{value:.3f}.pth  (one)

Every file is written to a unique `*.tmp` file in the same directory, flushed and fsync'ed, renamed onto
its final name with `os.replace` (atomic on POSIX) and the directory is fsync'ed. A process killed at any
moment therefore leaves either the old set of files or the new one, never a partial file under a final
name; a `*.tmp` left by a killed save is never loaded and is removed by the next save.

Files are loaded with `torch.load(weights_only=True)`: everything stored is a tensor or a plain Python
container/scalar (RNG states are converted accordingly), so no pickled code runs at load time.

One CheckpointManager writes to a directory at a time (the learner of that policy); any number may read.
"""
from __future__ import annotations

import logging
import math
import os
import random
import re
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_FORMAT = 1
_REGULAR_RE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pth$")
_BEST_RE = re.compile(r"^best_(\d+)_(\d+)_(.+)_([-+]?(?:\d+\.?\d*|inf|nan))\.pth$")
# Keys every checkpoint written by make_checkpoint_state has; a file without them is treated as unreadable.
_REQUIRED_KEYS = ("model", "policy_version", "env_steps", "meta")
# Types torch.load(weights_only=True) accepts (besides tensors); checked at save time so that a checkpoint
# that could not be loaded back is never written.
_SAFE_SCALARS = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


class CheckpointError(Exception):
    """A checkpoint cannot be used; the message is one line meant for the user (no traceback needed)."""


# --------------------------------------------------------------------------------------------------------
# state content


def model_signature(model: torch.nn.Module) -> dict:
    """`{state_dict key: list(shape)}` of the model's parameters and buffers (normalizers included).

    Compact, made of plain types (stored in checkpoint meta) and comparable with `==`; check_compatible
    uses it to name the first differing entry instead of letting load_state_dict print a shape traceback.
    """
    return {name: list(t.shape) for name, t in model.state_dict().items()}


def _rng_states() -> dict:
    """Every RNG the training code draws from, as weights_only-safe values (tensors, lists, ints)."""
    np_state = np.random.get_state(legacy=True)  # ('MT19937', uint32[624], pos, has_gauss, cached_gaussian)
    py_version, py_internal, py_gauss = random.getstate()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": [str(np_state[0]), torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]),
                  int(np_state[3]), float(np_state[4])],
        "python": [int(py_version), [int(x) for x in py_internal], py_gauss],
    }
    # Only when CUDA is already in use: asking for its RNG state would otherwise create a CUDA context (and
    # take GPU memory) in a CPU-only learner; an untouched CUDA RNG is still at its seeded initial state.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return states


def make_checkpoint_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, policy_version: int,
                          env_steps: int, meta: dict, extra: dict | None = None) -> dict:
    """Everything needed to resume training exactly, in a form `torch.load(weights_only=True)` accepts.

    Keys: `model` (state_dict, normalizer buffers included), `optimizer` (state_dict or None),
    `policy_version`, `env_steps`, `lr` (one float per param group), `rng` (torch CPU, CUDA when in use,
    numpy global, python `random`), `meta` (what a run must match to load it, see check_compatible),
    `checkpoint_format`, plus the keys of `extra` (which must not clash with these).
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
        if key in state or key == "path":  # "path" is added by CheckpointManager.load
            raise ValueError(f"extra checkpoint key {key!r} clashes with a standard key")
        state[key] = value
    return state


def restore_rng_states(state: dict) -> None:
    """Set the torch / CUDA / numpy / python RNGs to the states saved by make_checkpoint_state.

    Missing entries are skipped (a checkpoint from a CUDA run resumed on CPU keeps the CPU states only).
    """
    rng = state.get("rng") or {}
    if "torch" in rng:
        # map_location may have moved the state onto a GPU; set_rng_state wants a CPU ByteTensor.
        torch.set_rng_state(rng["torch"].cpu().to(torch.uint8))
    if rng.get("cuda") and torch.cuda.is_available():
        saved = [s.cpu().to(torch.uint8) for s in rng["cuda"]]
        for i in range(min(len(saved), torch.cuda.device_count())):
            torch.cuda.set_rng_state(saved[i], i)
    if "numpy" in rng:
        name, keys, pos, has_gauss, cached = rng["numpy"]
        keys = keys.cpu().numpy() if torch.is_tensor(keys) else np.asarray(keys)
        np.random.set_state((name, keys.astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    if "python" in rng:
        version, internal, gauss = rng["python"]
        random.setstate((int(version), tuple(int(x) for x in internal), gauss))


def _check_weights_only_safe(obj: Any, where: str = "state") -> None:
    """Raise TypeError naming the first value that torch.load(weights_only=True) would refuse."""
    if torch.is_tensor(obj) or isinstance(obj, _SAFE_SCALARS):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, _SAFE_SCALARS):
                raise TypeError(f"checkpoint key {where}[{k!r}] has type {type(k).__name__}; not loadable with weights_only=True")
            _check_weights_only_safe(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, (list, tuple, set)):
        for i, v in enumerate(obj):
            _check_weights_only_safe(v, f"{where}[{i}]")
        return
    raise TypeError(f"checkpoint value {where} has type {type(obj).__name__}; not loadable with weights_only=True "
                    "(store tensors, numbers, strings, lists or dicts)")


# --------------------------------------------------------------------------------------------------------
# compatibility


def _one_line(value: Any, limit: int = 300) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_META_LABELS = {"env": "env", "observation_space": "observation space", "action_space": "action space",
                "model": "model"}


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

    Compared in this order: env, observation space, action space, model signature, then any other key of
    `current_meta`. A key the current run has but the checkpoint lacks counts as a mismatch.
    """
    if not isinstance(saved_meta, dict):
        raise CheckpointError(f"checkpoint {path} has no metadata (env, spaces, model); it was not written by this trainer")
    ordered = [k for k in _META_LABELS if k in current_meta] + [k for k in current_meta if k not in _META_LABELS]
    for key in ordered:
        label = _META_LABELS.get(key, key)
        current = current_meta[key]
        if key not in saved_meta:
            raise CheckpointError(f"checkpoint {path} does not record its {label}; this run has {label} {_one_line(current)}")
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
            raise CheckpointError(f"checkpoint {path} is from env {saved} with action space {_one_line(saved_as)}; "
                                  f"this run uses env {current} with action space {_one_line(current_as)} "
                                  "(use another --experiment)")
        raise CheckpointError(f"checkpoint {path} has {label} {_one_line(saved)}; this run has {label} {_one_line(current)}")


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
                                  f"({_one_line(e, 200)})") from None


# --------------------------------------------------------------------------------------------------------
# files


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (POSIX only persists a directory entry once the directory is synced)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories; the rename is still atomic
        pass
    finally:
        os.close(fd)


def _describe(e: BaseException) -> str:
    # torch.load's weights_only errors span many lines; the first one says what went wrong.
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {_one_line(lines[0] if lines else '', 200)}"


class CheckpointManager:
    """Saves, prunes and loads the checkpoints of one policy in `exp_dir/checkpoint_p{policy_id}`."""

    def __init__(self, exp_dir: Path, policy_id: int = 0, keep_checkpoints: int = 2, save_best_metric: str = "reward",
                 log: logging.Logger = logging.getLogger("sf.checkpoint")):
        if keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {keep_checkpoints}")
        self.dir = Path(exp_dir) / f"checkpoint_p{policy_id}"
        self.keep_checkpoints = keep_checkpoints
        self.metric = save_best_metric
        self.log = log
        # The best value of this metric so far: parsed from the best file's name (so it survives restarts),
        # then kept exactly in memory once this manager writes one.
        best = self._best_files()
        self.best_value = best[0][1] if best else -math.inf

    # --- listing ---
    def latest(self) -> list[Path]:
        """Regular checkpoints, newest first (by policy version, then env steps, as encoded in the name)."""
        found = []
        if self.dir.is_dir():
            for p in self.dir.iterdir():
                m = _REGULAR_RE.match(p.name)
                if m:
                    found.append(((int(m.group(1)), int(m.group(2))), p))
        return [p for _, p in sorted(found, key=lambda kp: kp[0], reverse=True)]

    def _best_files(self) -> list[tuple[Path, float]]:
        """Best checkpoints of the current metric, best value first (normally one; two after a killed save)."""
        found = []
        if self.dir.is_dir():
            for p in self.dir.iterdir():
                m = _BEST_RE.match(p.name)
                if m and m.group(3) == self.metric:
                    value = float(m.group(4))
                    if not math.isnan(value):
                        found.append((p, value, int(m.group(1))))
        found.sort(key=lambda f: (f[1], f[2]), reverse=True)
        return [(p, v) for p, v, _ in found]

    def best(self) -> Path | None:
        """The best checkpoint of the current metric, or None."""
        best = self._best_files()
        return best[0][0] if best else None

    # --- saving ---
    def _clean_temp_files(self) -> None:
        # Left by a save that was killed before its rename; never loaded, only removed here (the single
        # writer of this directory is this manager, so no other save can be in progress).
        for p in self.dir.glob("*.tmp"):
            if p.name.startswith(("checkpoint_", "best_")):
                p.unlink(missing_ok=True)

    def _write_atomic(self, state: dict, final: Path) -> None:
        """torch.save into a unique temp file, fsync, rename onto `final`, fsync the directory."""
        tmp = final.with_name(f"{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        # O_EXCL: the name is unique; mode 0o666 lets the umask decide the final permissions.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.dir)

    def save(self, state: dict, policy_version: int, env_steps: int) -> Path:
        """Write a regular checkpoint atomically; then keep only the `keep_checkpoints` newest. Returns its path."""
        _check_weights_only_safe(state)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._clean_temp_files()
        path = self.dir / f"checkpoint_{int(policy_version):09d}_{int(env_steps)}.pth"
        self._write_atomic(state, path)
        # Pruned only after the new file is durable. The file just written is always kept, even if a file
        # with a higher version exists (e.g. a corrupted one that load skipped), so a resumed run's progress
        # is never deleted.
        keep = {path}
        for p in self.latest():
            if len(keep) >= self.keep_checkpoints:
                break
            keep.add(p)
        for p in self.latest():
            if p not in keep:
                p.unlink(missing_ok=True)
        return path

    def save_best(self, state: dict, policy_version: int, env_steps: int, metric_value: float) -> Path | None:
        """Write `state` as the best checkpoint if `metric_value` beats the best so far; returns its path or None.

        The previous best file (and any best file of another metric) is deleted after the new one is in place.
        """
        metric_value = float(metric_value)
        if math.isnan(metric_value) or metric_value <= self.best_value:
            return None
        _check_weights_only_safe(state)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._clean_temp_files()
        path = self.dir / f"best_{int(policy_version):09d}_{int(env_steps)}_{self.metric}_{metric_value:.3f}.pth"
        state = dict(state, best_metric={"name": self.metric, "value": metric_value})
        self._write_atomic(state, path)
        self.best_value = metric_value
        for p in self.dir.glob("best_*.pth"):
            if p != path:
                p.unlink(missing_ok=True)
        return path

    # --- loading ---
    def load(self, kind: str = "latest", map_location="cpu") -> dict | None:
        """The newest loadable checkpoint of `kind` ("latest" or "best") with `path` added; None if there is none.

        An unreadable file (truncated, garbage, not a checkpoint) is skipped with a WARNING naming it and the
        error, and the previous one is tried; if files exist but none loads, CheckpointError is raised so a
        run never silently starts from scratch.
        """
        if kind not in ("latest", "best"):
            raise ValueError(f"checkpoint kind must be 'latest' or 'best', got {kind!r}")
        failures: dict[Path, str] = {}  # unreadable file -> reason, newest first
        for _attempt in range(3):  # a concurrent writer may prune a file between listing and reading it
            candidates = self.latest() if kind == "latest" else [p for p, _ in self._best_files()]
            vanished = False
            for i, path in enumerate(candidates):
                if path in failures:
                    continue
                try:
                    state = torch.load(path, map_location=map_location, weights_only=True)
                    if not isinstance(state, dict) or any(k not in state for k in _REQUIRED_KEYS):
                        raise ValueError(f"not a checkpoint (expected a dict with keys {', '.join(_REQUIRED_KEYS)})")
                except FileNotFoundError:
                    vanished = True
                    continue
                except Exception as e:  # noqa: BLE001 - any failure to read the file means: try the previous one
                    failures[path] = _describe(e)
                    following = candidates[i + 1] if i + 1 < len(candidates) else None
                    if following is not None:  # with nothing to fall back to, the CheckpointError below says it all
                        self.log.warning("Checkpoint %s is unreadable (%s); falling back to %s", path, failures[path],
                                         following.name)
                    continue
                state["path"] = str(path)
                return state
            if not vanished:
                break
        if failures:
            newest, reason = next(iter(failures.items()))
            raise CheckpointError(f"no loadable {kind} checkpoint in {self.dir}: {len(failures)} file(s) unreadable, "
                                  f"newest {newest.name} ({reason})")
        return None
