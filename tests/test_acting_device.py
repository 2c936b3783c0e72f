"""The acting tools (enjoy, sf.eval, sf.export, sf.card) run a CUDA experiment on a machine without CUDA (issue 39).

One tiny experiment is trained on the CPU, then made into what a CUDA run leaves: config.json says "device": "cuda" and
every checkpoint's tensors are tagged as CUDA tensors (re-saved with torch's location tag "cuda:0", so that torch.load
without map_location fails where there is no CUDA). The tools then choose the device of the machine they run on (the
flag given, else auto); the subprocesses see no CUDA (CUDA_VISIBLE_DEVICES=""), the in-process runs a patched
torch.cuda.is_available. An explicit --device cuda there is still one line, exit 2. Training's resume keeps the run's
device."""
import json
import os
import subprocess
import sys

import pytest

from e2e_helpers import ROOT, made_once

pytestmark = pytest.mark.e2e
TINY = ["--num_workers", "1", "--num_envs_per_worker", "2", "--rollout", "8", "--recurrence", "8", "--batch_size", "16",
        "--rnn_size", "16", "--hidden_size", "16", "--encoder_mlp_layers", "16", "--device", "cpu", "--seed", "1",
        "--train_for_env_steps", "200"]
NO_CUDA = {"CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}


def _run(*args, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=dict(os.environ, **NO_CUDA))


def _resave_as_cuda(path) -> None:
    """Rewrite the checkpoint `path` with the same content, its tensors tagged as a CUDA run's (torch.save's
    location tag), keeping its name (the name is its content's)."""
    import torch
    import torch.serialization as ser
    state = torch.load(path, map_location="cpu", weights_only=True)
    tag = ser.location_tag
    ser.location_tag = lambda storage: "cuda:0"
    try:
        torch.save(state, path)
    finally:
        ser.location_tag = tag


@pytest.fixture(scope="module")
def exp_dir(tmp_path_factory):
    """train_dir/cu: trained on the CPU, then with a CUDA run's config.json and checkpoints."""
    def make(train_dir):
        res = _run("train.py", "--env", "test_image", "--experiment", "cu", "--train_dir", train_dir, *TINY,
                   timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        exp = train_dir / "cu"
        config = json.loads((exp / "config.json").read_text())
        (exp / "config.json").write_text(json.dumps(dict(config, device="cuda"), indent=2))
        assert list(exp.glob("checkpoint_p0/*.pth"))
        for path in sorted(exp.glob("checkpoint_p0/*.pth")):
            _resave_as_cuda(path)
    exp = made_once(tmp_path_factory, "acting_device", make) / "cu"
    checkpoints = sorted(exp.glob("checkpoint_p0/*.pth"))
    import torch
    if not torch.cuda.is_available():  # the files are a CUDA run's: without map_location they do not load here
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(checkpoints[0], weights_only=True)
    return exp


def _no_cuda(monkeypatch) -> list:
    """This process sees no CUDA; returns the list of the map_location of every torch.load that follows."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    seen, load = [], torch.load

    def recording_load(f, *args, **kwargs):
        seen.append(kwargs.get("map_location", args[0] if args else None))
        return load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    return seen


def _on_cpu(map_location) -> bool:
    import torch
    return map_location is not None and torch.device(map_location).type == "cpu"


def test_enjoy_plays_on_this_machine(exp_dir):
    res = _run("enjoy.py", "--env", "test_image", "--experiment", "cu", "--train_dir", exp_dir.parent, "--no_render",
               "--max_num_episodes", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 episodes: reward mean" in res.stdout and ", on cpu" in res.stdout, res.stdout


def test_eval_runs_on_this_machine(exp_dir, tmp_path):
    res = _run("-m", "sf.eval", exp_dir, "--episodes", "2", "--csv", tmp_path / "e.csv")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "policy workers on cpu" in res.stdout and (tmp_path / "e.csv").is_file(), res.stdout


def test_every_checkpoint_load_maps_to_the_cpu(exp_dir, monkeypatch, capsys):
    """enjoy, export and card in this process: each torch.load names a CPU map_location (a CUDA run's tensors
    would otherwise be restored onto a GPU this machine lacks)."""
    from sf.card import main as card
    from sf.enjoy import main as enjoy
    from sf.export import main as export
    seen = _no_cuda(monkeypatch)
    assert enjoy(["--env", "test_image", "--experiment", "cu", "--train_dir", str(exp_dir.parent), "--no_render",
                  "--max_num_episodes", "1"]) == 0
    assert ", on cpu" in capsys.readouterr().out
    assert export([str(exp_dir)]) == 0 and (exp_dir / "export" / "policy_p0.onnx").is_file()
    assert card([str(exp_dir)]) == 0 and (exp_dir / "README.md").is_file()
    assert seen and all(_on_cpu(m) for m in seen), seen


@pytest.mark.parametrize("tool", ["enjoy", "eval"])
def test_explicit_device_cuda_is_refused_in_one_line(exp_dir, monkeypatch, capsys, tool):
    _no_cuda(monkeypatch)
    if tool == "enjoy":
        from sf.enjoy import main
        code = main(["--env", "test_image", "--experiment", "cu", "--train_dir", str(exp_dir.parent), "--no_render",
                     "--device", "cuda"], prog="enjoy.py")
    else:
        from sf.eval import main
        code = main([str(exp_dir), "--episodes", "1", "--device", "cuda"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "--device cuda: no CUDA device is available here" in err, err


def test_training_resume_keeps_the_runs_device(exp_dir, monkeypatch):
    """The saved device is the run's for training's resume, not for the acting tools (enjoy mode)."""
    import torch

    from sf.cfg import parse_cfg
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a resume on the machine that trained
    base = ["--env", "test_image", "--experiment", "cu", "--train_dir", str(exp_dir.parent)]
    assert parse_cfg(base + ["--restart_behavior", "resume"], mode="train").device == "cuda"
    assert parse_cfg(base, mode="enjoy").device == "auto"
    assert parse_cfg(base + ["--device", "cpu"], mode="enjoy").device == "cpu"
