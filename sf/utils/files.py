"""Files written so that a crash never leaves half a file under its final name, and errors told in one line.

Atomic write: the data goes to a temporary file in the same directory (a unique name, created exclusively), is
flushed and fsynced, the file is renamed over the final name (`os.replace`: atomic on POSIX) and the directory is
fsynced (POSIX persists a directory entry only once the directory is synced). A failure at any point removes the
temporary file and leaves the final name as it was: the old content or nothing.

    write_atomic(path, write)        the bytes `write(f)` puts in a binary file object (torch.save, savefig, ...);
                                     `progress`: called as the bytes go out (a slow disk is not a hung writer)
    write_bytes_atomic / write_text_atomic / write_json_atomic
    replace_durably(tmp, final)      a file finished under a temporary name (a video) given its final name
    fsync_dir(d)                     make a rename in d durable

These raise OSError, except write_json_atomic, which raises RunError (one line naming the file): the caller knows
what the file is and reports the failure in its own terms.

    one_line(value)                  an exception's (or any value's) text on one line, cut to a length
    first_line(e)                    the first line of a multi-line error text (C++, torch.distributed)
    error_line(e)                    'TypeName: first line' (a library's exception in a warning)
"""
from __future__ import annotations

import errno
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional

from sf.utils.errors import RunError


def temp_path(path: Path, hidden: bool = True) -> Path:
    """A unique temporary name beside `path`: `.NAME.PID.RANDOM.tmp` (without the dot when not `hidden`)."""
    path = Path(path)
    return path.parent / f"{'.' if hidden else ''}{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


class ProgressFile:
    """A binary file object that writes in chunks of CHUNK bytes and calls `progress()` after each (and around the
    fsync): the writer of a large file on a slow disk shows it is moving (a learner's final checkpoint: its heartbeat).
    SF_TEST_WRITE_BYTES_PER_SEC (tests only, read once at import) makes it a disk that slow."""
    CHUNK = 1 << 20

    def __init__(self, f: BinaryIO, progress: Callable[[], None]):
        self.f, self.progress = f, progress

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        for i in range(0, len(view), self.CHUNK):
            chunk = view[i:i + self.CHUNK]
            self.f.write(chunk)
            if _TEST_BYTES_PER_SEC:
                time.sleep(len(chunk) / _TEST_BYTES_PER_SEC)
            self.progress()
        return len(view)

    def __getattr__(self, name: str):  # flush, fileno, tell, seek...: the file's own
        return getattr(self.f, name)


_TEST_BYTES_PER_SEC = float(os.environ.get("SF_TEST_WRITE_BYTES_PER_SEC", "0") or 0)


def write_atomic(path: Path, write: Callable[[BinaryIO], Any], hidden: bool = True,
                 progress: Optional[Callable[[], None]] = None) -> Path:
    """Write `path` atomically (see the module docstring) with what `write(f)` writes into the binary file `f`.
    The directory must exist. Any exception (an OSError, or one of `write`) removes the temporary file and is
    raised as it is. `progress`: called after every chunk written and after the fsync (ProgressFile)."""
    path = Path(path)
    tmp = temp_path(path, hidden)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # mode: the umask decides, as for open()
    try:
        with os.fdopen(fd, "wb") as f:
            write(f if progress is None else ProgressFile(f, progress))
            f.flush()
            os.fsync(f.fileno())
        if progress is not None:
            progress()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
    return path


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """`data` as the content of `path`, atomically (write_atomic). Raises OSError."""
    return write_atomic(path, lambda f: f.write(data))


def write_text_atomic(path: Path, text: str) -> Path:
    """`text` (UTF-8) as the content of `path`, atomically (write_atomic). Raises OSError."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, obj) -> Path:
    """Write `obj` as JSON to `path` atomically: a temporary file in the same directory is written, flushed and
    fsynced, then renamed over `path`, then the directory is fsynced; the temporary file is removed on failure. Creates
    the directory if needed. An OS error raises RunError (one line naming the file and the error)."""
    path = Path(path)
    data = json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"  # fails before touching disk
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, data)
    except OSError as e:
        raise RunError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def replace_durably(tmp: Path, final: Path) -> Path:
    """Give the complete file `tmp` the name `final` (same directory): its data fsynced, renamed over `final`,
    the directory fsynced. Raises OSError."""
    fd = os.open(tmp, os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    fsync_dir(Path(final).parent)
    return Path(final)


def fsync_dir(d: Path) -> None:
    """Make a rename in `d` durable. Filesystems that cannot fsync a directory are tolerated."""
    try:
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _cut(text: str, limit: Optional[int]) -> str:
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."


def one_line(value: Any, limit: Optional[int] = 300) -> str:
    """`value`'s text (an exception's message, a saved setting) on one line: every run of whitespace, newlines
    included, becomes one space; cut to `limit` characters ending in '...' (None: never cut). An exception without
    text is its type name."""
    text = " ".join(str(value).split())
    if not text and isinstance(value, BaseException):
        return type(value).__name__
    return _cut(text, limit)


def first_line(e: BaseException, limit: Optional[int] = 300) -> str:
    """The first line of an exception's text, which says what went wrong (C++ and library errors add lines of
    context), cut to `limit` characters (None: never cut). An exception without text is its type name."""
    lines = str(e).strip().splitlines()
    return _cut(lines[0], limit) if lines else type(e).__name__


def error_line(e: BaseException, limit: Optional[int] = None) -> str:
    """'TypeName: first line' of an exception (first_line, with what kind of error it is), or the type name alone
    when it has no text."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {_cut(lines[0], limit)}" if lines else type(e).__name__
