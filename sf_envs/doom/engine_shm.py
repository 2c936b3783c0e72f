"""The shared-memory files of a VizDoom engine process, for removing them after its host was killed.

A VizDoom game's host (the Python process that created it: a rollout worker) creates three POSIX shared-memory
objects named after the game's instance id, and removes them when the game is closed. A host that is SIGKILLed never
closes its games, and ~10 MiB per game stay in /dev/shm until reboot. The engine is started with
`+viz_instance_id ID` on its command line (vizdoom 1.2), which names them, so whoever kills the engine can remove them.
"""
from __future__ import annotations

from pathlib import Path

SHM_DIR = Path("/dev/shm")
SEGMENT_PREFIXES = ("ViZDoomSM", "ViZDoomMQCtr", "ViZDoomMQDoom")  # screen buffers, controller and engine queues


def engine_shm_files(cmdline: list[str]) -> list[Path]:
    """The shared-memory files of the VizDoom engine with this command line; [] for any other process."""
    try:
        instance_id = cmdline[cmdline.index("+viz_instance_id") + 1]
    except (ValueError, IndexError):
        return []
    if not instance_id or "/" in instance_id or instance_id.startswith("."):
        return []
    return [SHM_DIR / f"{prefix}{instance_id}" for prefix in SEGMENT_PREFIXES]
