"""Fetching the Doom scenario data: the pinned digests (a forged wheel or file is refused in one line), extraction
logic on locally built fake wheels with their own pins, the cfg-key rules, and the real download."""
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile

import pytest

from sf_envs.doom import fetch_scenarios as fs
from sf_envs.doom import scenario_digests
from sf_envs.doom.scenario_check import ScenarioDataError, check_cfg
from sf_envs.doom.scenarios import SCENARIOS
from sf_envs.errors import EnvUnavailableError

from e2e_helpers import ROOT

LICENSE_TEXT = "MIT License\nCopyright (c) 2019 Aleksei Petrenko\n"
BATTLE_CFG = "doom_scenario_path = battle.wad\n"


def fake_wheel(path, with_license=True, extra=()):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(fs.SCENARIOS_PREFIX + "battle.wad", b"PWAD battle")
        z.writestr(fs.SCENARIOS_PREFIX + "battle.cfg", BATTLE_CFG)
        z.writestr(fs.SCENARIOS_PREFIX + "README.md", "not a scenario file")
        z.writestr(fs.SCENARIOS_PREFIX + "sub/nested.wad", b"nested: not taken")
        z.writestr("sf_examples/vizdoom/doom/doom_gym.py", "print('code is not data')")
        z.writestr("sample_factory/__init__.py", "")
        if with_license:
            z.writestr("sample_factory-2.1.1.dist-info/LICENSE", LICENSE_TEXT)
        for name, data in extra:
            z.writestr(name, data)
    return path


def sha(data) -> str:
    return hashlib.sha256(data if isinstance(data, bytes) else data.encode()).hexdigest()


def pins_for(wheel, **override):
    """Pins that accept the fake wheel above (the test seam: the real fetch uses fs.PINNED)."""
    files = {name: (sha(data), len(data)) for name, data in
             (("battle.wad", b"PWAD battle"), ("battle.cfg", BATTLE_CFG), (fs.LICENSE_NAME, LICENSE_TEXT))}
    files.update(override)
    return fs.Pins(wheel.name, sha(wheel.read_bytes()), files)


def one_line(msg: str) -> str:
    lines = [line for line in msg.splitlines() if line.strip()]
    assert len(lines) == 1, msg
    return lines[0]


def test_extracts_only_scenarios_and_license(tmp_path):
    wheel = fake_wheel(tmp_path / "sample_factory-2.1.1-py3-none-any.whl",
                       extra=[("../../evil.wad", b"x"), ("sf_examples/vizdoom/doom/scenarios/../../../x.cfg", b"y")])
    dest = tmp_path / "data" / "doom_scenarios"
    pins = pins_for(wheel)
    files = fs.extract_scenarios(wheel, dest, pins)
    assert files == ["battle.cfg", "battle.wad", fs.LICENSE_NAME]
    assert sorted(p.name for p in dest.iterdir()) == sorted(files + [fs.MANIFEST_NAME])
    assert (dest / "battle.wad").read_bytes() == b"PWAD battle"
    assert "Aleksei Petrenko" in (dest / fs.LICENSE_NAME).read_text()
    manifest = json.loads((dest / fs.MANIFEST_NAME).read_text())
    assert set(manifest["files"]) == set(files)
    assert not (tmp_path / "evil.wad").exists() and not (tmp_path / "x.cfg").exists()
    # idempotent: a second run replaces the files in place
    assert fs.extract_scenarios(wheel, dest, pins) == files


def test_refuses_wheel_without_license_or_scenarios(tmp_path):
    wheel = fake_wheel(tmp_path / "a.whl", with_license=False)
    with pytest.raises(RuntimeError, match="licence"):
        fs.extract_scenarios(wheel, tmp_path / "out", pins_for(wheel))
    with zipfile.ZipFile(tmp_path / "b.whl", "w") as z:
        z.writestr("sample_factory/__init__.py", "")
    with pytest.raises(RuntimeError, match="no Doom scenarios"):
        fs.extract_scenarios(tmp_path / "b.whl", tmp_path / "out", pins_for(tmp_path / "b.whl"))
    assert not (tmp_path / "out").exists()


def test_destination_resolution(tmp_path, monkeypatch):
    import types
    monkeypatch.delenv(fs.ENV_VAR, raising=False)
    assert fs.scenarios_dir() == ROOT / "data" / "doom_scenarios"
    monkeypatch.setenv(fs.ENV_VAR, str(tmp_path / "env"))
    assert fs.scenarios_dir() == tmp_path / "env"
    assert fs.scenarios_dir(types.SimpleNamespace(doom_scenarios_dir=str(tmp_path / "flag"))) == tmp_path / "flag"


# --- pinned digests ---------------------------------------------------------------------------------

def test_pinned_table_covers_every_fetched_scenario():
    assert fs.PINNED.wheel_sha256 == scenario_digests.WHEEL_SHA256 and fs.SF_VERSION == scenario_digests.SF_VERSION
    assert re.fullmatch(r"[0-9a-f]{64}", scenario_digests.WHEEL_SHA256)
    for name, (digest, size) in scenario_digests.FILES.items():
        assert re.fullmatch(r"[0-9a-f]{64}", digest) and size > 0, name
    for sc in SCENARIOS:
        if sc.needs_fetch:
            for f in (sc.cfg_file, *sc.files):
                assert f in scenario_digests.FILES, (sc.name, f)
    assert fs.LICENSE_NAME in scenario_digests.FILES


@pytest.mark.e2e
def test_forged_wheel_is_refused_by_the_cli(tmp_path):
    """A hand-made wheel that calls itself sample-factory 2.1.1 (issue 14): one line naming it, exit 1, no files."""
    wheel = fake_wheel(tmp_path / "sample_factory-2.1.1-py3-none-any.whl")
    dest = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "sf_envs.doom.fetch_scenarios", "--wheel", str(wheel),
                          "--doom_scenarios_dir", str(dest)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 1, res.stdout + res.stderr
    line = one_line(res.stderr)
    assert str(wheel) in line and "sha256" in line and scenario_digests.WHEEL_SHA256 in line
    assert not dest.exists()
    # a directory with data keeps it untouched
    dest.mkdir()
    (dest / "battle.wad").write_bytes(b"the old one")
    res = subprocess.run([sys.executable, "-m", "sf_envs.doom.fetch_scenarios", "--wheel", str(wheel),
                          "--dest", str(dest)], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 1 and str(wheel) in one_line(res.stderr)
    assert sorted(p.name for p in dest.iterdir()) == ["battle.wad"]
    assert (dest / "battle.wad").read_bytes() == b"the old one"
    # a missing wheel and an unpinned version: one line too
    res = subprocess.run([sys.executable, "-m", "sf_envs.doom.fetch_scenarios", "--wheel", str(tmp_path / "nope.whl"),
                          "--dest", str(tmp_path / "out2")], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 1 and "nope.whl" in one_line(res.stderr)
    with pytest.raises(RuntimeError, match="no pinned digests for sample-factory 2.0.0"):
        fs.fetch(tmp_path / "out3", version="2.0.0")
    assert not (tmp_path / "out2").exists() and not (tmp_path / "out3").exists()


def test_extracted_file_not_matching_its_pin_is_refused(tmp_path):
    """The wheel's digest matches (test pins) but one member does not: nothing is written."""
    wheel = fake_wheel(tmp_path / "w.whl")
    dest = tmp_path / "out"
    with pytest.raises(RuntimeError) as e:
        fs.extract_scenarios(wheel, dest, pins_for(wheel, **{"battle.wad": (sha(b"another map"), 11)}))
    line = one_line(str(e.value))
    assert "battle.wad" in line and "pinned sha256" in line
    assert not dest.exists()
    # a member with no pin, or a pinned file the wheel lacks: refused as well
    wheel2 = fake_wheel(tmp_path / "w2.whl", extra=[(fs.SCENARIOS_PREFIX + "extra.cfg", "vizdoom_path = /bin/sh\n")])
    with pytest.raises(RuntimeError, match="extra.cfg is not a pinned scenario file"):
        fs.extract_scenarios(wheel2, dest, pins_for(wheel2))
    with pytest.raises(RuntimeError, match="lacks pinned scenario file.*ssl2.wad"):
        fs.extract_scenarios(wheel, dest, pins_for(wheel, **{"ssl2.wad": (sha(b"x"), 1)}))
    dest.mkdir()
    (dest / "keep.txt").write_text("x")
    with pytest.raises(RuntimeError):
        fs.extract_scenarios(wheel, dest, pins_for(wheel, **{"battle.cfg": (sha(b"x"), 1)}))
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]  # no temporary directory left behind either


# --- cfg keys -----------------------------------------------------------------------------------------

def write_cfg(d, text, name="s.cfg"):
    d.mkdir(parents=True, exist_ok=True)
    (d / "map.wad").write_bytes(b"PWAD")
    (d / name).write_text(text)
    return d / name


GOOD_CFG = """# a scenario
doom_scenario_path = map.wad
doom_map = map01
episode_timeout = 2100
available_buttons =
    {
        MOVE_LEFT
        MOVE_RIGHT
    }
available_game_variables = { HEALTH AMMO2 }
mode = PLAYER
"""


def test_good_cfg_is_accepted(tmp_path):
    cfg = write_cfg(tmp_path / "sc", GOOD_CFG)
    refs = check_cfg(cfg)
    assert refs == {"doomscenariopath": os.path.realpath(tmp_path / "sc" / "map.wad")}
    (tmp_path / "sc" / "sub").mkdir()
    cfg2 = write_cfg(tmp_path / "sc", "doom_scenario_path = sub/../map.wad\n", name="dots.cfg")
    with pytest.raises(ScenarioDataError, match=r"\.\."):  # no `..` at all, even one that stays inside
        check_cfg(cfg2)


@pytest.mark.parametrize("line, key", [
    ("vizdoom_path = /bin/sh", "vizdoom_path"),
    ("ViZDoom_Path=/tmp/x", "ViZDoom_Path"),  # keys are case-insensitive
    ("vizdoompath = ./vizdoom", "vizdoompath"),  # underscores are ignored, even a path inside the directory
    ("vizdoom_path += x", "vizdoom_path"),
    ("game_args = -file /tmp/evil.wad +exec /tmp/x.cfg", "game_args"),
    ("doom_config_path = my.ini", "doom_config_path"),
    ("doom_scenario_path = ../../x", "doom_scenario_path"),
    ("doom_scenario_path = /etc/passwd", "doom_scenario_path"),
    ("doom_game_path = ../freedoom2.wad", "doom_game_path"),
    ("doom_scenario_path = ~/x.wad", "doom_scenario_path"),
    ("recording_file_path = /tmp/demo.lmp", "recording_file_path"),  # any other path-like key
])
def test_cfg_keys_naming_executables_or_outside_paths_are_refused(tmp_path, line, key):
    cfg = write_cfg(tmp_path / "sc", GOOD_CFG + line + "\n")
    with pytest.raises(ScenarioDataError) as e:
        check_cfg(cfg)
    assert isinstance(e.value, EnvUnavailableError) and isinstance(e.value, ValueError)  # the runner's one-line types
    msg = one_line(str(e.value))
    assert str(cfg) in msg and f"key {key}" in msg and "refused" in msg


def test_cfg_path_escaping_through_a_symlink_is_refused(tmp_path):
    (tmp_path / "outside.wad").write_bytes(b"PWAD")
    cfg = write_cfg(tmp_path / "sc", "doom_scenario_path = link.wad\n")
    os.symlink(tmp_path / "outside.wad", tmp_path / "sc" / "link.wad")
    with pytest.raises(ScenarioDataError, match="key doom_scenario_path = link.wad is refused.*outside"):
        check_cfg(cfg)


def test_cfg_path_is_resolved_again_after_caching(tmp_path):
    (tmp_path / "outside.wad").write_bytes(b"PWAD")
    cfg = write_cfg(tmp_path / "sc", "doom_scenario_path = link.wad\n")
    os.symlink("map.wad", tmp_path / "sc" / "link.wad")
    assert check_cfg(cfg) == {"doomscenariopath": os.path.realpath(tmp_path / "sc" / "map.wad")}
    os.remove(tmp_path / "sc" / "link.wad")
    os.symlink(tmp_path / "outside.wad", tmp_path / "sc" / "link.wad")  # the cfg itself is unchanged
    with pytest.raises(ScenarioDataError, match="outside"):
        check_cfg(cfg)


def test_cfg_check_is_cached_and_sees_changes(tmp_path):
    cfg = write_cfg(tmp_path / "sc", GOOD_CFG)
    check_cfg(cfg)
    st = os.stat(cfg)
    new = GOOD_CFG.replace("doom_map = map01", "vizdoom_path=/xy")
    assert len(new) == len(GOOD_CFG)
    cfg.write_text(new)  # same size
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime: the ctime still changes
    with pytest.raises(ScenarioDataError, match="vizdoom_path"):
        check_cfg(cfg)


@pytest.mark.e2e
def test_real_fetch_from_pypi(tmp_path):
    """The real thing: pip download sample-factory==2.1.1 and extract its scenarios (about 25 MB)."""
    dest = tmp_path / "doom_scenarios"
    res = subprocess.run([sys.executable, "-m", "sf_envs.doom.fetch_scenarios", "--dest", str(dest)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    if res.returncode != 0 and "pip download" in res.stderr:
        pytest.skip(f"PyPI not reachable from here: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    needed = {"battle.wad", "battle_continuous_turning.cfg", "battle2.wad", "battle2_continuous_turning.cfg",
              "ssl2.wad", "ssl2.cfg", "dwango5.wad", "dwango5_dm_continuous_weap.cfg", "two_colors_easy.wad",
              "two_colors_hard.cfg", fs.LICENSE_NAME}
    names = {p.name for p in dest.iterdir()}
    assert needed <= names
    assert all(n.endswith((".wad", ".cfg")) for n in names - {fs.LICENSE_NAME, fs.MANIFEST_NAME})
    assert "MIT License" in (dest / fs.LICENSE_NAME).read_text()
    manifest = json.loads((dest / fs.MANIFEST_NAME).read_text())
    assert manifest["wheel_sha256"] == scenario_digests.WHEEL_SHA256
    for name in names - {fs.MANIFEST_NAME}:  # what was fetched is what is pinned
        assert hashlib.sha256((dest / name).read_bytes()).hexdigest() == scenario_digests.FILES[name][0], name
    try:
        import vizdoom  # noqa: F401
    except ImportError:
        return
    from sf_envs.params import env_cfg
    from sf_envs.registry import make_env
    env = make_env(env_cfg("doom_battle", doom_scenarios_dir=str(dest)))  # the fetched data runs
    env.reset()
    env.step(env.action_space.sample())
    env.close()
