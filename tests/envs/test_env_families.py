"""The built-in env families are listed once (sf_envs/families.py); the registry, the presets' check (sf.cfg) and
enjoy derive from that list, and each family ships its preset configs/<family>.json."""
import ast
from pathlib import Path

import sf.cfg
import sf.enjoy
from sf_envs import registry
from sf_envs.families import FAMILIES, FAMILY_NAMES

ROOT = Path(__file__).resolve().parent.parent.parent
# the library, where a second list could creep in (benchmarks/ key Sample Factory's examples and their workloads by
# family: data about the other side, not our list)
SOURCES = ["sf", "sf_envs", "train.py", "enjoy.py"]


def test_each_family_has_its_preset_and_each_preset_a_family():
    assert sorted(p.stem for p in (ROOT / "configs").glob("*.json")) == sorted(FAMILY_NAMES)
    assert sf.cfg.FAMILIES_WITH_PRESETS is FAMILY_NAMES  # derived, not spelled again


def test_the_registry_and_enjoy_derive_from_the_list():
    assert sorted(registry._SPECS) == sorted(f.name for f in FAMILIES if f.listed)
    assert list(registry._FAMILIES) == [f.prefix for f in FAMILIES if f.listed]
    assert registry.FAMILIES_WITH_FRAMESKIP == tuple(f.name for f in FAMILIES if f.frameskip)
    assert sf.enjoy.NATIVE_FPS == {f.name: f.native_fps for f in FAMILIES if f.native_fps}
    by_name = {f.name: f for f in FAMILIES}
    for name in registry.env_names():  # every listed env belongs to a family of the list, under its prefix
        spec = registry.env_spec(name)
        assert spec.family in by_name and name.startswith(by_name[spec.family].prefix), (name, spec.family)
    assert registry.env_spec("gym:CartPole-v1").family == "gym"


def _family_names_in(node: ast.AST) -> set[str]:
    """The family names (or name prefixes: "doom_", "gym:") among a literal collection's string elements/keys."""
    items = node.keys if isinstance(node, ast.Dict) else node.elts
    words = {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
    prefixes = {f.prefix: f.name for f in FAMILIES}
    return {prefixes.get(w, w) for w in words} & set(FAMILY_NAMES)


def test_no_second_list_of_families():
    """No tuple, list, set or dict literal outside sf_envs/families.py names two or more families: a list of them
    is derived from FAMILIES (as registry.FAMILIES_WITH_FRAMESKIP, sf.cfg.FAMILIES_WITH_PRESETS, enjoy's NATIVE_FPS)."""
    paths = [p for s in SOURCES for p in ((ROOT / s).rglob("*.py") if (ROOT / s).is_dir() else [ROOT / s])]
    found = []
    for path in paths:
        if path == ROOT / "sf_envs" / "families.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and len(_family_names_in(node)) >= 2:
                found.append(f"{path.relative_to(ROOT)} line {node.lineno}: {sorted(_family_names_in(node))}")
    assert not found, "lists of env families outside sf_envs/families.py:\n" + "\n".join(found)


def test_the_scan_sees_a_list(tmp_path):
    """The scan itself: the old spellings are found."""
    old = ast.parse('A = ("doom", "atari", "dmlab")\nB = {"doom_": 1, "mujoco_": 2}\nC = ("mujoco", "imageio")')
    assert [len(_family_names_in(n)) for n in ast.walk(old) if isinstance(n, (ast.Tuple, ast.Dict))] == [3, 2, 1]
