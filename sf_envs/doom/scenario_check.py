"""Checks of Doom scenario files before VizDoom reads them: nothing fetched or configured is trusted unchecked.

Two rules, applied when a Doom env is made and again before each engine start:

* every scenario .cfg (the vizdoom wheel's, the fetched Sample Factory data, any other) is parsed here first,
  with a parser at least as permissive as VizDoom's (keys case-insensitive, `_` and any other non-alphanumeric
  character ignored, `=` and `+=`, every line considered), and is refused when a key names an executable
  (`vizdoom_path`), passes engine arguments (`game_args`: they can name any file), names a ZDoom ini
  (`doom_config_path`: it can autoload files from anywhere), or names a path that is absolute, has a `..`
  component or resolves (symlinks followed) outside the cfg's own directory (`doom_scenario_path`,
  `doom_game_path`); any other path-like key (`*path*`, `*file*`, `*dir*`, `*exe*`, `*args*`, ...) is refused too;
* the fetched Sample Factory data (the scenario's .cfg, its .wad files and the .wad the cfg names) must match
  the SHA-256 digests pinned in sf_envs/doom/scenario_digests.py.

Both results are cached per path and (device, inode, size, mtime, ctime), so making many envs costs a few stat
calls; a file changed on disk is checked again. Failures raise ScenarioDataError (an EnvUnavailableError, hence a
ValueError) whose message is one line naming the file (and the key), which entry points print as it is.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Optional

from sf_envs.doom import scenario_digests
from sf_envs.errors import EnvUnavailableError


class ScenarioDataError(EnvUnavailableError):
    """A scenario file fails its check (digest or cfg key); the message is one line naming the file."""


# normalized key (lowercase alphanumerics) -> why it is refused whatever its value
REFUSED_KEYS = {
    "vizdoompath": "it names the executable VizDoom launches",
    "gameargs": "engine arguments can name any file or command; the env sets its own in code",
    "doomconfigpath": "a ZDoom ini can autoload files from anywhere",
}
# normalized keys whose value must be a path inside the cfg's directory
IN_DIR_KEYS = ("doomscenariopath", "doomgamepath")
_PATH_LIKE = re.compile(r"path|file|dir|exe|args|wad|lmp|record")

_CFG_CACHE: dict = {}  # str(cfg path) -> (stat signature, its cfg_entries)
_DIGEST_CACHE: dict = {}  # str(file path) -> stat signature of a file whose content matched its pinned digest


def _sig(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _show(s: str) -> str:
    """A value or key as it may appear in a one-line message."""
    return s if s.isprintable() else repr(s)


def normalize_key(key: str) -> str:
    return re.sub(r"[^0-9a-z]", "", key.lower())


def cfg_entries(text: str):
    """(line number, key as written, normalized key, value) of every `key = value` / `key += value` line.

    Lines are split at \\n and \\r alike and list continuation lines are not skipped: this sees every key VizDoom's
    loader would act on (and possibly more), never fewer."""
    for n, line in enumerate(re.split(r"[\r\n]", text), 1):
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        eq = line.index("=")
        candidates = {line[:eq].rstrip("+")}
        if "+=" in line:
            candidates.add(line[:line.index("+=")])
        for key in candidates:
            yield n, key.strip(), normalize_key(key), line[eq + 1:].strip()


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def check_cfg(cfg_path) -> dict:
    """Refuse a scenario cfg whose keys name an executable, engine arguments or a path outside its directory.

    Returns {normalized key: resolved path} of the in-directory path keys it sets (e.g. the scenario .wad). The
    parse is cached per file signature; the paths are resolved again on every call (a symlink may have moved)."""
    cfg_path = Path(cfg_path)
    try:
        with open(cfg_path, "rb") as f:
            sig = _sig(os.fstat(f.fileno()))
            cached = _CFG_CACHE.get(str(cfg_path))
            if cached is not None and cached[0] == sig:
                entries = cached[1]
            else:
                entries = tuple(cfg_entries(f.read().decode("latin-1")))
                _CFG_CACHE[str(cfg_path)] = (sig, entries)
    except OSError as e:
        raise ScenarioDataError(f"Doom scenario config {cfg_path} cannot be read: {e.strerror or e}") from None
    root = os.path.realpath(cfg_path.parent)
    refs = {}
    for n, key, norm, value in entries:
        where = f"Doom scenario config {cfg_path} line {n}: key {_show(key)}"
        if norm in REFUSED_KEYS:
            raise ScenarioDataError(f"{where} is refused ({REFUSED_KEYS[norm]})")
        if norm in IN_DIR_KEYS:
            v = value.strip().strip('"').strip()
            if not v:
                continue  # VizDoom ignores an empty value
            if os.path.isabs(v) or v.startswith("~") or ".." in re.split(r"[/\\]", v):
                raise ScenarioDataError(f"{where} = {_show(v)} is refused (a path outside the scenario directory)")
            resolved = os.path.realpath(os.path.join(root, v))
            if not _inside(resolved, root):
                raise ScenarioDataError(f"{where} = {_show(v)} is refused (it resolves outside the scenario "
                                        f"directory, to {_show(resolved)})")
            refs[norm] = resolved
        elif _PATH_LIKE.search(norm):
            raise ScenarioDataError(f"{where} is refused (a path-like key; scenario configs may only name files in "
                                    f"their own directory with doom_scenario_path / doom_game_path)")
    return refs


def file_sha256(path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def verify_pinned_file(path, fix_hint: str, name: Optional[str] = None) -> None:
    """Raise ScenarioDataError unless the file's content matches the digest pinned for `name` (default: its name)."""
    path = Path(path)
    name = name or path.name
    pinned = scenario_digests.FILES.get(name)
    if pinned is None:
        raise ScenarioDataError(f"Doom scenario file {path} is not one of the pinned Sample Factory "
                                f"{scenario_digests.SF_VERSION} files; re-fetch the data with: {fix_hint}")
    want_sha, want_size = pinned
    try:
        with open(path, "rb") as f:
            before = _sig(os.fstat(f.fileno()))
            if _DIGEST_CACHE.get(str(path)) == before:
                return
            ok = before[2] == want_size
            if ok:
                h = hashlib.sha256()
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
                ok = h.hexdigest() == want_sha
            after = _sig(os.fstat(f.fileno()))
    except OSError as e:
        raise ScenarioDataError(f"Doom scenario file {path} cannot be read ({e.strerror or e}); re-fetch the data "
                                f"with: {fix_hint}") from None
    if not ok:
        _DIGEST_CACHE.pop(str(path), None)
        raise ScenarioDataError(f"Doom scenario file {path} does not match its pinned sha256 (sample-factory "
                                f"{scenario_digests.SF_VERSION}); re-fetch the data with: {fix_hint}")
    if after == before:
        _DIGEST_CACHE[str(path)] = before


def check_scenario_files(cfg_path, pinned: bool = False, files=(), fix_hint: str = "") -> None:
    """The load-time check of one scenario: its cfg's keys; when `pinned` (fetched data), the digests of the cfg, of
    `files` and of every file the cfg names, all looked up by name in the pinned table."""
    cfg_path = Path(cfg_path)
    refs = check_cfg(cfg_path)
    if not pinned:
        return
    root = cfg_path.parent
    verify_pinned_file(cfg_path, fix_hint)
    for f in files:
        verify_pinned_file(root / f, fix_hint)
    real_root = os.path.realpath(root)
    for resolved in refs.values():
        verify_pinned_file(resolved, fix_hint, name=os.path.relpath(resolved, real_root))
