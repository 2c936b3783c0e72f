"""The checkpoint files of one policy on disk: atomic writes, verified pruning, a best checkpoint, fallback over bad
files. What a checkpoint holds, and when a loaded file verifies: sf.learning.checkpoint.

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
`torch.load(weights_only=True)` and passes verify_content (its name is exactly the one its content gives).
Ranking (newest, best) and the best value so far come from that verified content, never from the name. A
file that fails verification is moved into `rejected/` with a WARNING naming it and the reason (no glob of
ours looks there), so it is never the latest or the best and never causes a real checkpoint to be pruned;
pruning deletes only files that verified. A file that cannot be read for a reason outside its content
(permission denied, I/O error, out of memory) is skipped and left where it is. Verification reads the file
with `mmap=True` (tensor data is not read) and its result is cached per (path, size, mtime, inode), so each
file is read once per manager, not on every save.

One CheckpointManager writes to a directory at a time (the learner of that policy); any number may read.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Callable

import torch

from sf.learning.checkpoint import (BEST_NAME_RE, REGULAR_NAME_RE, REQUIRED_KEYS, CheckpointError, CheckpointInfo,
                                    NotACheckpoint, best_name, check_weights_only_safe, regular_name, verify_content)
from sf.utils.files import fsync_dir, one_line, replace_durably, temp_path, write_atomic

REJECTED_DIR = "rejected"


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


def _describe(e: BaseException) -> str:
    # torch.load's weights_only errors span many lines; the first one says what went wrong.
    if isinstance(e, NotACheckpoint):
        return str(e)
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {one_line(lines[0], 200)}" if lines else type(e).__name__


def _os_reason(e: OSError) -> str:
    """'No space left on device' rather than "[Errno 28] No space left on device: '/long/path.tmp'"."""
    return one_line(e.strerror or e, 200)


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


def _tells_ignored(method):
    """Read only: the invalid files a public call came across are told at its end, in one line that counts them (an
    experiment with many corrupt files is one line, not one per file)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        finally:
            self._tell_ignored()
    return call


class CheckpointManager:
    """Saves, prunes and loads the checkpoints of one policy in `exp_dir/checkpoint_p{policy_id}`.

    Only files whose content verifies (see the module docstring) are listed, loaded, ranked or deleted.
    `read_only`: this manager never writes, moves or deletes anything (a data-parallel rank other than 0, which shares
    rank 0's directory): a file that fails verification is ignored where it lies, as in a directory it may not write.
    """

    # (path, (size, mtime_ns, inode)) of the invalid files a read-only manager of this process has told of: each is told
    # once per process, though enjoy, export and card open a manager per question
    _told_read_only: set[tuple[Path, tuple]] = set()

    def __init__(self, exp_dir: Path, policy_id: int = 0, keep_checkpoints: int = 2, save_best_metric: str = "reward",
                 log: logging.Logger = logging.getLogger("sf.checkpoint"), read_only: bool = False,
                 progress: Callable[[], None] | None = None):
        if keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {keep_checkpoints}")
        self.dir = Path(exp_dir) / f"checkpoint_p{policy_id}"
        self.rejected_dir = self.dir / REJECTED_DIR
        self.keep_checkpoints = keep_checkpoints
        self.metric = save_best_metric
        self.log = log
        self.read_only = read_only
        # called as a checkpoint's bytes go out (the learner's heartbeat: a slow disk is no stall)
        self.progress = progress
        # path -> ((size, mtime_ns, inode), CheckpointInfo or None, reason or None): each file is read once while it is
        # unchanged. None info with a reason: rejected but could not be moved aside (e.g. read-only directory).
        self._verified: dict[Path, tuple[tuple, CheckpointInfo | None, str | None]] = {}
        self._best_value: float | None = None  # read lazily: readers (enjoy, runner) rarely need it
        self._ignored: list[tuple[Path, str, str]] = []  # read only: (path, reason, then) found by this call

    # --- the best value so far ---
    @property
    @_tells_ignored
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
            if m := REGULAR_NAME_RE.match(name):
                regular.append(((int(m.group(1)), int(m.group(2))), self.dir / name))
            elif m := BEST_NAME_RE.match(name):
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

    @_tells_ignored
    def latest(self) -> list[Path]:
        """Verified regular checkpoints, newest first (policy version, then env steps, from their content).

        Files named like checkpoints that fail verification are moved aside (with a WARNING) on the way.
        """
        # A verified file's name equals the one its content gives, so the name order is the content order.
        return [p for p in self._named("latest") if self._verify(p)[0] is not None]

    def _verified_best(self) -> list[tuple[Path, CheckpointInfo]]:
        """Verified best checkpoints of the current metric, best value (from content) first; normally one,
        two after a save killed before it removed the previous one."""
        found = [(p, info) for p in self._named("best") if (info := self._verify(p)[0]) is not None]
        found.sort(key=lambda f: (f[1].value, f[1].policy_version, f[1].env_steps), reverse=True)
        return found

    @_tells_ignored
    def best(self) -> Path | None:
        """The verified best checkpoint of the current metric, or None."""
        best = self._verified_best()
        return best[0][0] if best else None

    # --- verification ---
    def _verify(self, path: Path, then: str = "", quiet: bool = False) -> tuple[CheckpointInfo | None, str | None]:
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
                raise NotACheckpoint("not a regular file")
            info = verify_content(_load_for_verification(path), path.name)
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

    def _tell_ignored(self) -> None:
        """One WARNING for the invalid files ignored (read only) since the last one: the file itself when there is
        one."""
        if not self._ignored:
            return
        ignored, self._ignored = self._ignored, []
        path, reason, then = ignored[0]
        if len(ignored) == 1:
            self.log.warning("Checkpoint %s is not a valid checkpoint (%s); ignored, left in place (read only)%s",
                             path, reason, then)
        else:
            self.log.warning("%d files in %s are not valid checkpoints (the first, %s: %s); ignored, left in place "
                             "(read only)", len(ignored), self.dir, path.name, reason)

    def _reject(self, path: Path, key: tuple, reason: str, then: str, quiet: bool) -> None:
        """Move a file that failed verification into rejected/ (kept for inspection, never matched again)."""
        if self.read_only:  # ignore it, remember the verdict (not read or reported again while it is unchanged)
            self._verified[path] = (key, None, reason)
            if not quiet and (path, key) not in CheckpointManager._told_read_only:
                CheckpointManager._told_read_only.add((path, key))
                self._ignored.append((path, reason, then))
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

    def _remember(self, path: Path, info: CheckpointInfo) -> None:
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
        check_weights_only_safe(state)
        version, steps = int(policy_version), int(env_steps)
        if version < 0 or steps < 0:
            raise ValueError(f"policy_version and env_steps must be >= 0, got {version}, {steps}")
        if not isinstance(state, dict) or any(k not in state for k in REQUIRED_KEYS):
            raise ValueError(f"checkpoint state must be a dict with keys {', '.join(REQUIRED_KEYS)} "
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
        """torch.save into a unique temp file, fsync, rename onto `final`, fsync the directory (write_atomic).

        Any I/O failure removes the temp file and raises CheckpointError naming `final` and the OS error; the
        files already in the directory are untouched (nothing else is written or renamed before this succeeds).
        """
        try:
            # not hidden: the temp name starts like the final one, so _clean_temp_files finds what a killed save left
            write_atomic(final, lambda f: torch.save(state, f), hidden=False, progress=self.progress)
        except Exception as e:  # noqa: BLE001 - only I/O failures are turned into a one-line error
            failure = _write_failure(e)
            if failure is None:
                raise
            reason = _os_reason(failure) if isinstance(failure, OSError) else _describe(failure)
            raise CheckpointError(f"cannot write checkpoint {final}: {reason}") from None

    def holds(self, policy_version: int, env_steps: int) -> Path | None:
        """The regular checkpoint of this policy version and env steps if it is here and verifies, else None. A version
        counts SGD steps (and weight copies): that file holds this very training state, so saving it again would only
        rewrite it (a new mtime, and a best file of the same weights relabelled with other episodes)."""
        path = self.dir / regular_name(int(policy_version), int(env_steps))
        return path if self._verify(path)[0] is not None else None

    def save(self, state: dict, policy_version: int, env_steps: int) -> Path:
        """Write a regular checkpoint atomically; then keep only the `keep_checkpoints` newest. Returns its path.

        `state` (from make_checkpoint_state) must hold the same policy_version and env_steps (ValueError
        otherwise). An I/O failure raises CheckpointError (one line) and leaves the previous files as they were.
        """
        version, steps = self._prepare(state, policy_version, env_steps)
        path = self.dir / regular_name(version, steps)
        self._write_atomic(state, path)
        self._remember(path, CheckpointInfo(version, steps))
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
                tmp = temp_path(final, hidden=False)
                shutil.copyfile(path, tmp)
                replace_durably(tmp, final)  # fsyncs the copy, renames it, fsyncs milestones/
                return final
            fsync_dir(milestones)
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
        path = self.dir / best_name(version, steps, self.metric, metric_value)
        state = dict(state, best_metric={"name": self.metric, "value": metric_value})
        self._write_atomic(state, path)
        self._remember(path, CheckpointInfo(version, steps, self.metric, metric_value))
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
    @_tells_ignored
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
            verified: list[tuple[Path, CheckpointInfo]] = []
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
                    verify_content(state, path.name)  # replaced since it was verified? (then it must verify too)
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
