"""The linter over the whole tree: ruff with pyproject.toml's rules (pycodestyle's errors and warnings, pyflakes) and
its one line length, 120. ruff comes with the dev extra (`make setup`), so a missing ruff is a broken set-up, not a
reason to skip."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ruff")
    assert found, "ruff is not installed: pip install -e .[dev] (make setup) installs it"
    return [found]


def test_ruff_finds_nothing():
    res = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise", str(ROOT)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, f"ruff check found problems (fix them, or see pyproject.toml's [tool.ruff]):\n" \
                                f"{res.stdout[-6000:]}{res.stderr[-2000:]}"


def test_the_linter_sees_a_long_line_and_an_unused_import(tmp_path):
    """The rules are on: a file with a 121-character line and an unused import gets both findings."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n" + "x = " + repr("a" * 115) + "\n")
    assert len(bad.read_text().splitlines()[1]) == 121
    res = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise", "--config",
                          str(ROOT / "pyproject.toml"), str(bad)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "E501" in res.stdout and "F401" in res.stdout, res.stdout + res.stderr
