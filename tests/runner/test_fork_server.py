"""The fork server every worker is forked from must never initialize CUDA: a worker forked from a process that did
cannot use it (on an H100: "Cannot re-initialize CUDA in forked subprocess", then "CUDA error: initialization error"
at the first CUDA tensor a learner or policy worker received).

CUDA cannot be initialized on a CPU build of torch, so the first test makes every call that initializes it on a CUDA
build fail, imports the fork server's module as the fork server does, and checks that none was made. The fork server
also asks the driver itself (sf.processes.control.check_cuda_driver), after its warm-up and after the env modules:
tested with every family's env modules preloaded, against this machine's driver (none here: the no-driver path) and a
stand-in driver library. A process whose arguments cannot be unpickled in it (a CUDA tensor where CUDA cannot be used)
reports one line in the run's log. tests/gpu/test_gpu_path.py runs the real thing where a GPU exists."""
import ctypes.util
import json
import pickle
import re
import shutil
import subprocess
import sys

import pytest

from e2e_helpers import ROOT, train_args

PROBE = r"""
import os, sys
import torch

calls = []
def forbid(name):
    def call(*args, **kwargs):
        calls.append(name)
        raise RuntimeError(f"{name} initializes CUDA on a CUDA build of torch")
    return call

# what initializes the CUDA driver or a context: the autograd engine's first backward (it asks each device type for
# its device count), the runtime's device count behind torch.cuda.is_available() (unless NVML is asked), and an
# optimizer's graph-capture check (it reads the current CUDA stream)
torch.autograd.backward = forbid("torch.autograd.backward")
torch.Tensor.backward = forbid("Tensor.backward")
torch.accelerator.current_stream = forbid("torch.accelerator.current_stream")
torch.accelerator.current_accelerator = forbid("torch.accelerator.current_accelerator")
torch.cuda.current_stream = forbid("torch.cuda.current_stream")
real_is_available = torch.cuda.is_available
def is_available():
    if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1":
        calls.append("torch.cuda.is_available without NVML")
    return real_is_available()
torch.cuda.is_available = is_available

import sf.runner.startup.fork_server  # noqa: F401  (runs the warm-up)
torch.cuda.is_available()
assert not calls, calls
print("clean", os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"])
"""


@pytest.mark.e2e
def test_fork_server_warm_up_touches_nothing_that_initializes_cuda():
    res = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # (the module moves itself into a process group of its own: setpgid)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["clean", "1"]


# The modules the fork server would preload for one env of each family, as the runner learns them (preflight.probe_env:
# the top-level modules making an env imported), and those parsing its config imported (not preloaded today: the
# PettingZoo family's, imported while its name is checked); a family whose package is not installed here is named.
PROBE_ENV_MODULES = r"""
import json, sys, tempfile
from sf.cfg.parse import parse_cfg
from sf.cfg import ConfigError
from sf.runner.startup.preflight import probe_env
from sf_envs.errors import EnvUnavailableError
from sf_envs.registry import check_env_available

before = set(sys.modules)
found = {}
for family, env in json.loads(sys.argv[1]).items():
    with tempfile.TemporaryDirectory() as td:
        cfg = parse_cfg(["--env", env, "--train_dir", td, "--experiment", "probe", "--num_workers", "1"])
        try:
            found[family] = probe_env(cfg)[3]  # (nothing may import the env's modules before: they would be missed)
        except ConfigError:
            try:  # not installed here, or a sample name gone stale (which fails the test)
                check_env_available(cfg)
            except EnvUnavailableError as e:
                found[family] = str(e)
            else:
                raise
modules = sorted({m.split(".")[0] for m in set(sys.modules) - before if not m.startswith("_")})
print(json.dumps({"families": found, "modules": modules}))
"""

# A fresh process preloads as the fork server does (supervision.worker_context: sf.runner.startup.fork_server, the env
# modules, sf.runner.startup.fork_server_ready), then reports its driver checks; then the same checks against the
# stand-in library.
PRELOAD_AND_CHECK = r"""
import json, os, sys
import sf.runner.startup.fork_server
for module in json.loads(sys.argv[1]):
    __import__(module)
import sf.runner.startup.fork_server_ready
from sf.processes import control

result = {"real": control.driver_checks(), "clean_before": control.forked_from_cuda()}
control.CUDA_DRIVER = sys.argv[2]
for answer in ("3", "0"):  # CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS
    os.environ["STAND_IN_CUDA_ANSWER"] = answer
    result[answer] = control.cuda_driver_initialized()
control.check_cuda_driver("the stand-in's test")  # (answers 0: CUDA initialized)
try:
    control.bind_device("cuda:0")
except RuntimeError as e:
    result["refused"] = str(e)
print(json.dumps(result))
"""

# cuda.h: CUresult cuDeviceGetCount(int *count); here answering STAND_IN_CUDA_ANSWER
STAND_IN_DRIVER = r"""
#include <stdlib.h>
int cuDeviceGetCount(int *count) {
    const char *answer = getenv("STAND_IN_CUDA_ANSWER");
    *count = 1;
    return answer ? atoi(answer) : 3;
}
"""


def _sample_envs() -> dict:
    """One env of each family of sf_envs.families: the first listed name, or one of an open-ended family's."""
    from sf_envs.families import FAMILIES
    from sf_envs.registry import env_names
    open_ended = {"gym": "gym:CartPole-v1", "pettingzoo": "pettingzoo_simple_spread_v3"}
    names = env_names()
    samples = {f.name: next(n for n in names if n.startswith(f.prefix)) if f.listed else open_ended.get(f.name)
               for f in FAMILIES}
    missing = [family for family, env in samples.items() if env is None]
    assert not missing, f"no sample env for the families {missing}"
    return samples


@pytest.mark.e2e
def test_the_fork_server_asks_the_driver_after_preloading_every_family(tmp_path):
    """Every module the fork server preloads for any family (one env of each, probed as the runner probes it, with what
    parsing its config imported) imported in a fresh process as the fork server imports them; then its driver checks.
    On a machine without an NVIDIA driver (this one) both checks answer "no driver" (None), and nothing is refused.
    The ctypes path itself runs against a stand-in for libcuda.so.1 compiled here with gcc (not a mock in Python: the
    real driver cannot run on this machine; the stand-in exports cuDeviceGetCount, answering 3,
    CUDA_ERROR_NOT_INITIALIZED, or 0, success, as an environment variable says): "not initialized", and "initialized",
    which refuses a CUDA device in one line that names the culprit. tests/gpu/test_gpu_path.py asserts the real
    driver's "not initialized" in a fork server on a GPU."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the stand-in driver library")
    source, stand_in = tmp_path / "stand_in.c", tmp_path / "libcuda_stand_in.so"
    source.write_text(STAND_IN_DRIVER)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(stand_in), str(source)], check=True, timeout=60)

    probe = subprocess.run([sys.executable, "-c", PROBE_ENV_MODULES, json.dumps(_sample_envs())], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-3000:]
    found, modules = json.loads(probe.stdout.splitlines()[-1]).values()
    probed = {family: preload for family, preload in found.items() if isinstance(preload, list)}
    assert probed and all(set(preload) <= set(modules) for preload in probed.values()), (found, modules)
    print("families probed:", sorted(probed), "not here:", sorted(set(found) - set(probed)), "modules:", modules)

    res = subprocess.run([sys.executable, "-c", PRELOAD_AND_CHECK, json.dumps(modules), str(stand_in)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # (the fork server's module: setpgid)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout.splitlines()[-1])
    # the driver as this machine has it: none (None), or, on a GPU machine, one that says not initialized (False)
    expected = None if ctypes.util.find_library("cuda") is None else False
    assert [answer for _, answer in result["real"]] == [expected, expected], result["real"]
    assert result["real"][0][0].startswith("train.py's imports (__main__), torch")
    env_check = result["real"][1][0]
    named = re.fullmatch(r"the env modules \((.*)\)", env_check)
    assert named and set(named.group(1).split(", ")) <= set(modules), env_check
    if "vizdoom" in modules:  # (imported by nothing the fork server's module imports: named by the second check)
        assert "vizdoom" in env_check
    assert result["clean_before"] is None
    assert result["3"] is False and result["0"] is True
    assert re.fullmatch(r"process \d+ cannot use cuda:0: the fork server it was forked from had initialized CUDA once "
                        r"it imported the stand-in's test, and a child of such a process cannot use CUDA: "
                        r".*--device cpu", result["refused"]), result["refused"]


@pytest.mark.e2e
def test_a_process_whose_arguments_cannot_be_unpickled_reports_one_line_in_the_runs_log(tmp_path):
    """The learner is started with an argument whose unpickling raises in its process what torch raises for a CUDA
    tensor there (tests/runner/unloadable_args_train.py). multiprocessing unpickles a process's arguments before its
    target runs: this ended the learner with torch's traceback on the fork server's stderr and nothing in the run's log.
    Now child_main unpickles them in its guard: one console line, the traceback in sf_log.txt, exit code 1."""
    res = subprocess.run([sys.executable, str(ROOT / "tests" / "runner" / "unloadable_args_train.py"),
                          *train_args(tmp_path, "test_corridor", "--num_workers", "1", "--train_for_seconds", "60")],
                         cwd=ROOT, capture_output=True, text=True, timeout=90)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]  # (the fork server's stderr is the runner's)
    line = "learner crashed: sf.runner.startup.supervision.ArgumentsError: learner cannot unpickle its arguments in " \
           "its own process: RuntimeError: Cannot re-initialize CUDA in forked subprocess."
    assert [ln for ln in out.splitlines() if "crashed:" in ln and line in ln], out[-3000:]
    log_file = (tmp_path / "e2e" / "sf_log.txt").read_text()
    assert line in log_file and "learner crashed:\nTraceback" in log_file, log_file[-3000:]


def _unpickle_fails():
    raise RuntimeError("CUDA error: initialization error\nCUDA kernel errors might be asynchronously reported")


class _FailsInTheChild:
    def __reduce__(self):
        return _unpickle_fails, ()


def _through_multiprocessing(args: tuple) -> tuple:
    """`args` pickled and unpickled as multiprocessing passes a process's arguments."""
    from multiprocessing.reduction import ForkingPickler
    return pickle.loads(ForkingPickler.dumps(args))


def test_child_args_are_unpickled_by_child_main_with_the_report_queue_received_once():
    from sf.runner.startup.supervision import child_args
    report = ["the report queue"]
    name, received, pid, unwind, packed = _through_multiprocessing(child_args("learner", report, 7, False, len, report))
    assert (name, received, pid, unwind) == ("learner", report, 7, False)
    target, args = packed.load(name, received)
    assert target is len and args[0] is received  # the same object, not a second copy


def test_arguments_that_cannot_be_unpickled_raise_one_line_that_stops_the_run(monkeypatch):
    """The failure's first line, and the fork server's driver check where it found CUDA initialized (the likely
    cause)."""
    from sf.processes import control
    from sf.runner.startup.supervision import ArgumentsError, child_args
    packed = _through_multiprocessing(child_args("policy_worker_0", None, 7, False, len, _FailsInTheChild()))[-1]
    with pytest.raises(ArgumentsError) as failed:
        packed.load("policy_worker_0", None)
    assert str(failed.value) == ("policy_worker_0 cannot unpickle its arguments in its own process: RuntimeError: CUDA "
                                 "error: initialization error")
    assert failed.value.stops_the_run  # a replacement would fail the same way
    monkeypatch.setattr(control, "_driver_checks", [("torch", False), ("the env modules (jax)", True)])
    with pytest.raises(ArgumentsError, match=r"initialization error; the fork server it was forked from had "
                                             r"initialized CUDA once it imported the env modules \(jax\), and a "):
        packed.load("policy_worker_0", None)
