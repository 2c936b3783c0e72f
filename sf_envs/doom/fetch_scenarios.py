"""Fetch the Doom scenario data of the Sample Factory paper (battle, battle2, duel, deathmatch, two_colors).

    python -m sf_envs.doom.fetch_scenarios [--dest DIR] [--wheel PATH] [--force]

The maps and configs (MIT licence, (c) Aleksei Petrenko) ship inside the `sample-factory` wheel on PyPI.
This downloads that wheel with pip (`pip download --no-deps sample-factory==2.1.1`) into a temporary
directory and extracts only the scenario .wad/.cfg files and the licence into DIR (default:
--doom_scenarios_dir, else $SF_DOOM_SCENARIOS, else <repo>/data/doom_scenarios; `data/` is git-ignored).
Nothing is installed. `--wheel` uses a wheel file already on disk instead of downloading.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

SF_PACKAGE = "sample-factory"
SF_VERSION = "2.1.1"
SCENARIOS_PREFIX = "sf_examples/vizdoom/doom/scenarios/"
ENV_VAR = "SF_DOOM_SCENARIOS"
LICENSE_NAME = "LICENSE.sample-factory"
MANIFEST_NAME = "MANIFEST.json"
FETCH_COMMAND = "python -m sf_envs.doom.fetch_scenarios"

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def default_scenarios_dir() -> Path:
    return REPO_ROOT / "data" / "doom_scenarios"


def scenarios_dir(cfg=None) -> Path:
    """Where the fetched scenarios live: cfg.doom_scenarios_dir, else $SF_DOOM_SCENARIOS, else <repo>/data/doom_scenarios."""
    d = getattr(cfg, "doom_scenarios_dir", None) if cfg is not None else None
    if not d:
        d = os.environ.get(ENV_VAR) or None
    return Path(os.path.expanduser(d)) if d else default_scenarios_dir()


def fetch_hint(dest: Optional[Path] = None) -> str:
    if dest is None or Path(dest) == default_scenarios_dir():
        return FETCH_COMMAND
    return f"{FETCH_COMMAND} --dest {dest}"


def download_wheel(workdir: Path, version: str = SF_VERSION) -> Path:
    """`pip download --no-deps sample-factory==<version>` into workdir; returns the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(workdir), f"{SF_PACKAGE}=={version}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(workdir.glob("sample_factory-*.whl"))
    if res.returncode != 0 or not wheels:
        last = (res.stderr or res.stdout).strip().splitlines()
        raise RuntimeError(f"pip download of {SF_PACKAGE}=={version} failed: {last[-1] if last else 'no wheel'}")
    return wheels[0]


def extract_scenarios(wheel: Path, dest: Path) -> list[str]:
    """Extract the scenario .wad/.cfg files and the licence from a sample-factory wheel into dest.

    Files are written to a temporary directory next to dest and moved in one by one (each move is atomic),
    so an interrupted run never leaves a truncated file under its final name. Returns the file names.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        members = {}
        license_member = None
        for info in zf.infolist():
            name = info.filename
            if info.is_dir():
                continue
            if name.startswith(SCENARIOS_PREFIX) and name.lower().endswith((".wad", ".cfg")):
                base = Path(name).name  # never a path from the archive: no traversal
                if base and "/" not in name[len(SCENARIOS_PREFIX):]:
                    members[base] = info
            elif ".dist-info/" in name and Path(name).name.upper().startswith(("LICENSE", "LICENCE")):
                license_member = info
        if not members:
            raise RuntimeError(f"{wheel} holds no Doom scenarios under {SCENARIOS_PREFIX}")
        if license_member is None:
            raise RuntimeError(f"{wheel} holds no licence file; refusing to copy its data without it")
        manifest = {"source": f"{SF_PACKAGE} wheel {Path(wheel).name}", "license": LICENSE_NAME, "files": {}}
        tmp = Path(tempfile.mkdtemp(prefix=".fetch_", dir=dest))
        try:
            for base, info in sorted(members.items()) + [(LICENSE_NAME, license_member)]:
                data = zf.read(info)
                (tmp / base).write_bytes(data)
                manifest["files"][base] = hashlib.sha256(data).hexdigest()
            (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            for f in tmp.iterdir():
                os.replace(f, dest / f.name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return sorted(members) + [LICENSE_NAME]


def fetch(dest: Optional[Path] = None, wheel: Optional[Path] = None, version: str = SF_VERSION) -> list[str]:
    dest = Path(dest) if dest is not None else scenarios_dir()
    if wheel is not None:
        return extract_scenarios(Path(wheel), dest)
    with tempfile.TemporaryDirectory(prefix="sf_doom_fetch_") as tmp:
        return extract_scenarios(download_wheel(Path(tmp), version), dest)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=FETCH_COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", "--doom_scenarios_dir", dest="dest", default=None,
                        help=f"target directory (default: ${ENV_VAR} or {default_scenarios_dir()})")
    parser.add_argument("--wheel", default=None, help="use this sample-factory wheel instead of downloading it")
    parser.add_argument("--version", default=SF_VERSION, help=f"sample-factory version to download (default {SF_VERSION})")
    args = parser.parse_args(argv)
    dest = Path(os.path.expanduser(args.dest)) if args.dest else scenarios_dir()
    try:
        files = fetch(dest, args.wheel, args.version)
    except (RuntimeError, OSError, zipfile.BadZipFile) as e:
        print(f"fetch_scenarios: {e}", file=sys.stderr)
        return 1
    print(f"Doom scenarios: {len(files) - 1} files and the licence in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
