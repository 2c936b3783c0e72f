"""UDP ports for VizDoom multiplayer matches on localhost: no two matches of this user ever get the same port at once.

A match's host engine binds one UDP port (`-port P`; the joiners bind ephemeral ports of their own and send to it).
A port is a match's while the match holds a `PortLease`:
- candidates come from a range (--doom_multiplayer_port_min/max; the default 25000-29999 lies below Linux's ephemeral
  range 32768-60999, so the joiners' own sockets never land on a candidate), scanned from a random offset;
- an exclusive `fcntl.flock` on `<tmp>/sf_envs_doom_ports_<uid>/<port>.lock`, held for the match's lifetime, keeps
  every other env of every run of this user off the port (the kernel drops it when the holder dies, so a killed run
  leaves nothing locked; the file is opened close-on-exec, so the engines do not inherit it);
- and a bind test: the port is taken only if a UDP socket can bind it now (another program, another user's run).
The window between the bind test and the host's own bind is left to programs that use fixed ports in the range.
"""
from __future__ import annotations

import errno
import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path
from typing import Optional


def lock_dir() -> Path:
    d = Path(tempfile.gettempdir()) / f"sf_envs_doom_ports_{os.getuid() if hasattr(os, 'getuid') else 0}"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def udp_port_free(port: int) -> bool:
    """Whether a UDP socket can bind `port` on every interface now (as the host engine will)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind(("", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


class PortLease:
    """A UDP port locked for one match; release() (or the process's death) frees it."""

    def __init__(self, port: int, fd: int):
        self.port = port
        self._fd: Optional[int] = fd

    def release(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __repr__(self) -> str:
        return f"PortLease({self.port}{'' if self.held else ', released'})"


def try_lock(port: int) -> Optional[int]:
    """The fd of the port's lock file, locked exclusively; None when another holder has it."""
    fd = os.open(lock_dir() / f"{port}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for whoever wonders
    return fd


def lease_port(port_min: int, port_max: int, exclude: tuple = ()) -> PortLease:
    """Lock a free UDP port of [port_min, port_max] (`exclude`: ports not to take, e.g. one that just failed).
    RuntimeError (one line) when every port of the range is locked or in use."""
    if not 1024 <= port_min <= port_max <= 65535:
        raise ValueError(f"invalid Doom multiplayer port range {port_min}-{port_max} (1024 <= min <= max <= 65535)")
    n = port_max - port_min + 1
    start = random.SystemRandom().randrange(n)  # concurrent envs start at different places: few lock collisions
    for k in range(n):
        port = port_min + (start + k) % n
        if port in exclude:
            continue
        fd = try_lock(port)
        if fd is None:
            continue
        if udp_port_free(port):
            return PortLease(port, fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    raise RuntimeError(f"no free UDP port for a VizDoom match in {port_min}-{port_max} (all locked by other envs or "
                       f"in use); widen --doom_multiplayer_port_min/--doom_multiplayer_port_max")
