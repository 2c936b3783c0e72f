"""The shared-memory files of a VizDoom engine process, for removing them after its host was killed.

A VizDoom game's host (the Python process that created it: a rollout worker) creates three POSIX shared-memory
objects named after the game's instance id, and removes them when the game is closed. A host that is SIGKILLed never
closes its games, and its files stay in /dev/shm until reboot (10 MiB apparent, ~100 KiB of memory per game: the
pages the engine touched). The engine is started with
`+viz_instance_id ID` on its command line (vizdoom 1.2), which names them, so whoever kills the engine can remove them.
When nobody was left to do that (every process of a run SIGKILLed at once: `kill -9` of its process group, the OOM
killer, a cgroup or batch-system kill), the next run removes them at start-up (remove_stale_engine_files).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

SHM_DIR = Path("/dev/shm")
SEGMENT_PREFIXES = ("ViZDoomSM", "ViZDoomMQCtr", "ViZDoomMQDoom")  # screen buffers, controller and engine queues


def engine_instance_id(cmdline: list[str]) -> str | None:
    """The instance id of the VizDoom engine with this command line; None for any other process."""
    try:
        instance_id = cmdline[cmdline.index("+viz_instance_id") + 1]
    except (ValueError, IndexError):
        return None
    if not instance_id or "/" in instance_id or instance_id.startswith("."):
        return None
    return instance_id


def engine_shm_files(cmdline: list[str]) -> list[Path]:
    """The shared-memory files of the VizDoom engine with this command line; [] for any other process."""
    instance_id = engine_instance_id(cmdline)
    return [] if instance_id is None else [SHM_DIR / f"{prefix}{instance_id}" for prefix in SEGMENT_PREFIXES]


def stale_engine_files(min_age: float = 300.0) -> list[Path]:
    """Engine shared-memory files in /dev/shm that nothing uses any more: ours (this user's), older than `min_age`
    seconds (a game being created has made its files but not yet started its engine), of an instance id that no live
    process names on its command line (its engine) and no live process has mapped or open (its host). What runs whose
    every process was SIGKILLed at once leave behind: no host closed the games, no runner was left to remove them."""
    groups: dict[str, list[Path]] = {}
    now, uid = time.time(), os.getuid()
    try:
        entries = list(os.scandir(SHM_DIR))
    except OSError:
        return []
    for entry in entries:
        prefix = next((p for p in SEGMENT_PREFIXES if entry.name.startswith(p)), None)
        if prefix is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == uid and now - st.st_mtime >= min_age:
            groups.setdefault(entry.name[len(prefix):], []).append(Path(entry.path))
    if not groups:
        return []
    import psutil  # (only when there are candidates: most start-ups see none)
    for proc in psutil.process_iter(["cmdline"]):  # engines alive: their files are in use
        groups.pop(engine_instance_id(proc.info["cmdline"] or []), None)
        if not groups:
            return []
    in_use = mapped_or_open(set(f.name for files in groups.values() for f in files))
    return sorted(f for files in groups.values() if not any(f.name in in_use for f in files) for f in files)


def mapped_or_open(names: set[str]) -> set[str]:
    """Which of these /dev/shm file names some process we can inspect has mapped or open."""
    found = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/maps", errors="replace") as f:
                found.update(line.rstrip("\n").split("/dev/shm/", 1)[1].removesuffix(" (deleted)") for line in f
                             if "/dev/shm/" in line)
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or not ours to read (not ours: its files are not ours either, see the uid check)
            continue
        for fd in fds:
            try:  # one fd closed while we look: the others still count
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/dev/shm/"):
                found.add(target[len("/dev/shm/"):].removesuffix(" (deleted)"))
    return found & names


def remove_stale_engine_files(min_age: float = 300.0) -> tuple[int, int]:
    """Remove stale_engine_files(); returns (files removed, bytes of memory freed: the pages they held, not their
    sizes, which are mostly holes)."""
    count = freed = 0
    for f in stale_engine_files(min_age):
        try:
            size = f.stat().st_blocks * 512
            f.unlink()
        except OSError:  # removed meanwhile, or not removable
            continue
        count, freed = count + 1, freed + size
    return count, freed
