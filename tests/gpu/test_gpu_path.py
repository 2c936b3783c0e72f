"""The CUDA branches of a whole run (issue 39), each end to end on doom_basic (2 rollout workers x 4 envs, the tiny
model of e2e_helpers.SMALL, a few thousand env frames): a run resumed CUDA -> CPU -> CUDA, a population of 8 with PBT, a
policy worker SIGKILLed and replaced, enjoy / sf.eval / sf.export of a CUDA checkpoint, `--num_workers auto` measuring
on CUDA, and a worker forked by the fork server training on CUDA (the proof that nothing the fork server imported or
warmed up initialized CUDA: a child of a process that did cannot use it).

The tests marked any_device take the fixture `device` (tests/gpu/conftest.py): cuda, or cpu under
SF_GPU_TESTS_DEVICE=cpu, which keeps them running, and so from rotting, on machines without a GPU."""
import json
import math
import multiprocessing.forkserver
import os
import re
import shutil
import subprocess
import sys

import pytest

from e2e_helpers import ROOT, start_train, train_args, wait_for
from test_self_healing import _kill_and_wait_for_progress, _progress, _stop  # tests/runner/test_self_healing.py

pytestmark = pytest.mark.e2e

FINAL = re.compile(r"Final weights sha256: [0-9a-f]{64} \(policy version (\d+), (\d+) env frames\)")
RESUMED = re.compile(r"Resumed from checkpoint: policy version (\d+), (\d+) env frames")


def doom_args(train_dir, device, *extra) -> list:
    """train.py's flags: doom_basic as experiment `e2e` in train_dir, 2 rollout workers x 4 envs, the tiny model, on
    `device` (the last --device wins over SMALL's cpu)."""
    return [*train_args(train_dir, "doom_basic", "--num_workers", "2", *extra), "--device", device]


def ran_on(device: str, out: str) -> bool:
    return re.search(rf"Experiment .*: env \w+, device {device}\b", out) is not None


def final(out: str) -> tuple[int, int]:
    """(policy version, env frames) of the run's final weights."""
    (found,) = FINAL.findall(out)
    return int(found[0]), int(found[1])


@pytest.fixture(scope="session")
def trained(tmp_path_factory, entry, device):
    """doom_basic trained on `device` for 4000 env frames: (the experiment directory, the run's output), made once for
    the whole test run (pytest-xdist's processes share it: the first makes it under a file lock, in the directory
    their temporary directories share). It must have trained (sf.utils.trained: a policy version > 0, not every step
    skipped, the weights changed, finite losses). Tests that train it further work on a copy: the enjoy/eval/export
    tests get the checkpoint `device` wrote."""
    pytest.importorskip("vizdoom")
    from filelock import FileLock  # (torch's own dependency)

    from sf.utils.trained import check_trained
    shared = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else \
        tmp_path_factory.getbasetemp()
    train_dir, log = shared / f"trained_{device}", shared / f"trained_{device}.txt"
    with FileLock(str(shared / f"trained_{device}.lock")):
        if not log.is_file():
            res = entry("train.py", *doom_args(train_dir, device, "--train_for_env_steps", "4000"), timeout=300)
            out = res.stdout + res.stderr
            assert res.returncode == 0, out[-3000:]
            log.write_text(out)
    out = log.read_text()
    assert ran_on(device, out), out[-3000:]
    ok, why = check_trained(out, train_dir / "e2e")
    assert ok, f"the run did not train: {why}"
    return train_dir / "e2e", out


# --- 1. resume across devices ---------------------------------------------------------------------------------------

@pytest.mark.any_device
@pytest.mark.doom
def test_resume_moves_across_devices(trained, entry, device, tmp_path):
    """The run trained on `device` resumed with --device cpu, then with --device `device`: each resumes from exactly
    the previous run's final checkpoint (its version and frames), on the device asked for, and trains further. On CUDA
    a checkpoint saved there (weights, Adam's moments, the random streams' states) must load on the CPU, and the CPU's
    back on CUDA (the minibatch generator's state of one device did not fit the other's: "Expected a
    CPUGeneratorImplState of size 5056")."""
    exp, out = trained
    shutil.copytree(exp, tmp_path / "e2e")
    before = final(out)
    for budget, dev in ((8000, "cpu"), (12000, device)):
        res = entry("train.py", "--env", "doom_basic", "--experiment", "e2e", "--train_dir", tmp_path, "--device", dev,
                    "--train_for_env_steps", budget, timeout=300)
        out = res.stdout + res.stderr
        assert res.returncode == 0, f"resumed with --device {dev}:\n{out[-3000:]}"
        assert ran_on(dev, out), out[-3000:]
        assert [tuple(map(int, r)) for r in RESUMED.findall(out)] == [before], out[-3000:]
        after = final(out)
        assert after[0] > before[0] and after[1] >= budget, (dev, before, after)
        before = after


# --- 2. a population of 8 with PBT ------------------------------------------------------------------------------------

@pytest.mark.any_device
@pytest.mark.doom
def test_eight_policies_with_pbt(entry, device, tmp_path):
    """8 policies, each with its learner and policy worker on `device`, one env each (--policy_mapping fixed: all get
    episodes, and so objectives, at once), a PBT decision at 1024 frames of each, the worst half copying: every policy
    trains and writes its checkpoint, and the weight copies PBT orders (a learner loading another policy's weights from
    the shared weights: on CUDA, CUDA memory of another process) are each confirmed by the copying learner."""
    pytest.importorskip("vizdoom")
    res = entry("train.py", *doom_args(tmp_path, device, "--num_policies", "8", "--policy_mapping", "fixed",
                                       "--with_pbt", "True", "--pbt_period_env_steps", "1000",
                                       "--pbt_start_mutation", "1000", "--pbt_replace_fraction", "0.5",
                                       "--pbt_replace_reward_gap", "0.0", "--train_for_env_steps", "1500",
                                       "--seed", "11"), timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert ran_on(device, out) and "Population: 8 policies (population-based training)" in out, out[-3000:]
    exp = tmp_path / "e2e"
    finals = re.findall(r"Final weights sha256: [0-9a-f]{64} \(policy (\d), version \d+, (\d+) env frames\)", out)
    assert sorted(int(p) for p, _ in finals) == list(range(8)) and all(int(f) >= 1500 for _, f in finals), finals
    for p in range(8):
        assert list((exp / f"checkpoint_p{p}").glob("checkpoint_*.pth")), f"policy {p}: no checkpoint"
    assert json.loads((exp / "pbt_state.json").read_text())["history"]
    # 8 decisions at 1024 frames, each policy of the worst half copying: a copy is all but certain
    copies = re.findall(r"PBT: policy (\d) .* copies weights and hyperparameters of policy (\d)", out)
    assert copies, out[-3000:]
    for target, source in copies:
        assert re.search(rf"PBT: policy {target} now plays with the weights of policy {source} \(its version \d+\)",
                         out), out[-3000:]
    assert "could not copy" not in out


# --- 3. a policy worker SIGKILLed and replaced ------------------------------------------------------------------------

@pytest.mark.any_device
@pytest.mark.doom
def test_policy_worker_killed_is_replaced(device, tmp_path):
    """SIGKILL to the policy worker on `device`: its replacement (a new CUDA context, the learner's shared weights
    mapped again) serves actions, frames and versions grow again, and the run stops cleanly with every slot found."""
    pytest.importorskip("vizdoom")
    log = tmp_path / "log.txt"
    p = start_train(doom_args(tmp_path, device, "--train_for_seconds", "600"), log)
    try:
        wait_for(lambda: _progress(log)[1] > 0, 150, "training to start", log)
        _kill_and_wait_for_progress(log, "policy_worker_0")
        text = _stop(p, log)
    finally:
        p.kill()
    assert ran_on(device, text), text[-3000:]
    assert re.search(r"Restarted policy_worker_0 \(pid \d+\) after it was killed by SIGKILL: restart 1 of", text)
    assert "Faults: 1 restarts (rollout workers 0, policy workers 1, learners 0)" in text, text[-3000:]
    assert "every slot accounted for exactly once" in text, text[-3000:]


# --- 4. enjoy, sf.eval and sf.export of the checkpoint trained on `device` -----------------------------------------

def run_module(module: str, *args, env=None, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))


@pytest.mark.any_device
@pytest.mark.doom
def test_enjoy_plays_the_checkpoint(trained, device):
    """enjoy.py without --device plays the checkpoint on this machine's device; on CUDA also with the GPU hidden
    (CUDA_VISIBLE_DEVICES=""): the CUDA checkpoint plays on a machine without one."""
    exp, _ = trained
    for hidden in ([False, True] if device == "cuda" else [False]):
        res = run_module("sf.enjoy", "--env", "doom_basic", "--experiment", exp.name, "--train_dir", exp.parent,
                         "--no_render", "--max_num_episodes", "2", env={"CUDA_VISIBLE_DEVICES": ""} if hidden else None)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-3000:]
        assert re.search(rf"Loaded latest checkpoint: .* on {'cpu' if hidden else device}", out), out[-3000:]
        assert "Episode 2: reward" in res.stdout and "2 episodes: reward mean" in res.stdout, out[-3000:]


@pytest.mark.any_device
@pytest.mark.doom
def test_eval_evaluates_the_checkpoint(trained, device, tmp_path):
    """sf.eval without --device: its policy worker on this machine's device, 8 episodes, the table and the CSV."""
    exp, _ = trained
    csv = tmp_path / "eval.csv"
    res = run_module("sf.eval", exp, "--episodes", "8", "--seed", "5", "--csv", csv)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert f"policy workers on {device}" in res.stdout, out[-3000:]
    assert re.search(r"Policy 0: 8 episodes, return mean [-\d.e]+, std", res.stdout), out[-3000:]
    assert f"CSV: {csv}" in res.stdout and len(csv.read_text().splitlines()) == 1 + 8


@pytest.mark.any_device
@pytest.mark.doom
def test_export_writes_the_onnx_file(trained):
    """sf.export of the checkpoint trained on `device`: the ONNX file, checked against the torch model before it is
    written (sf/export.py), and loadable by onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    exp, _ = trained
    res = run_module("sf.export", exp)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    onnx_file = exp / "export" / "policy_p0.onnx"
    assert f"Wrote {onnx_file}" in res.stdout, res.stdout
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    assert "obs" in [i.name for i in session.get_inputs()]


# --- 5. --num_workers auto ------------------------------------------------------------------------------------------

# train.py with its quick measurement shortened from 40 s: the path (train.py's measuring child, the model on the
# device, the layout cached and applied) is what is tested here, not the measurement's quality
AUTO_TRAIN = ("import sys; import sf.autolayout.measure; sf.autolayout.measure.QUICK_SECONDS = 8.0; "
              "from sf.train import main; sys.exit(main(prog='train.py'))")


@pytest.mark.any_device
def test_num_workers_auto_measures_on_the_device(device, tmp_path):
    """`--num_workers auto` with no cached layout (the cache in tmp_path: $XDG_CACHE_HOME): train.py's measuring child
    runs the forward and the learner on `device` (on CUDA it can use the GPU whatever train.py initialized before it:
    a child forked from a process that had initialized CUDA could not), caches the layout (its "device" says where it
    measured), and the run applies the layout and trains."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", XDG_CACHE_HOME=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, "-c", AUTO_TRAIN, "--env", "test_image", "--experiment", "auto",
                          "--train_dir", str(tmp_path), "--num_workers", "auto", "--device", device,
                          "--train_for_env_steps", "2000"], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    (cache,) = (tmp_path / "cache" / "sf" / "autolayout").glob("test_image-*.json")
    choice = json.loads(cache.read_text())
    assert choice["device"] == device  # measured there
    assert re.search(rf"--num_workers auto: num_workers {choice['choice']['num_workers']}, num_envs_per_worker "
                     rf"{choice['choice']['num_envs_per_worker']}, .*\(a layout measured now in \d+ s, {cache}",
                     out), out[-3000:]
    assert re.search(rf"device {device}, {choice['choice']['num_workers']} rollout workers x "
                     rf"{choice['choice']['num_envs_per_worker']} envs", out), out[-3000:]
    assert final(out)[1] >= 2000


# --- 6. a worker forked by the fork server trains on CUDA -----------------------------------------------------------

def _train_step(device, cfg, obs_space, action_space, send) -> None:
    """In a process forked by the fork server: the doom model on `device`, a forward, a backward and an Adam step; sends
    (the loss, the parameters' device, whether the fork server had imported sf.runner.startup.fork_server, the parent's
    pid, the fork server's driver checks, inherited: taken before this process touched CUDA), or the traceback (and
    exits 1)."""
    import traceback

    import torch

    from model_test_helpers import make_obs
    from sf.model.actor_critic import create_actor_critic
    from sf.processes.control import driver_checks
    checks = driver_checks()
    try:
        model = create_actor_critic(cfg, obs_space, action_space).to(device)
        optimizer = torch.optim.Adam(model.parameters())
        obs = {k: v.to(device) for k, v in make_obs(obs_space, (16,)).items()}
        out = model.forward_step(obs, torch.zeros((16, model.rnn_state_size), device=device))
        loss = out.values.square().mean() + out.action_logits.square().mean()
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()  # an asynchronous CUDA error surfaces here, before the reply
    except BaseException:  # the test's failure message: the GPU machine is lent rarely, its stderr is not kept
        send.send(traceback.format_exc())
        raise
    send.send((float(loss.detach()), str(next(model.parameters()).device),
               "sf.runner.startup.fork_server" in sys.modules,
               os.getppid(), checks))


@pytest.mark.doom
def test_a_worker_forked_by_the_fork_server_trains_on_cuda(tmp_path):
    """The fork server started as the runner starts it (supervision.worker_context: torch, the worker modules, the
    env's modules preloaded, the warm-up run) forks a process that builds the doom model on CUDA and takes an Adam
    step: exit code 0 and a finite loss. A worker forked from a process that initialized CUDA cannot use it ("Cannot
    re-initialize CUDA in forked subprocess"): nothing the fork server ran, Python or C++, did, and the driver itself
    said so to the fork server after its warm-up and after the env modules (sf.processes.control.check_cuda_driver:
    cuDeviceGetCount answered CUDA_ERROR_NOT_INITIALIZED; None would be no driver found)."""
    pytest.importorskip("vizdoom")
    from sf.cfg import parse_cfg
    from sf.runner.startup.preflight import probe_env
    from sf.runner.startup.supervision import worker_context
    cfg = parse_cfg(["--env", "doom_basic", "--train_dir", str(tmp_path), "--device", "cuda"])
    obs_space, action_space, _, env_modules, _ = probe_env(cfg)  # as the runner: the modules making an env imported
    server = multiprocessing.forkserver._forkserver
    server._stop()  # one this process may have started earlier would not have the preload
    ctx = worker_context(env_modules)
    try:
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_train_step, args=("cuda", cfg, obs_space, action_space, send))
        child.start()
        send.close()
        try:
            reply = receive.recv() if receive.poll(120) else None
        except EOFError:  # it died without a word
            reply = None
        child.join(60)
        if child.is_alive():
            child.kill()
        assert child.exitcode == 0 and isinstance(reply, tuple), f"exit code {child.exitcode}: {reply}"
        loss, param_device, preloaded, parent, checks = reply
        assert math.isfinite(loss) and param_device == "cuda:0"
        assert preloaded and parent == server._forkserver_pid  # forked by the warmed-up fork server
        assert [initialized for _, initialized in checks] == [False, False], checks  # the driver: clean, twice
        assert "vizdoom" in checks[1][0], checks  # (the second check came after the env modules)
    finally:
        server._stop()
