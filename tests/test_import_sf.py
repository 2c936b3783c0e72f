"""python -m sf.import_sf: a Sample Factory 2.1.1 experiment becomes one of ours, whose model computes what Sample
Factory's computes.

Sample Factory 2.1.1 itself is the reference: tiny runs of its own examples (doom_basic with its GRU, atari_breakout,
and atari_breakout with separate actor and critic weights) are trained in .venv-sf (made by `make setup-sf`; its python
runs tests/sf_reference.py) and imported. On 80 observations recorded from our env (episode ends included), our model,
loaded as enjoy.py loads it, and Sample Factory's, loaded as its enjoy.py loads it, each carrying its own recurrent
state, give the same action logits, values (Sample Factory's denormalized as its learner does) and recurrent states
within 1e-5. The imported doom_basic agent is then played by enjoy.py, evaluated by sf.eval, exported by sf.export and
trained further from its checkpoint (optimizer state included). Bad input needs no Sample Factory: hand-made
directories.
"""
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from e2e_helpers import ROOT, made_once

pytestmark = pytest.mark.e2e
SF_PYTHON = ROOT / ".venv-sf" / "bin" / "python"
TOL = 1e-5
STEPS = 80  # doom_basic's episodes end by 75 steps (300 frames): an episode end is among them
SF_TINY = ["--num_workers", "1", "--device", "cpu", "--decorrelate_experience_max_seconds", "0", "--rollout", "32"]
SF_RUNS = {  # name: Sample Factory's flags (its example's defaults for the rest)
    # (its best checkpoint saved early: the checkpoints after it store best_performance as a numpy scalar)
    "doom": ["--env", "doom_basic", "--num_envs_per_worker", "4", "--batch_size", "256",
             "--train_for_env_steps", "3000", "--save_best_after", "0"],
    "atari": ["--env", "atari_breakout", "--num_envs_per_worker", "2", "--batch_size", "64",
              "--train_for_env_steps", "2000"],
    "atari_separate": ["--env", "atari_breakout", "--num_envs_per_worker", "2", "--batch_size", "64",
                       "--train_for_env_steps", "1000", "--actor_critic_share_weights", "False",
                       "--encoder_conv_architecture", "convnet_impala"],
}


def sample_factory(*args, cwd, timeout=240):
    """tests/sf_reference.py in .venv-sf. Sample Factory's runner waits forever on a learner that died: the run is
    ended (its whole process group) as soon as its log shows a traceback, or at `timeout`."""
    log = Path(cwd) / f"sf_{os.getpid()}_{len(list(Path(cwd).glob('sf_*.log')))}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(SF_PYTHON), str(ROOT / "tests" / "sf_reference.py"), *map(str, args)], cwd=cwd,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            deadline = time.time() + timeout
            while proc.poll() is None and time.time() < deadline and "Traceback" not in log.read_text():
                time.sleep(0.2)
        finally:
            try:  # a run that hangs, or what a finished one left behind in its group
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return proc.returncode, log.read_text()


def module(name, *args, timeout=120):
    """`python -m name args...` from the repository root."""
    return subprocess.run([sys.executable, "-m", name, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))


@pytest.fixture(scope="module")
def sf_runs(tmp_path_factory):
    """Sample Factory's experiments, trained by Sample Factory 2.1.1."""
    if not SF_PYTHON.exists():
        pytest.skip(f"{SF_PYTHON} is absent: Sample Factory 2.1.1, the reference of these tests, lives there "
                    "(make setup-sf, which make test runs, creates it: python3 -m venv .venv-sf; pip install "
                    "torch==2.13.0, then sample-factory==2.1.1 'numpy<2' 'gymnasium<1.0' vizdoom ale-py)")

    def make(td):
        for name, flags in SF_RUNS.items():
            rc, log = sample_factory("train", "--experiment", name, "--train_dir", td, *SF_TINY, *flags, cwd=td)
            assert rc == 0 and list((td / name / "checkpoint_p0").glob("checkpoint_*.pth")), log[-4000:]
    return made_once(tmp_path_factory, "sf_runs", make)


@pytest.fixture(scope="module")
def imported(sf_runs, tmp_path_factory):
    """Each Sample Factory experiment imported (the doom one by the entry point's own process, the others in this
    process); returns our train dir."""
    from sf.import_sf import main
    td = tmp_path_factory.mktemp("imported")
    res = module("sf.import_sf", sf_runs / "doom", "--experiment", "doom", "--train_dir", td)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "policy 0:" in res.stdout and "optimizer state mapped" in res.stdout, res.stdout
    for name in SF_RUNS:
        if name != "doom":
            assert main([str(sf_runs / name), "--experiment", name, "--train_dir", str(td)]) == 0
    return td


def our_policy(exp_dir):
    """The env and our model of the imported experiment, loaded as enjoy.py loads it; the checkpoint's state."""
    import torch
    from sf.policy_loading import load_policy, open_env
    from sf.export import experiment_cfg
    cfg = experiment_cfg(exp_dir, "test")
    env = open_env(cfg)
    model, state = load_policy(cfg, env.observation_space, env.action_space, torch.device("cpu"))
    return env, model, state


def sf_checkpoint(sf_dir):
    """Its newest checkpoint, as the importer reads it."""
    from sf.import_sf import load_sf_checkpoint
    return load_sf_checkpoint(sorted((sf_dir / "checkpoint_p0").glob("checkpoint_*.pth"))[-1])


@pytest.mark.parametrize("name", list(SF_RUNS))
def test_imported_model_computes_what_sample_factorys_computes(sf_runs, imported, tmp_path, name):
    import torch
    env, model, state = our_policy(imported / name)
    theirs = sf_checkpoint(sf_runs / name)
    assert (state["policy_version"], state["env_steps"]) == (theirs["train_step"], theirs["env_steps"])
    norm = model.encoder.obs_normalizer  # SF normalizes the image per pixel: its statistics, now ours
    sf_norm = "obs_normalizer.running_mean_std.running_mean_std.obs."
    assert float(norm.count) == float(theirs["model"][sf_norm + "count"]) > 1
    np.testing.assert_allclose(norm.mean.numpy(), theirs["model"][sf_norm + "running_mean"].numpy(), rtol=1e-6)
    assert float(model.returns_normalizer.count) == float(theirs["model"]["returns_normalizer.count"])
    if name == "atari_separate":
        assert model.critic_encoder is not None
    if name == "doom":  # a numpy scalar (pickled by numpy 1), read without running pickled code
        assert isinstance(theirs["best_performance"], np.floating), type(theirs["best_performance"])

    recorded, resets, ours = {}, [], []
    rnn = torch.zeros((1, model.rnn_state_size))
    obs, _ = env.reset(seed=2)
    reset = True
    try:
        with torch.no_grad():
            for _ in range(STEPS):
                if reset:
                    rnn = torch.zeros_like(rnn)
                resets.append(reset)
                for k, v in obs.items():
                    recorded.setdefault(k, []).append(np.asarray(v))
                out = model.forward_step({k: torch.as_tensor(np.asarray(v))[None] for k, v in obs.items()}, rnn)
                rnn = out.new_rnn_states
                ours.append((out.action_logits[0].numpy(), float(out.values[0]), rnn[0].numpy()))
                action = model.action_distribution(out.action_logits).sample()[0].item()
                obs, _, terminated, truncated, _ = env.step(action)
                reset = terminated or truncated
                if reset:
                    obs, _ = env.reset()
    finally:
        env.close()
    assert sum(resets) >= 2 or name != "doom"  # the state reset at an episode end is compared too
    np.savez(tmp_path / "in.npz", resets=np.array(resets), **{f"obs:{k}": np.stack(v) for k, v in recorded.items()})
    rc, log = sample_factory("forward", sf_runs / name, tmp_path / "in.npz", tmp_path / "out.npz", cwd=tmp_path,
                             timeout=120)
    assert rc == 0, log[-4000:]
    got = np.load(tmp_path / "out.npz")
    np.testing.assert_allclose(np.stack([o[0] for o in ours]), got["action_logits"], rtol=TOL, atol=TOL)
    np.testing.assert_allclose(np.array([o[1] for o in ours]), got["values"], rtol=TOL, atol=TOL)
    if model.is_recurrent:
        np.testing.assert_allclose(np.stack([o[2] for o in ours]), got["new_rnn_states"], rtol=TOL, atol=TOL)
    assert np.abs(got["action_logits"]).max() > 0.01  # trained weights, not a zero head


def test_imported_optimizer_state_is_sample_factorys(sf_runs, imported):
    """Resuming takes Sample Factory's Adam moments: each of our parameters has those of the one it came from."""
    import torch
    ours = torch.load(sorted((imported / "doom" / "checkpoint_p0").glob("*.pth"))[0], weights_only=True)
    theirs = sf_checkpoint(sf_runs / "doom")
    sf_params = [k for k in theirs["model"] if not k.startswith(("obs_normalizer.", "returns_normalizer."))]
    our_params = [k for k in ours["model"] if "normalizer." not in k]
    assert len(sf_params) == len(our_params) == len(ours["optimizer"]["state"]) == 16
    # the counterparts: the conv encoder's layers in order, then by name
    counterpart = dict(zip(our_params[:8], sf_params[:8]))
    counterpart.update({f"core.rnn.{n}": f"core.core.{n}" for n in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0",
                                                                     "bias_hh_l0")})
    counterpart.update({f"critic.{n}": f"critic_linear.{n}" for n in ("weight", "bias")})
    counterpart.update({f"action_heads.0.{n}": f"action_parameterization.distribution_linear.{n}"
                        for n in ("weight", "bias")})
    for i, mine in enumerate(our_params):  # optimizer state: parameters by index, in model order on each side
        j = sf_params.index(counterpart[mine])
        assert torch.equal(ours["model"][mine], theirs["model"][sf_params[j]]), mine
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(ours["optimizer"]["state"][i][k], theirs["optimizer"]["state"][j][k]), (mine, k)
    assert ours["optimizer_kind"] == "adam" and ours["imported_from"].endswith(".pth")


def test_imported_doom_agent_plays_trains_evaluates_exports(imported, entry, tmp_path):
    td = tmp_path / "td"  # (a copy: training on rotates the module's checkpoints, which the other tests read)
    shutil.copytree(imported / "doom", td / "doom")
    res = entry("enjoy.py", "--env", "doom_basic", "--experiment", "doom", "--train_dir", td, "--no_render",
                "--max_num_episodes", "1", timeout=120)
    assert res.returncode == 0 and "Episode 1: reward" in res.stdout, res.stdout + res.stderr

    frames = json.loads((td / "doom" / "config.json").read_text())["train_for_env_steps"]
    start = sorted((td / "doom" / "checkpoint_p0").glob("*.pth"))[-1].name
    version, steps = int(start.split("_")[1]), int(start.split("_")[2].split(".")[0])
    res = entry("train.py", "--env", "doom_basic", "--experiment", "doom", "--train_dir", td,
                "--train_for_env_steps", steps + 400, timeout=180)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert f"Resumed from checkpoint: policy version {version}, {steps} env frames" in out, out[-4000:]
    assert "not loaded" not in out and frames <= steps  # Sample Factory's optimizer state, loaded
    latest = sorted((td / "doom" / "checkpoint_p0").glob("checkpoint_*.pth"))[-1].name
    assert int(latest.split("_")[1]) > version and int(latest.split("_")[2].split(".")[0]) >= steps + 400

    res = module("sf.eval", td / "doom", "--episodes", "2", "--csv", tmp_path / "eval.csv")
    assert res.returncode == 0 and "Policy 0: 2 episodes" in res.stdout, res.stdout + res.stderr
    res = module("sf.export", td / "doom")
    assert res.returncode == 0 and (td / "doom" / "export" / "policy_p0.onnx").is_file(), res.stdout + res.stderr


# --- bad input --------------------------------------------------------------------------------------------------------
def fake_sf_experiment(root, name, config, model=None, checkpoint=True):
    """A directory laid out as Sample Factory's: config.json and, with `checkpoint`, checkpoint_p0/ with one file
    holding `model` (a state dict) in Sample Factory's checkpoint keys."""
    import torch
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    if checkpoint:
        (d / "checkpoint_p0").mkdir()
        torch.save({"train_step": 3, "env_steps": 96, "model": model or {"critic_linear.weight": torch.zeros(1, 8)},
                    "optimizer": None}, d / "checkpoint_p0" / "checkpoint_000000003_96.pth")
    return d


def snapshot(root):
    return {str(p.relative_to(root)): (p.is_dir(), p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path):
    import torch
    from sf.import_sf import main
    src = tmp_path / "src"
    src.mkdir()
    good = {"env": "test_image", "use_rnn": True, "rnn_size": 16}
    fake_sf_experiment(src, "foreign", good)  # a state dict of some other model
    ours = {"model": {"x": torch.zeros(1)}, "policy_version": 3, "env_steps": 96, "meta": {}}  # our own format
    d = fake_sf_experiment(src, "ours", good, checkpoint=False)
    (d / "checkpoint_p0").mkdir()
    torch.save(ours, d / "checkpoint_p0" / "checkpoint_000000003_96.pth")
    fake_sf_experiment(src, "refused", dict(good, decoder_mlp_layers=[64]))
    fake_sf_experiment(src, "unknown_key", dict(good, my_env_level=3))
    fake_sf_experiment(src, "no_checkpoint", good, checkpoint=False)
    d = fake_sf_experiment(src, "not_torch", good, checkpoint=False)
    (d / "checkpoint_p0").mkdir()
    (d / "checkpoint_p0" / "checkpoint_000000003_96.pth").write_text("a log, say")
    (src / "no_config").mkdir()
    (tmp_path / "out" / "taken").mkdir(parents=True)
    out = ["--train_dir", str(tmp_path / "out")]
    cases = {
        (str(src / "missing"), "--experiment", "x", *out): "does not exist",
        (str(src / "no_config"), "--experiment", "x", *out): "no config.json",
        (str(src / "refused"), "--experiment", "x", *out): "--decoder_mlp_layers 64",
        (str(src / "unknown_key"), "--experiment", "x", *out): "'my_env_level': not a flag of Sample Factory 2.1.1",
        (str(src / "no_checkpoint"), "--experiment", "x", *out): "no Sample Factory checkpoint",
        (str(src / "foreign"), "--experiment", "x", *out): "checkpoint of another architecture",
        (str(src / "ours"), "--experiment", "x", *out): "is not a Sample Factory checkpoint",
        (str(src / "not_torch"), "--experiment", "x", *out): "not a file that torch.save wrote",
        (str(src / "foreign"), "--experiment", "taken", *out): "exists",
        (str(src / "foreign"), "--experiment", "../up", *out): "--experiment",
        (str(src / "foreign"),): "--experiment",
    }
    for argv, needle in cases.items():
        before = snapshot(tmp_path)
        err = io.StringIO()
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            rc = main(list(argv))
        lines = err.getvalue().strip().splitlines()
        assert rc == 2 and len(lines) == 1 and needle in lines[0], (argv, err.getvalue())
        assert snapshot(tmp_path) == before, argv
    res = module("sf.import_sf", src / "refused", "--experiment", "x", *out)  # the real entry point
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert "config.json" in res.stderr


def test_population_imports_every_policy(tmp_path):
    """Several checkpoint_pN: each policy's newest checkpoint becomes ours (Sample Factory's names sort by version)."""
    import torch
    from sf.cfg import parse_cfg
    from sf.policy_loading import open_env
    from sf.import_sf import main
    from sf.model.actor_critic import create_actor_critic
    sf_cfg = {"env": "test_image", "use_rnn": False, "num_policies": 2, "normalize_input": False,
              "normalize_returns": False, "encoder_conv_mlp_layers": [16]}
    cfg = parse_cfg(["--env", "test_image", "--use_rnn", "False", "--normalize_input", "False",
                     "--encoder_conv_mlp_layers", "16", "--train_dir", str(tmp_path / "none")])
    env = open_env(cfg)
    model = create_actor_critic(cfg, env.observation_space, env.action_space)
    env.close()
    convs, heads = [t for k, t in model.state_dict().items() if k.startswith("encoder.")], model.action_heads
    sf_model = {f"encoder.encoders.obs.enc.conv_head.{2 * (i // 2)}.{'weight' if i % 2 == 0 else 'bias'}": t
                for i, t in enumerate(convs[:-2])}
    sf_model.update({"encoder.encoders.obs.enc.mlp_layers.0.weight": convs[-2],
                     "encoder.encoders.obs.enc.mlp_layers.0.bias": convs[-1],
                     "critic_linear.weight": model.critic.weight.detach() + 1, "critic_linear.bias": model.critic.bias,
                     "action_parameterization.distribution_linear.weight": torch.cat([h.weight for h in heads]),
                     "action_parameterization.distribution_linear.bias": torch.cat([h.bias for h in heads])})
    d = fake_sf_experiment(tmp_path, "pop", sf_cfg, model={k: v.detach().clone() for k, v in sf_model.items()})
    (d / "checkpoint_p1").mkdir()
    for version in (9, 10):  # 10 is the newest: its name sorts last
        sf_model["critic_linear.bias"] = torch.full((1,), float(version))
        torch.save({"train_step": version, "env_steps": 320 * version, "model": sf_model, "optimizer": None,
                    "best_performance": np.float64(version)},  # a numpy scalar (pickled by numpy 2 here)
                   d / "checkpoint_p1" / f"checkpoint_{version:09d}_{320 * version}.pth")
    with redirect_stdout(io.StringIO()) as out:
        assert main([str(d), "--experiment", "pop", "--train_dir", str(tmp_path / "out")]) == 0
    assert "optimizer state not mapped (the checkpoint has none)" in out.getvalue()  # a fresh one, said so
    exp = tmp_path / "out" / "pop"
    p0 = torch.load(exp / "checkpoint_p0" / "checkpoint_000000003_96.pth", weights_only=True)
    p1 = torch.load(exp / "checkpoint_p1" / "checkpoint_000000010_3200.pth", weights_only=True)
    assert float(p1["model"]["critic.bias"]) == 10.0 and p0["optimizer"] is None
    assert torch.equal(p0["model"]["critic.weight"], model.critic.weight.detach() + 1)
    for name in model.state_dict():  # the heads took the head's rows in order
        if name.startswith("action_heads."):
            assert torch.equal(p0["model"][name], model.state_dict()[name])
    assert json.loads((exp / "config.json").read_text())["num_policies"] == 2
