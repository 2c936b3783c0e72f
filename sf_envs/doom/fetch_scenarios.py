"""Fetch the Doom scenario data of the Sample Factory paper (battle, battle2, duel, deathmatch, two_colors).

    python -m sf_envs.doom.fetch_scenarios [--dest DIR] [--wheel PATH]

The maps and configs (MIT licence, (c) Aleksei Petrenko) ship inside the `sample-factory` wheel on PyPI.
This downloads that wheel with pip (`pip download --no-deps sample-factory==2.1.1`) into a temporary
directory and extracts only the scenario .wad/.cfg files and the licence into DIR (default:
--doom_scenarios_dir, else $SF_DOOM_SCENARIOS, else <repo>/data/doom_scenarios; `data/` is git-ignored).
Nothing is installed. `--wheel` uses a wheel file already on disk instead of downloading.

Nothing from the wheel is trusted: its sha256 must be the one pinned in sf_envs/doom/scenario_digests.py, and so
must the digest of every file extracted from it; all files are checked in memory before the first one is written,
then written to a temporary directory inside DIR and moved into place, so a refused wheel leaves DIR as it was.
A refusal is one line on stderr naming the file, exit status 1.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from sf_envs.doom import scenario_digests
from sf_envs.doom.scenario_check import file_sha256
from sf_envs.params import get_param
from sf_envs.utils import data_dir

SF_PACKAGE = scenario_digests.SF_PACKAGE
SF_VERSION = scenario_digests.SF_VERSION
SCENARIOS_PREFIX = "sf_examples/vizdoom/doom/scenarios/"
ENV_VAR = "SF_DOOM_SCENARIOS"
LICENSE_NAME = "LICENSE.sample-factory"
MANIFEST_NAME = "MANIFEST.json"
FETCH_COMMAND = "python -m sf_envs.doom.fetch_scenarios"


@dataclass(frozen=True)
class Pins:
    """The digests a wheel and its extracted files must match (tests pass their own for hand-made wheels)."""
    wheel_name: str
    wheel_sha256: str
    files: dict  # extracted name -> (sha256, size)


PINNED = Pins(scenario_digests.WHEEL_NAME, scenario_digests.WHEEL_SHA256, scenario_digests.FILES)


def default_scenarios_dir() -> Path:
    return data_dir("doom_scenarios")


def scenarios_dir(cfg=None) -> Path:
    """Where the fetched scenarios live: cfg.doom_scenarios_dir, else $SF_DOOM_SCENARIOS, else
    <repo>/data/doom_scenarios in a clone or the user's data directory for an installed copy
    (sf_envs.utils.data_dir)."""
    d = get_param(cfg, "doom_scenarios_dir")
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


def verify_wheel(wheel: Path, pins: Pins = PINNED) -> None:
    """Refuse (RuntimeError, one line naming the file) a wheel whose sha256 is not the pinned one."""
    got = file_sha256(wheel)
    if got != pins.wheel_sha256:
        raise RuntimeError(f"{wheel}: sha256 {got} is not the pinned sha256 of {pins.wheel_name} "
                           f"({pins.wheel_sha256}); refusing it")


def extract_scenarios(wheel: Path, dest: Path, pins: Pins = PINNED) -> list[str]:
    """Extract the scenario .wad/.cfg files and the licence from a sample-factory wheel into dest.

    The wheel's sha256 and every extracted file's must match `pins`, and every pinned file must be there; all is
    checked in memory before anything is written. Files are then written to a temporary directory inside dest and
    moved in one by one (each move is atomic), so an interrupted run never leaves a truncated file under its final
    name and a refused wheel changes nothing. Returns the file names.
    """
    wheel, dest = Path(wheel), Path(dest)
    verify_wheel(wheel, pins)
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
        contents = {}
        for base, info in sorted(members.items()) + [(LICENSE_NAME, license_member)]:
            data = zf.read(info)
            pinned = pins.files.get(base)
            if pinned is None:
                raise RuntimeError(f"{wheel}: {info.filename} is not a pinned scenario file; refusing the wheel")
            if (hashlib.sha256(data).hexdigest(), len(data)) != tuple(pinned):
                raise RuntimeError(f"{wheel}: {info.filename} does not match its pinned sha256; refusing the wheel")
            contents[base] = data
    missing = sorted(set(pins.files) - set(contents))
    if missing:
        raise RuntimeError(f"{wheel} lacks pinned scenario file(s) {', '.join(missing)}; refusing it")
    manifest = {"source": f"{SF_PACKAGE} wheel {wheel.name}", "wheel_sha256": pins.wheel_sha256,
                "license": LICENSE_NAME, "files": {b: hashlib.sha256(d).hexdigest() for b, d in contents.items()}}
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetch_", dir=dest))
    try:
        for base, data in contents.items():
            (tmp / base).write_bytes(data)
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        for f in tmp.iterdir():
            os.replace(f, dest / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(members) + [LICENSE_NAME]


def fetch(dest: Optional[Path] = None, wheel: Optional[Path] = None, version: str = SF_VERSION) -> list[str]:
    dest = Path(dest) if dest is not None else scenarios_dir()
    if version != SF_VERSION:
        raise RuntimeError(f"no pinned digests for {SF_PACKAGE} {version} (sf_envs/doom/scenario_digests.py pins "
                           f"{SF_VERSION} only)")
    if wheel is not None:
        return extract_scenarios(Path(wheel), dest)
    with tempfile.TemporaryDirectory(prefix="sf_doom_fetch_") as tmp:
        return extract_scenarios(download_wheel(Path(tmp), version), dest)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=FETCH_COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", "--doom_scenarios_dir", dest="dest", default=None,
                        help=f"target directory (default: ${ENV_VAR} or {default_scenarios_dir()})")
    parser.add_argument("--wheel", default=None, help="use this sample-factory wheel instead of downloading it")
    parser.add_argument("--version", default=SF_VERSION,
                        help=f"sample-factory version to download (only {SF_VERSION}, whose digests are pinned)")
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
