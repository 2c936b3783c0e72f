"""Checkpoints of one policy: atomic writes, verified pruning, a best checkpoint, fallback over bad files.

Layout (docs/architecture.md, "Checkpoints"):

    exp_dir/checkpoint_p{policy_id}/checkpoint_{policy_version:09d}_{env_steps}.pth     (the latest few)
    exp_dir/checkpoint_p{policy_id}/best_{policy_version:09d}_{env_steps}_{metric}_{value:.3f}.pth  (one)
    exp_dir/checkpoint_p{policy_id}/rejected/                                          (files that failed verification)

Writing. Every file is written to a unique `*.tmp` file in the same directory, flushed and fsync'ed, renamed
onto its final name with `os.replace` (atomic on POSIX) and the directory is fsync'ed. A process killed at any
moment therefore leaves either the old set of files or the new one, never a partial file under a final
name; a `*.tmp` left by a killed save is never loaded and is removed by the next save. Any OSError while
writing (disk full, read-only filesystem, permission denied, name too long) removes the temp file and raises
CheckpointError with one line naming the file or directory and the OS error; the files already there are
untouched.

Verification. A file name is only a claim: a file counts as a checkpoint (for `latest()`, `best()`, `load`,
the best value and pruning) only once its content has been read and verified: it loads with
`torch.load(weights_only=True)`, it is a dict with the keys `model`, `policy_version`, `env_steps` and
`meta`, and its name is exactly the one its content gives (`policy_version`, `env_steps` and, for a best
file, `best_metric = {"name", "value"}`). Ranking (newest, best) and the best value so far come from that
verified content, never from the name. A file that fails verification is moved into `rejected/` with a
WARNING naming it and the reason (no glob of ours looks there), so it is never the latest or the best and
never causes a real checkpoint to be pruned; pruning deletes only files that verified. A file that cannot
be read for a reason outside its content (permission denied, I/O error, out of memory) is skipped and left
where it is. Verification reads the file with `mmap=True` (tensor data is not read) and its result is
cached per (path, size, mtime, inode), so each file is read once per manager, not on every save.

Files are loaded with `torch.load(weights_only=True)`: everything stored is a tensor or a plain Python
container/scalar (RNG states are converted accordingly), so no pickled code runs at load time.

One CheckpointManager writes to a directory at a time (the learner of that policy); any number may read.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import torch

CHECKPOINT_FORMAT = 1
_REGULAR_RE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pth$")
_BEST_RE = re.compile(r"^best_(\d+)_(\d+)_(.+)_([-+]?(?:\d+\.?\d*|inf|nan))\.pth$")
REJECTED_DIR = "rejected"
# Keys every checkpoint written by make_checkpoint_state has; a file without them is not one of ours.
_REQUIRED_KEYS = ("model", "policy_version", "env_steps", "meta")
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
        raise CheckpointError(f"checkpoint {path} has no metadata (env, spaces, model); it was not written by this trainer")
    ordered = [k for k in _META_LABELS if k in current_meta] + [k for k in current_meta if k not in _META_LABELS]
    for key in ordered:
        label = _META_LABELS.get(key, key)
        current = current_meta[key]
        if key not in saved_meta:
            if key in _META_OPTIONAL:
                continue
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
# names and verification


def _regular_name(policy_version: int, env_steps: int) -> str:
    return f"checkpoint_{policy_version:09d}_{env_steps}.pth"


def _best_name(policy_version: int, env_steps: int, metric: str, value: float) -> str:
    return f"best_{policy_version:09d}_{env_steps}_{metric}_{value:.3f}.pth"


class _Info(NamedTuple):
    """What a verified checkpoint file is, taken from its content (its name agrees with it)."""
    policy_version: int
    env_steps: int
    metric: str | None = None  # best files only
    value: float | None = None


class _Invalid(ValueError):
    """The content of a file proves it is not a checkpoint of ours under that name."""


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_content(state: Any, name: str) -> _Info:
    """The _Info of `state` loaded from a file called `name`; _Invalid (with the reason) unless it verifies."""
    if not isinstance(state, dict) or any(k not in state for k in _REQUIRED_KEYS):
        raise _Invalid(f"not a checkpoint (expected a dict with keys {', '.join(_REQUIRED_KEYS)})")
    version, steps = state["policy_version"], state["env_steps"]
    if not (_is_count(version) and _is_count(steps)):
        raise _Invalid(f"not a checkpoint (policy_version {_one_line(version, 40)}, env_steps {_one_line(steps, 40)} "
                       "are not non-negative integers)")
    if not isinstance(state["model"], dict) or not isinstance(state["meta"], dict):
        raise _Invalid("not a checkpoint (model or meta is not a dict)")
    if name.startswith("best_"):
        best = state.get("best_metric")
        if not (isinstance(best, dict) and isinstance(best.get("name"), str)
                and isinstance(best.get("value"), (int, float)) and not isinstance(best.get("value"), bool)
                and not math.isnan(best["value"])):
            raise _Invalid("not a best checkpoint (no best_metric name and value)")
        info = _Info(version, steps, best["name"], float(best["value"]))
        expected = _best_name(version, steps, info.metric, info.value)
        claim = f"policy version {version}, {steps} env steps, {info.metric} {info.value!r}"
    else:
        info = _Info(version, steps)
        expected = _regular_name(version, steps)
        claim = f"policy version {version}, {steps} env steps"
    if name != expected:
        raise _Invalid(f"its name does not match its content ({claim}: would be named {expected})")
    return info


def _load_for_verification(path: Path) -> Any:
    """The unpickled content of `path` without reading tensor data where possible (mmap).

    mmap needs torch's zip format; for anything else (garbage, legacy format) or if mapping fails, a plain
    load decides, so its error is the one reported and a good file is never rejected because of mmap.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except Exception:  # noqa: BLE001 - retried without mmap, which gives the real verdict
        return torch.load(path, map_location="cpu", weights_only=True)


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
    if isinstance(e, _Invalid):
        return str(e)
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {_one_line(lines[0], 200)}" if lines else type(e).__name__


def _os_reason(e: OSError) -> str:
    """'No space left on device' rather than "[Errno 28] No space left on device: '/long/path.tmp'"."""
    return _one_line(e.strerror or e, 200)


def _write_failure(e: BaseException) -> OSError | RuntimeError | None:
    """The I/O error behind an exception raised while writing a file, or None if it is not an I/O error.

    torch.save reports a failed write of its zip stream as RuntimeError("[enforce fail at inline_container.cc]
    unexpected pos ..."), with the OSError (e.g. ENOSPC) only as its context; the OSError is what the user
    needs to see. A stream-writer RuntimeError without one is still an I/O failure.
    """
    seen, cur = set(), e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    if isinstance(e, RuntimeError) and ("inline_container" in str(e) or "PytorchStreamWriter" in str(e)):
        return e
    return None


class CheckpointManager:
    """Saves, prunes and loads the checkpoints of one policy in `exp_dir/checkpoint_p{policy_id}`.

    Only files whose content verifies (see the module docstring) are listed, loaded, ranked or deleted.
    `read_only`: this manager never writes, moves or deletes anything (a data-parallel rank other than 0, which shares
    rank 0's directory): a file that fails verification is ignored where it lies, as in a directory it may not write.
    """

    def __init__(self, exp_dir: Path, policy_id: int = 0, keep_checkpoints: int = 2, save_best_metric: str = "reward",
                 log: logging.Logger = logging.getLogger("sf.checkpoint"), read_only: bool = False):
        if keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {keep_checkpoints}")
        self.dir = Path(exp_dir) / f"checkpoint_p{policy_id}"
        self.rejected_dir = self.dir / REJECTED_DIR
        self.keep_checkpoints = keep_checkpoints
        self.metric = save_best_metric
        self.log = log
        self.read_only = read_only
        # path -> ((size, mtime_ns, inode), _Info or None, reason or None): each file is read once while it is
        # unchanged. None info with a reason: rejected but could not be moved aside (e.g. read-only directory).
        self._verified: dict[Path, tuple[tuple, _Info | None, str | None]] = {}
        self._best_value: float | None = None  # read lazily: readers (enjoy, runner) rarely need it

    # --- the best value so far ---
    @property
    def best_value(self) -> float:
        """The best value of this metric so far: from the verified best file's content (so it survives
        restarts and a stray file's name cannot set it), then kept in memory once this manager writes one."""
        if self._best_value is None:
            best = self._verified_best()
            self._best_value = best[0][1].value if best else -math.inf
        return self._best_value

    @best_value.setter
    def best_value(self, value: float) -> None:
        self._best_value = float(value)

    # --- listing ---
    def _scan(self) -> tuple[list[tuple[tuple[int, int], Path]], list[tuple[str, float, int, Path]]]:
        """Files named like ours, unverified: regular [((version, steps), path)] newest first by name, best
        [(metric, value, version, path)] (every metric) best first by name."""
        try:
            entries = set(os.listdir(self.dir))
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        except OSError as e:
            raise CheckpointError(f"cannot read checkpoint directory {self.dir}: {_os_reason(e)}") from None
        for gone in [p for p in self._verified if p.name not in entries]:  # deleted by others: forget them
            del self._verified[gone]
        regular, best = [], []
        for name in entries:
            if m := _REGULAR_RE.match(name):
                regular.append(((int(m.group(1)), int(m.group(2))), self.dir / name))
            elif m := _BEST_RE.match(name):
                best.append((m.group(3), float(m.group(4)), int(m.group(1)), self.dir / name))
        regular.sort(key=lambda e: e[0], reverse=True)
        # nan sorts last: such a name can never verify (save_best refuses nan), but it is still verified
        # (and moved aside) when best files are cleaned up.
        best.sort(key=lambda e: (not math.isnan(e[1]), e[1] if not math.isnan(e[1]) else 0.0, e[2]), reverse=True)
        return regular, best

    def _named(self, kind: str) -> list[Path]:
        """Candidates for `kind`, in the order their names claim (newest / best of this metric first)."""
        regular, best = self._scan()
        if kind == "latest":
            return [p for _, p in regular]
        return [p for metric, value, _, p in best if metric == self.metric and not math.isnan(value)]

    def latest(self) -> list[Path]:
        """Verified regular checkpoints, newest first (policy version, then env steps, from their content).

        Files named like checkpoints that fail verification are moved aside (with a WARNING) on the way.
        """
        # A verified file's name equals the one its content gives, so the name order is the content order.
        return [p for p in self._named("latest") if self._verify(p)[0] is not None]

    def _verified_best(self) -> list[tuple[Path, _Info]]:
        """Verified best checkpoints of the current metric, best value (from content) first; normally one,
        two after a save killed before it removed the previous one."""
        found = [(p, info) for p in self._named("best") if (info := self._verify(p)[0]) is not None]
        found.sort(key=lambda f: (f[1].value, f[1].policy_version, f[1].env_steps), reverse=True)
        return found

    def best(self) -> Path | None:
        """The verified best checkpoint of the current metric, or None."""
        best = self._verified_best()
        return best[0][0] if best else None

    # --- verification ---
    def _verify(self, path: Path, then: str = "", quiet: bool = False) -> tuple[_Info | None, str | None]:
        """(info, None) if `path` verifies; (None, None) if it vanished; (None, reason) if it is unusable.

        A file whose content fails verification is moved into rejected/ and a WARNING names it and the reason
        (`then` is appended, e.g. what load falls back to; `quiet` leaves the telling to the caller's error).
        A file that cannot be read for another reason is only skipped, with a WARNING.
        """
        try:
            st = path.stat()
        except FileNotFoundError:
            self._verified.pop(path, None)
            return None, None
        except OSError as e:
            reason = _describe(e)
            if not quiet:
                self.log.warning("Checkpoint %s cannot be read (%s); skipped, left in place%s", path, reason, then)
            return None, reason
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        cached = self._verified.get(path)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        try:
            if not stat.S_ISREG(st.st_mode):
                raise _Invalid("not a regular file")
            info = _check_content(_load_for_verification(path), path.name)
        except FileNotFoundError:
            self._verified.pop(path, None)
            return None, None
        except (OSError, MemoryError) as e:  # the file may be fine: this process cannot read it now
            reason = _describe(e)
            if not quiet:
                self.log.warning("Checkpoint %s cannot be read (%s); skipped, left in place%s", path, reason, then)
            return None, reason
        except Exception as e:  # noqa: BLE001 - anything else the content caused: not a checkpoint of ours
            reason = _describe(e)
            self._reject(path, key, reason, then, quiet)
            return None, reason
        self._verified[path] = (key, info, None)
        return info, None

    def _reject(self, path: Path, key: tuple, reason: str, then: str, quiet: bool) -> None:
        """Move a file that failed verification into rejected/ (kept for inspection, never matched again)."""
        if self.read_only:  # ignore it, remember the verdict (not read or reported again while it is unchanged)
            self._verified[path] = (key, None, reason)
            if not quiet:
                self.log.warning("Checkpoint %s is not a valid checkpoint (%s); ignored, left in place (read only)%s",
                                 path, reason, then)
            return
        try:
            self.rejected_dir.mkdir(exist_ok=True)
            dest = self.rejected_dir / path.name
            n = 1
            while dest.exists():  # keep every rejected file: a second one of the same name gets a suffix
                dest = self.rejected_dir / f"{path.name}.{n}"
                n += 1
            os.rename(path, dest)
        except FileNotFoundError:  # moved or pruned meanwhile by another process
            self._verified.pop(path, None)
            return
        except OSError as e:
            # e.g. a read-only experiment directory opened by enjoy: ignore the file, remember the verdict so it
            # is neither read nor reported again while it is unchanged.
            self._verified[path] = (key, None, reason)
            if not quiet:
                self.log.warning("Checkpoint %s is not a valid checkpoint (%s); ignored (could not move it to %s: "
                                 "%s)%s", path, reason, self.rejected_dir, _os_reason(e), then)
            return
        self._verified.pop(path, None)
        if not quiet:
            self.log.warning("Checkpoint %s is not a valid checkpoint (%s); moved it to %s%s", path, reason, dest, then)

    def _remember(self, path: Path, info: _Info) -> None:
        """Cache a file this manager has just written (its content is known; no need to read it back)."""
        try:
            st = path.stat()
        except OSError:
            return
        self._verified[path] = ((st.st_size, st.st_mtime_ns, st.st_ino), info, None)

    def _delete(self, path: Path) -> None:
        """Delete a verified checkpoint (pruning); a failure costs disk space only, so it is a warning."""
        try:
            path.unlink(missing_ok=True)
        except OSError as e:
            self.log.warning("Could not delete old checkpoint %s: %s", path, _os_reason(e))
        self._verified.pop(path, None)

    # --- saving ---
    def _clean_temp_files(self) -> None:
        # Left by a save that was killed before its rename; never loaded, only removed here (the single
        # writer of this directory is this manager, so no other save can be in progress). A temp file that
        # cannot be removed is harmless; the write that follows reports any real problem with the directory.
        try:
            leftovers = [p for p in self.dir.glob("*.tmp") if p.name.startswith(("checkpoint_", "best_"))]
        except OSError:
            return
        for p in leftovers:
            try:
                p.unlink(missing_ok=True)
            except OSError:
                pass

    def _prepare(self, state: dict, policy_version: int, env_steps: int) -> tuple[int, int]:
        """Check `state` before writing anything: it must verify once written, and be weights_only-safe."""
        if self.read_only:
            raise RuntimeError(f"checkpoint manager of {self.dir} is read only: it writes nothing")
        _check_weights_only_safe(state)
        version, steps = int(policy_version), int(env_steps)
        if version < 0 or steps < 0:
            raise ValueError(f"policy_version and env_steps must be >= 0, got {version}, {steps}")
        if not isinstance(state, dict) or any(k not in state for k in _REQUIRED_KEYS):
            raise ValueError(f"checkpoint state must be a dict with keys {', '.join(_REQUIRED_KEYS)} "
                             "(see make_checkpoint_state)")
        # The file name is made from the arguments and verified against the content at every later read:
        # a disagreement would write a file that is rejected as soon as it is looked at.
        if state["policy_version"] != version or state["env_steps"] != steps:
            raise ValueError(f"checkpoint state has policy_version {state['policy_version']!r}, env_steps "
                             f"{state['env_steps']!r}; saved as {version}, {steps}")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CheckpointError(f"cannot create checkpoint directory {self.dir}: {_os_reason(e)}") from None
        self._clean_temp_files()
        return version, steps

    def _write_atomic(self, state: dict, final: Path) -> None:
        """torch.save into a unique temp file, fsync, rename onto `final`, fsync the directory.

        Any I/O failure removes the temp file and raises CheckpointError naming `final` and the OS error; the
        files already in the directory are untouched (nothing else is written or renamed before this succeeds).
        """
        tmp = final.with_name(f"{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            # O_EXCL: the name is unique; mode 0o666 lets the umask decide the final permissions.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                with os.fdopen(fd, "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, final)
            except BaseException:
                try:
                    tmp.unlink(missing_ok=True)
                except OSError:
                    pass
                raise
        except Exception as e:  # noqa: BLE001 - only I/O failures are turned into a one-line error
            failure = _write_failure(e)
            if failure is None:
                raise
            reason = _os_reason(failure) if isinstance(failure, OSError) else _describe(failure)
            raise CheckpointError(f"cannot write checkpoint {final}: {reason}") from None
        _fsync_dir(self.dir)

    def holds(self, policy_version: int, env_steps: int) -> Path | None:
        """The regular checkpoint of this policy version and env steps if it is here and verifies, else None. A version
        counts SGD steps (and weight copies): that file holds this very training state, so saving it again would only
        rewrite it (a new mtime, and a best file of the same weights relabelled with other episodes)."""
        path = self.dir / _regular_name(int(policy_version), int(env_steps))
        return path if self._verify(path)[0] is not None else None

    def save(self, state: dict, policy_version: int, env_steps: int) -> Path:
        """Write a regular checkpoint atomically; then keep only the `keep_checkpoints` newest. Returns its path.

        `state` (from make_checkpoint_state) must hold the same policy_version and env_steps (ValueError
        otherwise). An I/O failure raises CheckpointError (one line) and leaves the previous files as they were.
        """
        version, steps = self._prepare(state, policy_version, env_steps)
        path = self.dir / _regular_name(version, steps)
        self._write_atomic(state, path)
        self._remember(path, _Info(version, steps))
        self._prune(path)
        return path

    def save_milestone(self, path: Path) -> Path:
        """Keep a copy of the regular checkpoint `path` in milestones/ (never pruned: Sample Factory's
        --save_milestones_sec). A hard link when the filesystem allows it, else a copy written atomically. An I/O
        failure raises CheckpointError (one line); the regular checkpoints are untouched."""
        milestones = self.dir / "milestones"
        final = milestones / path.name
        try:
            milestones.mkdir(exist_ok=True)
            try:
                os.link(path, final)
            except FileExistsError:
                pass
            except OSError:  # no hard links here (another filesystem's rules): a copy, atomically
                tmp = final.with_name(f"{final.name}.{uuid.uuid4().hex[:8]}.tmp")
                shutil.copyfile(path, tmp)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, final)
            _fsync_dir(milestones)
        except OSError as e:
            raise CheckpointError(f"cannot write milestone checkpoint {final}: {_os_reason(e)}") from None
        return final

    def _prune(self, path: Path) -> None:
        """Keep `path` and the newest verified others up to keep_checkpoints; delete only verified files.

        Runs after the new file is durable. The file just written is always kept, even if a verified file
        with a higher version exists, so a resumed run's progress is never deleted. A file that fails
        verification is moved aside and does not count; one that cannot be read is left alone.
        """
        try:
            candidates = self._named("latest")
        except CheckpointError as e:
            self.log.warning("Checkpoints not pruned: %s", e)
            return
        kept = 1
        for p in candidates:
            if p == path or self._verify(p)[0] is None:
                continue
            if kept < self.keep_checkpoints:
                kept += 1
            else:
                self._delete(p)

    def save_best(self, state: dict, policy_version: int, env_steps: int, metric_value: float) -> Path | None:
        """Write `state` as the best checkpoint if `metric_value` beats the best so far; returns its path or None.

        The metric name and exact value are stored in the file (`best_metric`), which is what later runs read
        back. The previous best file (and any verified best file of another metric) is deleted after the new
        one is in place. An I/O failure raises CheckpointError (one line); the previous best file stays.
        """
        metric_value = float(metric_value)
        if math.isnan(metric_value) or metric_value <= self.best_value:
            return None
        version, steps = self._prepare(state, policy_version, env_steps)
        path = self.dir / _best_name(version, steps, self.metric, metric_value)
        state = dict(state, best_metric={"name": self.metric, "value": metric_value})
        self._write_atomic(state, path)
        self._remember(path, _Info(version, steps, self.metric, metric_value))
        self.best_value = metric_value
        try:
            others = [p for *_, p in self._scan()[1] if p != path]
        except CheckpointError as e:
            self.log.warning("Old best checkpoints not removed: %s", e)
            return path
        for p in others:
            if self._verify(p)[0] is not None:  # unverified files were moved aside or are left alone
                self._delete(p)
        return path

    # --- loading ---
    def load(self, kind: str = "latest", map_location="cpu") -> dict | None:
        """The newest (or best) verified checkpoint of `kind` ("latest" or "best"), with `path` added.

        Files that fail verification are moved aside with a WARNING naming them, the reason and what is
        tried next. A verified file that still cannot be loaded here (e.g. not enough memory on
        `map_location`) is skipped with a WARNING and left in place. If files exist but none loads, or the
        only ones there were moved aside earlier, CheckpointError is raised so a run never silently starts
        from scratch; None means there never was a checkpoint of this kind.
        """
        if kind not in ("latest", "best"):
            raise ValueError(f"checkpoint kind must be 'latest' or 'best', got {kind!r}")
        failures: dict[Path, str] = {}  # unusable file -> reason, newest first
        for _attempt in range(3):  # a concurrent writer may prune a file between listing and reading it
            named = [p for p in self._named(kind) if p not in failures]
            verified: list[tuple[Path, _Info]] = []
            for i, path in enumerate(named):
                following = named[i + 1] if i + 1 < len(named) else None
                then = f"; falling back to {following.name}" if following is not None else ""
                # With nothing verified and nothing left to try, the CheckpointError below says it all.
                info, reason = self._verify(path, then=then, quiet=following is None and not verified)
                if info is not None:
                    verified.append((path, info))
                elif reason is not None:
                    failures[path] = reason
            if kind == "best":  # the names round the value; the content has it exactly
                verified.sort(key=lambda f: (f[1].value, f[1].policy_version, f[1].env_steps), reverse=True)
            vanished = False
            for i, (path, _) in enumerate(verified):
                try:
                    state = torch.load(path, map_location=map_location, weights_only=True)
                    _check_content(state, path.name)  # replaced since it was verified? (then it must verify too)
                except FileNotFoundError:
                    vanished = True
                    continue
                except Exception as e:  # noqa: BLE001 - verified, so not the file's fault: try the next one
                    failures[path] = _describe(e)
                    if i + 1 < len(verified):
                        self.log.warning("Checkpoint %s could not be loaded (%s); falling back to %s", path,
                                         failures[path], verified[i + 1][0].name)
                    continue
                state["path"] = str(path)
                return state
            if not vanished:
                break
        if failures:
            newest, reason = next(iter(failures.items()))
            moved = any(not p.exists() for p in failures)
            where = f"; files that failed verification were moved to {self.rejected_dir}" if moved else ""
            raise CheckpointError(f"no loadable {kind} checkpoint in {self.dir}: {len(failures)} file(s) unusable, "
                                  f"newest {newest.name} ({reason}){where}")
        rejected = self._rejected_names(kind)
        if rejected:
            raise CheckpointError(f"no loadable {kind} checkpoint in {self.dir}: the {kind} checkpoint file(s) there "
                                  f"failed verification earlier and were moved to {self.rejected_dir} "
                                  f"(e.g. {rejected[0]}); move a good one back, or remove them to start from scratch")
        return None

    def _rejected_names(self, kind: str) -> list[str]:
        """Names of files of `kind` that were moved aside, newest-named first."""
        try:
            names = os.listdir(self.rejected_dir)
        except OSError:
            return []
        prefix = "checkpoint_" if kind == "latest" else "best_"
        return sorted((n for n in names if n.startswith(prefix)), reverse=True)
