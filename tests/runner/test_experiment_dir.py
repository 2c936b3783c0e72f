"""--restart_behavior: resume keeps the experiment directory, restart moves it aside, overwrite deletes it; restart and
overwrite act only on an experiment of ours (a real directory inside the train dir with its config.json)."""
import pytest

from sf.cfg import ConfigError, default_cfg, save_cfg
from sf.runner.runner import prepare_experiment_dir


def _cfg(tmp_path, behavior, experiment="exp"):
    return default_cfg(env="test_corridor", experiment=experiment, train_dir=str(tmp_path), restart_behavior=behavior)


def _experiment(tmp_path, marker: str):
    cfg = _cfg(tmp_path, "resume")
    exp = prepare_experiment_dir(cfg)
    save_cfg(cfg, exp)
    (exp / "marker").write_text(marker)
    return exp


def test_restart_behaviors(tmp_path):
    exp = _experiment(tmp_path, "old run")
    assert (prepare_experiment_dir(_cfg(tmp_path, "resume")) / "marker").exists()

    exp = prepare_experiment_dir(_cfg(tmp_path, "restart"))
    assert exp.exists() and not (exp / "marker").exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("exp_old_")]
    assert len(aside) == 1 and (aside[0] / "marker").read_text() == "old run"

    exp = _experiment(tmp_path, "second run")
    exp = prepare_experiment_dir(_cfg(tmp_path, "overwrite"))
    assert exp.exists() and not (exp / "marker").exists()
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("exp_old_")]) == 1
    for _ in range(2):  # within the same second: a distinct name, nothing lost
        _experiment(tmp_path, "again")
        prepare_experiment_dir(_cfg(tmp_path, "restart"))
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("exp_old_")]) == 3


@pytest.mark.parametrize("behavior", ["restart", "overwrite"])
def test_only_an_experiment_of_ours_is_moved_or_deleted(tmp_path, behavior):
    train_dir = tmp_path / "train"
    train_dir.mkdir()
    plain = train_dir / "plain"  # a directory that holds no experiment
    plain.mkdir()
    (plain / "precious").write_text("data")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("{}")
    (train_dir / "link").symlink_to(outside, target_is_directory=True)  # an experiment name that leads elsewhere
    (train_dir / "file").write_text("not a directory")
    for name in ("plain", "link", "file"):
        with pytest.raises(ConfigError, match="not an experiment directory"):
            prepare_experiment_dir(_cfg(train_dir, behavior, name))
    assert (plain / "precious").read_text() == "data"
    assert (outside / "config.json").read_text() == "{}" and (train_dir / "link").is_symlink()
    assert (train_dir / "file").read_text() == "not a directory"
    assert sorted(p.name for p in train_dir.iterdir()) == ["file", "link", "plain"]
