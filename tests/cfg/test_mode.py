"""RunMode (sf/cfg/mode.py): each mode's meaning resolved once from the configuration, the one place --sync_mode's
string is read; a mode added the documented way (one MODES entry) trains end to end."""
import ast
import pickle
import re
import textwrap
from pathlib import Path

import pytest

from sf.cfg import ConfigError, default_cfg
from sf.cfg.mode import EVALUATION, MODES, RunMode
from sf.cfg.shape import RunShape
from sf.learning.batch_schedule import SCHEDULES

ROOT = Path(__file__).resolve().parents[2]


def test_every_mode_has_a_schedule_and_its_slots_follow_its_intervals():
    for mode in MODES.values():
        assert mode.schedule in SCHEDULES, mode.name
        assert mode.lag_bounded == mode.frees_slots == (not mode.intervals)
    assert EVALUATION.schedule is None and EVALUATION.deterministic and not EVALUATION.paced


@pytest.mark.parametrize("sync_mode,intervals,deterministic,paced", [
    ("async", False, False, True), ("hts", True, True, False), ("ppo", True, True, False)])
def test_mode_of_a_configuration(sync_mode, intervals, deterministic, paced):
    mode = default_cfg(sync_mode=sync_mode).mode
    assert (mode.name, mode.intervals, mode.deterministic, mode.paced) == (sync_mode, intervals, deterministic, paced)
    assert mode.heals == (not intervals)  # (--max_restarts_per_hour's default is > 0)


def test_the_run_switches_heal_serial_and_evaluation():
    assert not default_cfg(max_restarts_per_hour=0).mode.heals
    serial = default_cfg(serial_mode=True).mode
    assert serial.serial and not serial.heals
    evaluating = default_cfg(_eval_plan=object()).mode
    assert evaluating.name == "eval" and evaluating.deterministic and evaluating.schedule is None


def test_minibatches_follow_the_mode():
    cfg = default_cfg(num_workers=2, num_envs_per_worker=4, rollout=32, batch_size=128, num_batches_per_epoch=3)
    assert cfg.mode.minibatches(cfg) == 3  # async: --num_batches_per_epoch
    hts = cfg.replace(sync_mode="hts")
    assert hts.mode.minibatches(hts) == 2  # one rollout of every env (8 x 32) in batches of 128
    # an env of 8 agents (an EnvPool pool, a multi-agent env): one rollout of every agent, 8 x 8 x 32 samples (the
    # env count alone made 2 steps of 1,024 samples out of a batch of 2,048)
    assert hts.mode.minibatches(hts, RunShape.of(hts, agents_per_env=8)) == 16
    assert hts.mode.minibatches(hts, RunShape.of(hts, agents_per_env=1)) == 2


def test_resolved_once_per_configuration_and_carried_by_pickle():
    cfg = default_cfg(sync_mode="hts")
    assert cfg.mode is cfg.mode
    copy = pickle.loads(pickle.dumps(cfg))
    assert copy == cfg and copy.mode == cfg.mode
    assert cfg.replace(sync_mode="async").mode.name == "async"  # a variant is resolved again


def test_an_unknown_mode_is_one_line():
    with pytest.raises(ConfigError, match=r"--sync_mode 'lockstep': choose among async, hts, ppo"):
        RunMode.of(default_cfg(sync_mode="lockstep"))


def test_no_module_outside_sf_cfg_reads_the_mode_flags():
    """cfg.sync_mode and cfg.serial_mode are read in sf/cfg alone; every other module asks cfg.mode (setting them in
    a replace(...) is not reading them)."""
    readers = []
    for path in [*sorted((ROOT / "sf").rglob("*.py")), *sorted((ROOT / "sf_envs").rglob("*.py")),
                 ROOT / "train.py", ROOT / "enjoy.py"]:
        if path.parent == ROOT / "sf" / "cfg":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("sync_mode", "serial_mode"):
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not readers, readers


# A mode added the way docs/architecture.md says: one MODES entry. The test cannot edit sf/cfg/mode.py, so a
# sitecustomize on PYTHONPATH adds the entry in every process the run starts (runner, fork server, its children).
TOY = textwrap.dedent("""
    import dataclasses, sys
    sys.path.insert(0, {root!r})
    from sf.cfg import mode
    mode.MODES["toy"] = dataclasses.replace(mode.MODES["ppo"], name="toy",
                                            line="toy (a test's mode: {{batch}} samples, then {{steps}} SGD steps)")
""")


@pytest.mark.doom
@pytest.mark.e2e
def test_a_mode_added_as_one_entry_trains(entry, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(TOY.format(root=str(ROOT)))
    res = entry("train.py", "--env", "doom_basic", "--experiment", "toy", "--train_dir", tmp_path / "runs",
                "--sync_mode", "toy", "--num_workers", 2, "--num_envs_per_worker", 4, "--train_for_env_steps", 2000,
                "--device", "cpu", "--seed", 3, timeout=240, env={"PYTHONPATH": str(site)})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "Mode: toy (a test's mode: 256 samples, then 8 SGD steps)" in out, out[-3000:]
    # ppo's schedule: a budget of 2,000 frames ends at the batch boundary that reaches it (2 batches of 1,024)
    digest = re.findall(r"Final weights sha256: [0-9a-f]{64} \(policy version (\d+), (\d+) env frames\)", out)
    assert digest and int(digest[0][1]) == 2048, out[-3000:]
    # without the entry the flag is refused in one line
    bad = entry("train.py", "--env", "doom_basic", "--sync_mode", "toy", "--train_dir", tmp_path / "runs")
    assert bad.returncode == 2 and "--sync_mode" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_adding_a_mode_is_documented():
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Adding a mode"):]
    assert "sf/cfg/mode.py" in section and "SCHEDULES" in section and "test_mode.py" in section
