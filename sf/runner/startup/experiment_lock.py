"""One run at a time per experiment: an exclusive lock that the kernel releases when the last process holding it dies.

The lock is flock(2) on `train_dir/.{experiment}.lock`, a file beside the experiment directory rather than in it:
--restart_behavior restart (which moves the directory aside) and overwrite (which deletes it) leave it in place, so a
runner holds it across both. An experiment name never starts with '.', so the file never names an experiment. It
holds the holder's pid, start time and host, for the one line that refuses a second runner (exit code 2).

The runner takes it before it moves, deletes or writes anything of the experiment, and keeps it for its whole life.
Its learner processes (the ones that write checkpoints) hold the same open file description, passed through the fork
server (a flock belongs to the open file description, not to a process): after a SIGKILL of the runner the lock lasts
until its learners have died too (parent-death signal), so a new run never starts while one of them could still
write a checkpoint. Rollout and policy workers write nothing in the experiment and do not hold it; enjoy, sf.plot and
TensorBoard only read and never take it. With torchrun, rank 0 (the one rank that writes) holds it.

At the end of the run the file is removed while still locked; a run that died leaves it behind unlocked, which is
harmless: the next runner locks it and writes its own pid. Taking the lock checks that the file it locked is still
the one under that name (a holder that was removing it meanwhile); see acquire().
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from pathlib import Path

import psutil

from sf.cfg import ConfigError, RunError

log = logging.getLogger("sf")
# After a SIGKILL of its runner, a run's learners die within milliseconds (the fork server exits, the kernel sends them
# the parent-death signal); a lock still held this long after its runner died is held by something else.
DEAD_HOLDER_WAIT_SEC = 10.0


def lock_path(train_dir, experiment: str) -> Path:
    return Path(train_dir) / f".{experiment}.lock"


class ExperimentLock:
    """A held lock (see the module docstring). Pickled into a child process it is the same open file description:
    the child holds the lock as well until it exits."""

    def __init__(self, path: Path, fd: int | None):
        self.path, self.fd = Path(path), fd  # fd None: the filesystem cannot lock (a warning said so)

    @classmethod
    def acquire(cls, train_dir, experiment: str, wait_for_dead: float = DEAD_HOLDER_WAIT_SEC) -> "ExperimentLock":
        """Lock the experiment or raise: ConfigError (exit code 2) naming the holder's pid when another run holds it,
        RunError (exit code 1) when the lock file cannot be created. Creates train_dir if needed (what the run does
        next anyway). A holder whose runner has died (its learners still ending) is waited for up to `wait_for_dead` s.
        """
        path = lock_path(train_dir, experiment)
        exp_dir = Path(train_dir) / experiment
        deadline = time.monotonic() + wait_for_dead
        while True:
            try:
                # O_NOFOLLOW: a link planted under the lock's name is refused, never followed to a file elsewhere
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise RunError(f"cannot prepare the experiment directory {exp_dir}: {e.strerror or e}") from None
                continue
            except OSError as e:
                raise RunError(f"cannot prepare the experiment directory {exp_dir}: cannot open its lock file {path}: "
                               f"{e.strerror or e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                if holder.get("dead") and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise ConfigError(_refusal(exp_dir, path, holder)) from None
            except OSError as e:  # the filesystem cannot lock (ENOLCK, EOPNOTSUPP): train, but say what is not guarded
                os.close(fd)
                log.warning("cannot lock %s (%s): another run on this experiment would not be refused", path,
                            e.strerror or e)
                return cls(path, None)
            if not _still_named(fd, path):  # its previous holder removed it between our open and our lock: again
                os.close(fd)
                continue
            _write_holder(fd)
            return cls(path, fd)

    def release(self, remove: bool = True) -> None:
        """Unlock: remove the file (while still locked, so no one locks a file about to vanish) and close it. `remove`
        False: processes of the run may still hold it (one that could not be killed): it stays, locked by them."""
        if self.fd is None:
            return
        if remove:
            try:
                os.unlink(self.path)
            except OSError:  # gone already, or a read-only filesystem by now: an unlocked file left is harmless
                pass
        os.close(self.fd)
        self.fd = None

    def __reduce__(self):
        from multiprocessing.reduction import DupFd  # the fd travels to the child (through the fork server) as is
        if self.fd is None:
            return ExperimentLock, (str(self.path), None)
        return _inherited, (str(self.path), DupFd(self.fd))


def _inherited(path: str, dup_fd) -> ExperimentLock:
    return ExperimentLock(Path(path), dup_fd.detach())


def run_holding(lock: ExperimentLock, target, *args) -> None:
    """A child process's entry that holds the experiment's lock for as long as the process lives: its descriptor is
    never closed here (the kernel closes it when the process dies, however it dies)."""
    target(*args)


def _still_named(fd: int, path: Path) -> bool:
    try:
        named, held = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _write_holder(fd: int) -> None:
    """pid, start time and host of this process into the lock file (for the refusal message). Best effort: on a full
    disk the lock holds without them."""
    me = psutil.Process()
    text = f"{os.getpid()} {me.create_time():.2f} {socket.gethostname()}\n".encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
    except OSError:
        pass


def _read_holder(fd: int) -> dict:
    """What the lock file says of its holder: pid, host, since (a time), dead (its process is gone: a runner that died,
    whose learners still hold the lock for a moment). Empty when unreadable (a holder that has just locked it)."""
    for _ in range(20):  # a holder writes its pid right after locking: give it a moment
        try:
            parts = os.pread(fd, 512, 0).decode(errors="replace").split()
        except OSError:
            return {}
        if len(parts) >= 3:
            break
        time.sleep(0.01)
    else:
        return {}
    try:
        pid, since = int(parts[0]), float(parts[1])
    except ValueError:
        return {}
    holder = {"pid": pid, "since": since, "host": parts[2]}
    if parts[2] == socket.gethostname():
        try:
            proc = psutil.Process(pid)
            holder["dead"] = abs(proc.create_time() - since) > 1.0 or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            holder["dead"] = True
    return holder


def _refusal(exp_dir: Path, path: Path, holder: dict) -> str:
    if not holder:
        who = "another run (its pid is not recorded yet)"
    else:
        where = "" if holder["host"] == socket.gethostname() else f" on host {holder['host']}"
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
        who = f"another run (pid {holder['pid']}{where}, since {since})"
        if holder.get("dead"):
            who += f"; that process has died but processes it started still hold the lock {path}"
    return (f"experiment {exp_dir} is in use by {who}: one run at a time per experiment, whatever "
            "--restart_behavior; wait for it to end or stop it, or choose another --experiment")

