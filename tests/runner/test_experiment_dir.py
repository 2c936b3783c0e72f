"""--restart_behavior: resume keeps the experiment directory, restart moves it aside, overwrite deletes it."""
from sf.cfg import default_cfg
from sf.runner.runner import prepare_experiment_dir


def _cfg(tmp_path, behavior):
    return default_cfg(env="test_corridor", experiment="exp", train_dir=str(tmp_path), restart_behavior=behavior)


def test_restart_behaviors(tmp_path):
    exp = prepare_experiment_dir(_cfg(tmp_path, "resume"))
    (exp / "marker").write_text("old run")
    assert (prepare_experiment_dir(_cfg(tmp_path, "resume")) / "marker").exists()

    exp = prepare_experiment_dir(_cfg(tmp_path, "restart"))
    assert exp.exists() and not (exp / "marker").exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("exp_old_")]
    assert len(aside) == 1 and (aside[0] / "marker").read_text() == "old run"

    (exp / "marker").write_text("second run")
    exp = prepare_experiment_dir(_cfg(tmp_path, "overwrite"))
    assert exp.exists() and not (exp / "marker").exists()
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("exp_old_")]) == 1
    prepare_experiment_dir(_cfg(tmp_path, "restart"))
    prepare_experiment_dir(_cfg(tmp_path, "restart"))  # within the same second: a distinct name, nothing lost
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("exp_old_")]) == 3
