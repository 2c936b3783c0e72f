"""The linter and the type checker over the tree, with pyproject.toml's settings: ruff (pycodestyle's errors and
warnings, pyflakes, one line length: 120) and mypy (sf/, sf_envs/ and the entry points; Config's fields through the
generated sf/cfg/config.pyi). Both come with the dev extra (`make setup`): a missing one is a broken set-up, not a
reason to skip."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> list[str]:
    exe = Path(sys.executable).with_name(name)
    if exe.exists():
        return [str(exe)]
    found = shutil.which(name)
    assert found, f"{name} is not installed: pip install -e .[dev] (make setup) installs it"
    return [found]


def test_ruff_finds_nothing():
    res = subprocess.run([*_tool("ruff"), "check", "--no-cache", "--output-format", "concise", str(ROOT)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, f"ruff check found problems (fix them, or see pyproject.toml's [tool.ruff]):\n" \
                                f"{res.stdout[-6000:]}{res.stderr[-2000:]}"


def test_the_linter_sees_a_long_line_and_an_unused_import(tmp_path):
    """The rules are on: a file with a 121-character line and an unused import gets both findings."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n" + "x = " + repr("a" * 115) + "\n")
    assert len(bad.read_text().splitlines()[1]) == 121
    res = subprocess.run([*_tool("ruff"), "check", "--no-cache", "--output-format", "concise", "--config",
                          str(ROOT / "pyproject.toml"), str(bad)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "E501" in res.stdout and "F401" in res.stdout, res.stdout + res.stderr


def test_mypy_finds_nothing_and_catches_a_misspelled_config_field(tmp_path):
    """The tree passes at pyproject.toml's level, and that level sees a misspelled Config field (with its cache, the
    second run checks just the one file)."""
    cache = ["--cache-dir", str(tmp_path / "cache")]
    res = subprocess.run([*_tool("mypy"), *cache], capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert res.returncode == 0, f"mypy found problems (see pyproject.toml's [tool.mypy]):\n{res.stdout[-6000:]}" \
                                f"{res.stderr[-2000:]}"
    bad = tmp_path / "misspelled.py"
    bad.write_text("from sf.cfg import Config\n\n\ndef lr(cfg: Config) -> float:\n    return cfg.learning_rat\n")
    res = subprocess.run([*_tool("mypy"), *cache, str(bad)], capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert res.returncode == 1 and '"Config" has no attribute "learning_rat"' in res.stdout, res.stdout + res.stderr
