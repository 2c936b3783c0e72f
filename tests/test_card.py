"""python -m sf.card: EXP/README.md, a model card in the layout of Sample Factory's model repositories, from a real tiny
training run: its numbers are those the run wrote, its training command resolves to the run's configuration."""
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from e2e_helpers import ROOT, SMALL, made_once

pytestmark = pytest.mark.e2e


def card(*args):
    return subprocess.run([sys.executable, "-m", "sf.card", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))


@pytest.fixture(scope="module")
def exp_dir(tmp_path_factory):
    def make(td):
        res = subprocess.run([sys.executable, "train.py", "--env", "test_image", "--experiment", "img", "--train_dir",
                              td, *SMALL, "--num_workers", "1", "--train_for_env_steps", "2000", "--learning_rate",
                              "0.0007"], capture_output=True, text=True, timeout=180, cwd=ROOT)
        assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    return made_once(tmp_path_factory, "card_runs", make) / "img"


def section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_card_of_a_run_not_evaluated(exp_dir, tmp_path):
    from sf.cfg import all_params, parse_cfg
    from sf.utils.events import drop_orphans, read_scalar_events
    res = card(exp_dir.name, "--train_dir", exp_dir.parent)
    assert res.returncode == 0, res.stderr
    text = (exp_dir / "README.md").read_text()
    # Sample Factory's layout: YAML front matter (no model-index before an evaluation), the model sentence
    assert text.startswith("---\nlibrary_name: sample-factory\ntags:\n- deep-reinforcement-learning\n")
    assert "model-index" not in text and "A(n) **APPO** model trained on the **test_image** environment." in text
    results = section(text, "Results")
    steps = max(int(p.name.split("_")[2].split(".")[0]) for p in (exp_dir / "checkpoint_p0").glob("checkpoint_*.pth"))
    assert f"| Env frames trained | {steps:,} (latest checkpoint" in results
    rewards = [v for _, _, v in drop_orphans(read_scalar_events(exp_dir)["reward/reward"])]
    assert f"| {rewards[-1]:.3f} / {max(rewards):.3f} (" in results
    assert f"| Evaluation | not evaluated: `python -m sf.eval {exp_dir} --episodes 1000` |" in results
    png = exp_dir / "learning_curves.png"
    assert "![Learning curves](learning_curves.png)" in text and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    hardware = section(text, "Hardware")
    assert "device cpu, 1 rollout workers x" in hardware and "This machine (where the card was written" in hardware

    # the training command resolves, in a fresh train dir, to the configuration the run saved
    command = section(text, "Training").split("```\n", 2)[1].splitlines()[0]
    argv = shlex.split(command)
    assert argv[:2] == ["python", "train.py"] and "--learning_rate" in argv and "--seed" in argv
    argv[argv.index("--train_dir") + 1] = str(tmp_path)
    cfg = parse_cfg(argv[2:], mode="train").as_dict()
    saved = json.loads((exp_dir / "config.json").read_text())
    for p in all_params():
        if p.scope != "enjoy" and p.name not in ("train_dir", "restart_behavior"):
            assert cfg[p.name] == saved[p.name], p.name


def test_card_with_an_evaluation(exp_dir):
    """An evaluation CSV (sf.eval's columns): its mean return and Student's-t 95% CI in the card, mean +/- std in the
    front matter's model-index as Sample Factory writes it."""
    returns = [4.0, 6.0, 9.0, 5.0, 6.0]
    lines = ["episode,policy,agent,env_seed,return,length,true_objective,wall_time"]
    lines += [f"{i},0,0,{100 + i},{r},16,,0.01" for i, r in enumerate(returns)]
    (exp_dir / "eval_latest_seed0_5ep.csv").write_text("\n".join(lines) + "\n")
    try:
        res = card(exp_dir)
        assert res.returncode == 0, res.stderr
        text = (exp_dir / "README.md").read_text()
    finally:
        (exp_dir / "eval_latest_seed0_5ep.csv").unlink()
    mean = sum(returns) / 5
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / 4)
    half = 2.776445 * std / math.sqrt(5)  # t(0.975, 4)
    assert f"mean return {mean:.3f} over 5 episodes, 95% CI [{mean - half:.3f}, {mean + half:.3f}]" in text
    front = text.split("---\n")[1]
    assert "model-index:\n- name: APPO\n" in front and f"      value: {mean:.2f} +/- {std:.2f}\n" in front
    assert "      name: test_image\n" in front and "not evaluated" not in text


def snapshot(root):
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_bad_input_one_line_exit_2_nothing_written(exp_dir, tmp_path):
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("not an experiment")
    (tmp_path / "untrained").mkdir()
    shutil.copy(exp_dir / "config.json", tmp_path / "untrained" / "config.json")
    bad_eval = tmp_path / "bad_eval"
    shutil.copytree(exp_dir, bad_eval, ignore=shutil.ignore_patterns("README.md", "*.png"))
    (bad_eval / "eval.csv").write_text("episode,reward\n0,1.0\n")
    cases = [((tmp_path / "missing",), "does not exist"), ((tmp_path / "foreign",), "no config.json"),
             (("untrained", "--train_dir", tmp_path), "no checkpoint in"),
             ((bad_eval,), "eval.csv: no 'return' column"), ((exp_dir, "--bogus"), "--bogus")]
    for argv, needle in cases:
        before = snapshot(tmp_path)
        res = card(*argv)
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and needle in res.stderr, (argv, res.stderr)
        assert re.match(r"python -m sf\.card: error: ", res.stderr) and snapshot(tmp_path) == before, argv


def test_a_readme_the_card_did_not_write_is_kept(exp_dir, tmp_path):
    """A README.md the user wrote is not replaced: one line naming --force, exit 2, the file untouched; --force
    replaces it, and a card replaces its own earlier card without asking."""
    exp = tmp_path / "exp"
    shutil.copytree(exp_dir, exp, ignore=shutil.ignore_patterns("README.md", "*.png"))
    mine = "# My notes\n\nWhat I changed in this run.\n"
    (exp / "README.md").write_text(mine)
    res = card(exp)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--force" in res.stderr, res.stderr
    assert (exp / "README.md").read_text() == mine and not (exp / "learning_curves.png").exists()
    res = card(exp, "--force")
    assert res.returncode == 0, res.stderr
    written = (exp / "README.md").read_text()
    assert written.startswith("---\n") and "My notes" not in written
    (exp / "README.md").write_text(written + "\n<!-- the user's own line under the card -->\n")
    assert card(exp).returncode == 0  # its own card (the mark is in it) is updated without --force
    assert "the user's own line" not in (exp / "README.md").read_text()
