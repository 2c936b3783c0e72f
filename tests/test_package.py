"""Installable as a package (issue 20): a wheel holds the presets, the C++ queue and the entry points, and an installed
copy trains doom_basic with its preset from any working directory.

The wheel is built from a copy of the sources (setup.py, pyproject.toml, MANIFEST.in, sf/, sf_envs/, configs/, cpp/) so
the clone's build/ and egg-info are not touched, installed with --no-deps into a fresh venv, and the third-party
packages of the running venv are made visible with a .pth file of plain paths (those never run the editable install's
finder, so the clone's `sf` stays invisible: checked). A missing preset of a built-in family is a one-line ConfigError;
families that users register have no preset by design."""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from e2e_helpers import made_once

import sf.cfg
from sf.cfg import FAMILIES_WITH_PRESETS, ConfigError, cli_main, load_preset

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "sf", "sf_envs", "configs", "cpp"]
PRESETS = sorted(p.name for p in (ROOT / "configs").glob("*.json"))


def _run(cmd, cwd, timeout=120, env=None):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")} | (env or {})
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(env, PYTHONUNBUFFERED="1"))


def _ok(res):
    assert res.returncode == 0, f"rc {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Build the wheel from a copy of the sources; returns its path."""
    def make(tmp):
        src = tmp / "src"
        src.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info", "build")
        for name in SOURCES:
            path = ROOT / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=ignore)
            else:
                shutil.copy2(path, src / name)
        _ok(_run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                  "--disable-pip-version-check", str(src), "-w", str(tmp / "dist")], cwd=tmp, timeout=300))
        shutil.rmtree(src)
    wheels = list((made_once(tmp_path_factory, "pkg", make) / "dist").glob("sf-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv with only the wheel installed (--no-deps); the running venv's site-packages on a .pth file."""
    venv = tmp_path_factory.mktemp("venv")
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=venv))
    python = venv / "bin" / "python"
    site = Path(_ok(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=venv))
                .stdout.strip())
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_sf_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))  # plain paths: no finder is run
    _ok(_run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index",
              "--disable-pip-version-check", wheel], cwd=venv))
    return venv


@pytest.mark.e2e
def test_wheel_holds_presets_extension_and_entry_points(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert sorted(n[len("sf_configs/"):] for n in names if n.startswith("sf_configs/")) == PRESETS
    assert any(n.startswith("sf/ipc/_cqueue.") and n.endswith(".so") for n in names), "C++ queue not in the wheel"
    assert "sf-train = sf.train:main" in entry_points and "sf-enjoy = sf.enjoy:main" in entry_points
    assert not any(n.startswith(("tests/", "configs/", "cpp/", "data/")) for n in names)


@pytest.mark.e2e
@pytest.mark.doom
def test_installed_copy_trains_doom_basic_with_its_preset(venv, tmp_path):
    pytest.importorskip("vizdoom", reason="vizdoom is not installed: the installed copy's doom_basic run needs it")
    python, cwd, train_dir = venv / "bin" / "python", tmp_path / "cwd", tmp_path / "train_dir"
    cwd.mkdir()
    where = _ok(_run([python, "-c", "import sf, sf.cfg, sf.ipc._cqueue as q; print(sf.__file__); print(q.__file__); "
                                    "print(sf.cfg.CONFIGS_DIR)"], cwd=cwd)).stdout.split()
    assert all(Path(p).resolve().is_relative_to(venv.resolve()) for p in where), where  # not the clone's sf
    assert Path(where[2]).name == "sf_configs"

    res = _ok(_run([venv / "bin" / "sf-train", "--env", "doom_basic", "--experiment", "pkg", "--train_dir", train_dir,
                    "--train_for_env_steps", "4000", "--num_workers", "1", "--device", "cpu"], cwd=cwd, timeout=240))
    exp = train_dir / "pkg"
    import json
    cfg = json.loads((exp / "config.json").read_text())
    # configs/doom.json: "defaults" (rollout 32) and its doom_basic entry (table defaults: batch 1024, RNN, 1 epoch)
    assert (cfg["rollout"], cfg["batch_size"], cfg["use_rnn"], cfg["num_epochs"], cfg["learning_rate"]) == \
        (32, 128, False, 4, 0.0003), cfg
    assert list((exp / "checkpoint_p0").glob("checkpoint_*.pth")), res.stdout[-2000:]
    # (VizDoom itself writes _vizdoom.ini and _vizdoom/ into the working directory, as in the clone)

    # the other entry points of the installed copy: python -m sf.train, sf-enjoy, the Doom scenario fetcher
    assert (venv / "bin" / "sf-enjoy").is_file()
    assert "--train_for_env_steps" in _ok(_run([python, "-m", "sf.train", "--help"], cwd=cwd)).stdout
    assert "--dest" in _ok(_run([python, "-m", "sf_envs.doom.fetch_scenarios", "--help"], cwd=cwd)).stdout

    # an install that lost a preset refuses to train (it used to train silently with the table defaults)
    preset = Path(where[2]) / "doom.json"
    saved = preset.read_bytes()
    preset.unlink()
    try:
        res = _run([python, "-m", "sf.train", "--env", "doom_basic", "--experiment", "gone", "--train_dir", train_dir],
                   cwd=cwd)
    finally:
        preset.write_bytes(saved)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"preset {preset} of env family 'doom' is missing" in res.stderr
    assert not (train_dir / "gone").exists()


def test_missing_preset_is_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sf.cfg.parse, "CONFIGS_DIR", tmp_path / "nowhere")
    for family, env in [("doom", "doom_basic"), ("test", "test_corridor")]:
        with pytest.raises(ConfigError) as e:
            load_preset(env, family)
        msg = str(e.value)
        assert "\n" not in msg and str(tmp_path / "nowhere" / f"{family}.json") in msg, msg
    assert load_preset("my_env", "custom") == {}  # families users register have no preset by design

    rc = cli_main(lambda cfg: 0, mode="train", prog="train.py",
                  argv=["--env", "test_corridor", "--train_dir", str(tmp_path / "td")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("train.py: error: preset "), err


def test_every_builtin_family_has_its_preset():
    assert sorted(f"{f}.json" for f in FAMILIES_WITH_PRESETS) == PRESETS
    assert sf.cfg.CONFIGS_DIR == ROOT / "configs"  # in the clone (also under pip install -e .): configs/ itself


def test_make_train_installs_only_what_training_needs():
    """The quick start's `make train` sets up the venv and trains; Slurm (apt as root) and Sample Factory's venv are
    the tests' set-up (`make test`), never the trainer's. `make -n` prints the recipes without running them; the
    targets' stamps are made absent so that every recipe is printed."""
    root = Path(__file__).resolve().parent.parent

    def recipes(target):
        res = subprocess.run(["make", "-n", "-B", target, "VENV=/nonexistent/venv", "SF_VENV=/nonexistent/sf"],
                             cwd=root, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return res.stdout

    train, test = recipes("train"), recipes("test")
    assert "train.py" in train and "pip install" in train
    for other in ("slurm-wlm", "munge", "sample-factory", "/nonexistent/sf"):
        assert other not in train, other
        assert other in test, other  # the test target still sets them up


def test_make_test_serial_pass_names_every_file_with_a_serial_test():
    """make test's second pass collects only the files in SERIAL_TESTS: a test marked serial in another file would
    run in neither pass (the first deselects it)."""
    root = Path(__file__).resolve().parent.parent
    listed = set(re.search(r"^SERIAL_TESTS = (.*)$", (root / "Makefile").read_text(), re.M).group(1).split())
    marked = {str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
              if re.search(r"pytest\.mark\.serial\b", p.read_text())}  # a decorator or a module's pytestmark
    assert marked and marked == listed, (marked, listed)
