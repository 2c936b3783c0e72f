"""python -m sf.export: a trained policy as an ONNX graph that onnxruntime runs to the torch model's outputs.

Three tiny real training runs: test_image with a GRU (uint8 frames, MultiDiscrete), test_masked with an LSTM and
normalized returns (a Dict observation: float "obs" and the int8 "action_mask" that masks the logits inside the graph),
and a population of two feed-forward policies on test_box (normalized vector input, Box actions). Each export is
compared with the torch model on 100 observations the env gave while the policy played, the recurrent state carried by
each side through all 100 steps.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from e2e_helpers import ROOT, SMALL, made_once

import onnxruntime  # the `export` extra (setup.py), which `make setup` installs

pytestmark = pytest.mark.e2e
TOL = 1e-5
STEPS = 100

RUNS = {  # name: (env, extra flags, expected inputs, expected outputs)
    "image_gru": ("test_image", ["--use_rnn", "True", "--train_for_env_steps", "2000"],
                  ["obs", "rnn_state"], ["action_logits", "value", "new_rnn_state"]),
    "masked_lstm": ("test_masked", ["--use_rnn", "True", "--rnn_type", "lstm", "--normalize_returns", "True",
                                    "--train_for_env_steps", "2000"],
                    ["obs", "action_mask", "rnn_state"], ["action_logits", "value", "new_rnn_state"]),
    "box_population": ("test_box", ["--use_rnn", "False", "--num_policies", "2", "--train_for_env_steps", "3000"],
                       ["obs"], ["action_mean", "action_log_std", "value"]),
}


def run(*args, timeout=180):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))


@pytest.fixture(scope="module")
def train_dir(tmp_path_factory):
    """The three experiments trained, in one train dir."""

    def make(td):
        for name, (env, extra, _, _) in RUNS.items():
            res = run("train.py", "--env", env, "--experiment", name, "--train_dir", td, *SMALL, "--num_workers", "1",
                      *extra)
            assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    return made_once(tmp_path_factory, "export_runs", make)


@pytest.fixture(scope="module")
def exported(train_dir):
    """Every experiment exported (every policy of the population), in this process (the entry point's own process is
    run by test_population_exports_every_policy)."""
    from sf.export import main
    for name in RUNS:
        assert main([name, "--train_dir", str(train_dir)]) == 0
    return train_dir


def torch_policy(exp_dir, policy: int, checkpoint_name: str):
    """The env and the torch model of `policy` loaded from the checkpoint the export names (as enjoy loads it)."""
    import torch
    from sf.policy_loading import load_policy, open_env
    from sf.export import experiment_cfg
    cfg = experiment_cfg(exp_dir, "test")
    env = open_env(cfg)
    cfg = cfg.replace(load_checkpoint_kind="best" if checkpoint_name.startswith("best_") else "latest")
    model, state = load_policy(cfg, env.observation_space, env.action_space, torch.device("cpu"), policy)
    assert os.path.basename(state["path"]) == checkpoint_name
    return env, model


def reference(model, obs: dict, rnn):
    """What the graph must give (its output order) from the model's own forward_step; obs key -> [B, ...] arrays."""
    import torch
    from gymnasium import spaces
    with torch.no_grad():
        out = model.forward_step({k: torch.as_tensor(v) for k, v in obs.items()}, torch.as_tensor(rnn))
        if isinstance(model.action_space, spaces.Box):
            dist = model.action_distribution(out.action_logits)
            heads = [dist.mean, dist.log_std]
        else:
            heads = [out.action_logits]
        outs = heads + [out.values] + ([out.new_rnn_states] if model.is_recurrent else [])
        action = model.action_distribution(out.action_logits).sample()[0].numpy()
    return [o.numpy() for o in outs], out.new_rnn_states.numpy(), action


def play_and_compare(exp_dir, policy, expected_inputs, expected_outputs):
    """Plays STEPS env steps with the torch policy (sampled actions), the recurrent state carried by torch and by
    onnxruntime each on its own through every step (episode ends included); compares every step's outputs.
    Returns (session, model, the recorded observations, the torch states fed at each step)."""
    session = onnxruntime.InferenceSession(str(exp_dir / "export" / f"policy_p{policy}.onnx"))
    meta = session.get_modelmeta().custom_metadata_map
    assert [i.name for i in session.get_inputs()] == expected_inputs
    assert [o.name for o in session.get_outputs()] == expected_outputs
    env, model = torch_policy(exp_dir, policy, meta["checkpoint"])
    assert meta["policy"] == str(policy) and json.loads(meta["sf_config"])["env"] == meta["env"]
    for i in session.get_inputs():
        if i.name != "rnn_state":  # the env's dtype: uint8 frames stay uint8
            want = {"uint8": "tensor(uint8)", "int8": "tensor(int8)", "float32": "tensor(float)"}[
                str(env.observation_space[i.name].dtype)]
            assert i.type == want and i.shape[0] == "batch"
    recorded, states = [], []
    h = model.rnn_state_size
    torch_state, onnx_state = np.zeros((1, h), np.float32), np.zeros((1, h), np.float32)
    obs, _ = env.reset(seed=3)
    try:
        for _ in range(STEPS):
            batch = {k: np.asarray(v)[None] for k, v in obs.items()}
            want, torch_state_next, action = reference(model, batch, torch_state)
            feeds = dict(batch, **({"rnn_state": onnx_state} if model.is_recurrent else {}))
            got = session.run(None, feeds)
            for name, g, w in zip(expected_outputs, got, want):
                np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL, err_msg=name)
            recorded.append(obs)
            states.append(torch_state)
            torch_state = torch_state_next
            if model.is_recurrent:
                onnx_state = got[-1]
            action = action[0] if action.shape == (1,) and env.action_space.shape == () else action
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                obs, _ = env.reset()
    finally:
        env.close()
    return session, model, recorded, states


@pytest.mark.parametrize("name", list(RUNS))
def test_onnx_matches_torch_on_recorded_episodes(exported, name):
    _, _, inputs, outputs = RUNS[name]
    exp_dir = exported / name
    session, model, recorded, states = play_and_compare(exp_dir, 0, inputs, outputs)
    from sf.model.normalization import RunningMeanStd
    if name == "masked_lstm":  # the graph's value is in return units: denormalized by these (trained) statistics
        assert float(model.returns_normalizer.count) > 0 and float(model.returns_normalizer.mean) != 0.0
    inputs_normalized = [m for m in model.modules()
                         if isinstance(m, RunningMeanStd) and m is not model.returns_normalizer]
    if name != "image_gru":  # vector inputs: the graph holds their trained normalization, not the identity
        assert inputs_normalized and all(float(m.count) > 0 for m in inputs_normalized)
    for batch in (1, 7):  # the batch dimension is dynamic: a batch of different steps, each with its own state
        picks = list(range(0, 7 * 13, 13))[:batch]
        obs = {k: np.stack([recorded[i][k] for i in picks]) for k in recorded[0]}
        rnn = np.concatenate([states[i] for i in picks])
        want, _, _ = reference(model, obs, rnn)
        got = session.run(None, dict(obs, **({"rnn_state": rnn} if model.is_recurrent else {})))
        for o, g, w in zip(outputs, got, want):
            assert g.shape[0] == batch
            np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL, err_msg=f"{o} at batch {batch}")


def test_population_exports_every_policy(exported):
    """Without --policy both policies are written, each its own weights; --policy 1 rewrites only policy 1."""
    exp_dir = exported / "box_population"
    files = sorted(p.name for p in (exp_dir / "export").iterdir())
    assert files == ["policy_p0.onnx", "policy_p1.onnx"]
    _, _, inputs, outputs = RUNS["box_population"]
    play_and_compare(exp_dir, 1, inputs, outputs)
    p0 = (exp_dir / "export" / "policy_p0.onnx").stat().st_mtime_ns
    res = run("-m", "sf.export", exp_dir, "--policy", "1")  # EXP as a directory path
    assert res.returncode == 0, res.stderr
    assert "policy_p1.onnx" in res.stdout and "policy_p0.onnx" not in res.stdout
    assert (exp_dir / "export" / "policy_p0.onnx").stat().st_mtime_ns == p0


def test_example_plays_without_torch(exported, tmp_path):
    """examples/onnx_play.py with `import torch` made to fail: it plays the episode the torch policy plays greedily."""
    import torch
    from sf.enjoy import _act
    path = exported / "image_gru" / "export" / "policy_p0.onnx"
    blocker = ("import runpy, sys; sys.modules['torch'] = None; "  # any import of torch now raises ImportError
               f"sys.argv = ['onnx_play.py', {str(path)!r}, '--seed', '5']; "
               f"runpy.run_path({str(ROOT / 'examples' / 'onnx_play.py')!r}, run_name='__main__'); "
               "assert sys.modules['torch'] is None")
    res = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    meta = onnxruntime.InferenceSession(str(path)).get_modelmeta().custom_metadata_map
    env, model = torch_policy(exported / "image_gru", 0, meta["checkpoint"])
    obs, _ = env.reset(seed=5)
    rnn, total, done = torch.zeros((1, model.rnn_state_size)), 0.0, False
    while not done:
        action, rnn = _act(model, obs, rnn, True, torch.device("cpu"))
        obs, reward, terminated, truncated, _ = env.step(action)
        total, done = total + reward, terminated or truncated
    assert f"Episode: return {total:.3f}," in res.stdout, res.stdout


def snapshot(root):
    return {str(p.relative_to(root)): (p.is_dir(), p.stat().st_size if p.is_file() else 0, p.stat().st_mtime_ns)
            for p in root.rglob("*")}


def copy_experiment(src, dst, edit=None):
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    shutil.copytree(src / "checkpoint_p0", dst / "checkpoint_p0")
    if edit:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(edit)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_bad_input_one_line_exit_2_nothing_written(exported, tmp_path):
    from sf.export import main
    src = exported / "image_gru"
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("not an experiment")
    untrained = tmp_path / "untrained"
    untrained.mkdir()
    shutil.copy(src / "config.json", untrained / "config.json")
    copy_experiment(src, tmp_path / "other_arch", edit={"hidden_size": 48})  # weights of another model shape
    (copy_experiment(src, tmp_path / "blocked") / "export").write_text("a file where the export directory goes")
    cases = {
        (str(tmp_path / "missing"),): "does not exist",
        (str(tmp_path / "foreign"),): "no config.json",
        ("untrained", "--train_dir", str(tmp_path)): "no latest checkpoint",
        (str(tmp_path / "other_arch"),): "checkpoint",
        (str(tmp_path / "blocked"),): "not a directory",
        (str(src), "--policy", "1"): "--policy 1: the experiment has policy 0",
        (str(src), "--format", "tflite"): "--format",
    }
    import io
    from contextlib import redirect_stderr
    for argv, needle in cases.items():
        before, before_src = snapshot(tmp_path), snapshot(src)
        err = io.StringIO()
        with redirect_stderr(err):
            rc = main(list(argv))
        lines = err.getvalue().strip().splitlines()
        assert rc == 2 and len(lines) == 1 and needle in lines[0], (argv, err.getvalue())
        assert snapshot(tmp_path) == before and snapshot(src) == before_src, argv
    res = run("-m", "sf.export", tmp_path / "missing")  # the real entry point: one line, exit code 2
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr


def test_many_unusable_checkpoints_are_one_counted_line(exported, tmp_path):
    """An experiment with many corrupt checkpoint files (best and regular) exports its good one and tells of the rest
    in one line per kind of question that met them, counting them, each file told once; nothing is moved."""
    exp = copy_experiment(exported / "image_gru", tmp_path / "corrupt")
    # a short run on a loaded machine may end before its first episode does, with no best file: then the default
    # question (best) falls back to the latest and meets the regular files too, a second counted line
    has_best = any(p.name.startswith("best_") for p in (exp / "checkpoint_p0").iterdir())
    for i in range(1, 6):
        (exp / "checkpoint_p0" / f"checkpoint_{900 + i:09d}_{10**6 + i}.pth").write_text("garbage")
        (exp / "checkpoint_p0" / f"best_{900 + i:09d}_{10**6 + i}_reward_{1000 + i}.000.pth").write_text("garbage")
    before = sorted(p.name for p in (exp / "checkpoint_p0").iterdir())
    for argv, questions in (([], 1 if has_best else 2), (["--checkpoint", "latest"], 1)):
        res = run("-m", "sf.export", exp, *argv)
        assert res.returncode == 0, res.stderr
        told = [ln for ln in (res.stdout + res.stderr).splitlines() if "valid checkpoint" in ln]
        assert len(told) == questions and all(f"5 files in {exp / 'checkpoint_p0'}" in ln for ln in told), told
    assert sorted(p.name for p in (exp / "checkpoint_p0").iterdir()) == before  # read only: left in place
