"""Bad input, end to end (issue 14): the real entry points (train.py, enjoy.py) run as subprocesses over a table of
bad commands, bad saved files and failing filesystems.

For every case: the exit code (2 for bad input, 1 for an I/O failure), no "Traceback" anywhere on the console, the
error is ONE line naming the flag or file and what would be valid (or what failed and where), no process of the run
is left, and the files of an existing experiment (trained once per module by a tiny real run) and of every "victim"
directory next to it are byte-identical afterwards (every file under the module's base directory is hashed before
and after each case, directories and symlinks included).

Cases that need to change an experiment (forged config.json, full or read-only filesystems) work on a copy. Two
kinds of case check less than byte-identity, on purpose: a garbage checkpoint is moved into checkpoint_p0/rejected/
by design (its bytes must be kept), and a run that fails on a full disk has started (its log grows): there the
previous checkpoints must be byte-identical and still load. The filesystem cases mount small tmpfs (root only;
skipped where mounting is impossible) and unmount them in the fixture's finalizer.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import psutil
import pytest

from e2e_helpers import made_once, shm_files, shm_left_behind

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
MARK_VAR = "SF_TEST_BAD_INPUT_RUN"  # every process of one run inherits it: how leftovers are found

TINY = ["--num_workers", "1", "--num_envs_per_worker", "2", "--rollout", "8", "--recurrence", "8", "--batch_size", "32",
        "--rnn_size", "16", "--hidden_size", "16", "--encoder_mlp_layers", "16", "--device", "cpu"]
# Put before a case's own flags (argparse: the last occurrence wins), so that a command accepted by mistake stops soon.
SAFE = {"train.py": ["--train_for_env_steps", "600", "--train_for_seconds", "60", "--device", "cpu",
                     "--num_workers", "1"],
        "enjoy.py": ["--no_render", "--max_num_frames", "50", "--device", "cpu"]}
LONG_NAME = "n" * 128  # the longest valid experiment name


# ------------------------------------------------------------------------------------------------------------------
# running an entry point


@dataclass
class Result:
    script: str
    args: list
    rc: int
    out: str
    err: str
    seconds: float

    @property
    def console(self) -> str:
        return self.out + self.err

    def show(self, limit: int = 4000) -> str:
        return (f"$ {self.script} {' '.join(map(repr, self.args))}\nexit code {self.rc} after {self.seconds:.1f} s\n"
                f"--- stdout ---\n{self.out[-limit:]}--- stderr ---\n{self.err[-limit:]}")


def _marked(mark: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK_VAR) == mark and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def run(script: str, args, cwd: Path, timeout: float = 120.0, safe: bool = True) -> Result:
    """`python <script> [SAFE flags] args` in `cwd`; fails the test if it hangs or leaves a process behind."""
    args = [str(a) for a in ([*SAFE[script]] if safe else []) + list(args)]
    mark = uuid.uuid4().hex
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{MARK_VAR: mark})
    env.pop("DISPLAY", None)
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(ROOT / script), *args], cwd=cwd, env=env, capture_output=True,
                              text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as e:
        for p in _marked(mark):  # only processes of this run (they carry its mark)
            try:
                p.kill()
            except psutil.Error:
                pass
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"{script} {args} did not finish within {timeout:.0f} s\n--- stdout ---\n{out[-3000:]}\n"
                    f"--- stderr ---\n{err[-3000:]}")
    res = Result(script, args, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)
    deadline = time.monotonic() + 15
    while (left := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        names = [(p.pid, " ".join(p.cmdline())[:200]) for p in left]
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        pytest.fail(f"processes of the run were left running: {names}\n{res.show()}")
    return res


def error_problems(res: Result, rc: int, expect, phase: str = "cli") -> list[str]:
    """What is wrong with a failed run's console (empty: nothing). phase "cli": the command is refused before
    anything starts: nothing on stdout, exactly one stderr line "<script>: error: ...". phase "run": the run started
    (its log lines are on stdout) and failed: exactly one error line in all the output."""
    problems = []
    if "Traceback" in res.console:
        problems.append("a Traceback is on the console")
    if phase == "cli":
        lines = res.err.splitlines()
        if res.out.strip():
            problems.append("stdout is not empty")
        if len(lines) != 1:
            problems.append(f"stderr has {len(lines)} lines, not 1")
        errors = [ln for ln in lines if ln.startswith(f"{res.script}: error: ")]
        if lines and not errors:
            problems.append(f"stderr does not start with '{res.script}: error: '")
    else:
        errors = [ln for ln in res.console.splitlines()
                  if "[ERROR]" in ln or "[CRITICAL]" in ln or ln.startswith(f"{res.script}: error")]
        if len(errors) != 1:
            problems.append(f"{len(errors)} error lines, not 1: {errors}")
    line = errors[0] if errors else res.console
    for e in expect:
        if e not in line:
            problems.append(f"the error line does not contain {e!r}")
    if res.rc != rc:  # last: the other checks still say what else is wrong
        problems.append(f"exit code {res.rc}, expected {rc}")
    return problems


def assert_error(res: Result, rc: int, expect, phase: str = "cli") -> None:
    problems = error_problems(res, rc, expect, phase)
    assert not problems, "; ".join(problems) + "\n" + res.show()


# ------------------------------------------------------------------------------------------------------------------
# what is on disk


def snapshot(root: Path) -> dict:
    """relative path -> ("file", sha256) / ("dir",) / ("link", target) / ("other", mode) of everything under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):  # does not follow symlinks
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir",)
            elif stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
                out[rel] = ("file", h.hexdigest())
            else:
                out[rel] = ("other", stat.S_IFMT(st.st_mode))
    return out


def snapshot_diff(before: dict, after: dict) -> str:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return f"added {added[:10]}, removed {removed[:10]}, changed {changed[:10]}"


def assert_unchanged(before: dict, root: Path, res: Result | None = None) -> None:
    after = snapshot(root)
    assert after == before, f"files under {root} changed: {snapshot_diff(before, after)}\n{res.show() if res else ''}"


# ------------------------------------------------------------------------------------------------------------------
# the shared world: one trained experiment and victims around it


@dataclass
class World:
    base: Path  # the snapshot root: train_dir, victims, the cwd of every run
    td: Path
    exp: Path
    cwd: Path

    def fmt(self, s: str) -> str:
        return s.format(td=self.td, base=self.base, victim=self.base / "victim", exp=self.exp)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    def make(td):
        res = run("train.py", ["--env", "test_corridor", "--experiment", "exp", "--train_dir", td, *TINY,
                               "--train_for_env_steps", "500"], cwd=td, timeout=240, safe=False)
        assert res.rc == 0, res.show()
        assert list((td / "exp" / "checkpoint_p0").glob("checkpoint_*.pth")), res.show()
    base = tmp_path_factory.mktemp("bad_input")
    td, cwd, exp = base / "train_dir", base / "cwd", base / "train_dir" / "exp"
    cwd.mkdir()
    td.mkdir()
    shutil.move(made_once(tmp_path_factory, "bad_input_exp", make) / "exp", exp)
    cfg_bytes = (exp / "config.json").read_bytes()
    # Victims look like experiments (a config.json): a bad name that reached one would restart or overwrite it.
    for d in (base / "victim", base / "outside", td / "a" / "b"):
        d.mkdir(parents=True)
        (d / "config.json").write_bytes(cfg_bytes)
        (d / "precious.txt").write_text(f"data of {d.name}, must survive\n")
    (td / "config.json").write_bytes(cfg_bytes)  # so that '.' and '..' name "experiments" too
    (base / "config.json").write_bytes(cfg_bytes)
    (td / "notexp").mkdir()  # a directory inside train_dir that is not an experiment (no config.json)
    (td / "notexp" / "data.txt").write_text("not an experiment, must survive\n")
    (td / "link").symlink_to(base / "outside", target_is_directory=True)  # points outside train_dir
    (td / "dangling").symlink_to(base / "nowhere")
    (td / "afile").write_text("a file, not a directory\n")
    return World(base, td, exp, cwd)


def beyond(exp: Path) -> list[str]:
    """A budget past what the experiment trained (its run overshoots its own by a varying amount): a resume that
    trains. With the budget reached, a resume trains and writes nothing (not what the I/O cases are about)."""
    trained = max(int(p.stem.split("_")[2]) for p in (exp / "checkpoint_p0").glob("checkpoint_*.pth"))
    return ["--train_for_env_steps", str(trained + 100)]


def run_in_world(world: World, script: str, args, rc: int, expect, phase: str = "cli", timeout: float = 120) -> Result:
    before = snapshot(world.base)
    res = run(script, [world.fmt(a) for a in args], cwd=world.cwd, timeout=timeout)
    problems = error_problems(res, rc, [world.fmt(e) for e in expect], phase)
    after = snapshot(world.base)
    if after != before:
        problems.insert(0, f"files changed: {snapshot_diff(before, after)}")
    assert not problems, "; ".join(problems) + "\n" + res.show()
    return res


# ------------------------------------------------------------------------------------------------------------------
# experiment names and train dirs


NAMES = [  # (id, how it is given on the command line, what the one line must say)
    ("empty", ["--experiment", ""], ["--experiment must not be empty"]),
    ("dot", ["--experiment", "."], ["--experiment must not be '.' or '..'"]),
    ("dotdot", ["--experiment", ".."], ["--experiment must not be '.' or '..'"]),
    ("parent-victim", ["--experiment", "../victim"], ["--experiment must be one directory name, without '/'"]),
    ("subdir-a-b", ["--experiment", "a/b"], ["--experiment must be one directory name, without '/'"]),
    ("absolute-victim", ["--experiment", "{victim}"], ["--experiment must be one directory name, without '/'"]),
    ("backslash", ["--experiment", "a\\b"], ["--experiment must be one directory name"]),
    ("300-chars", ["--experiment", "x" * 300], ["--experiment must be at most 128 characters long (got 300)"]),
    ("newline", ["--experiment", "exp\nvictim"], ["--experiment may contain only letters, digits, spaces and _-.=,+@:",
                                                  "'\\n'"]),
    ("hidden", ["--experiment", ".victim"], ["--experiment must start with a letter, a digit or _"]),
    ("leading-dash", ["--experiment=-victim"], ["--experiment must start with a letter, a digit or _"]),
    ("trailing-space", ["--experiment", "exp "], ["--experiment must not end with a space"]),
    ("missing-value", ["--experiment"], ["argument --experiment: expected one argument"]),
]

# enjoy.py validates names with the same code: the path-like ones are enough there
ENJOY_NAMES = {"empty", "dot", "dotdot", "parent-victim", "subdir-a-b", "absolute-victim", "newline"}
NAME_CASES = [
    pytest.param(script, [*flags, "--env", "test_corridor", "--train_dir", "{td}", *behavior], expect,
                 id=f"{name_id}-{script[:-3]}{'-' + behavior[1] if behavior else ''}")
    for name_id, flags, expect in NAMES
    for script, behavior in [("train.py", ["--restart_behavior", "resume"]),
                             ("train.py", ["--restart_behavior", "restart"]),
                             ("train.py", ["--restart_behavior", "overwrite"]), ("enjoy.py", [])]
    if script == "train.py" or name_id in ENJOY_NAMES
]


@pytest.mark.parametrize("script,args,expect", NAME_CASES)
def test_bad_experiment_name(world, script, args, expect):
    run_in_world(world, script, args, 2, expect)


TRAIN_DIR_CASES = [
    pytest.param("train.py", ["--train_dir", "", "--restart_behavior", "overwrite"], ["--train_dir must not be empty"],
                 id="empty-overwrite"),
    pytest.param("train.py", ["--train_dir", ""], ["--train_dir must not be empty"], id="empty-resume"),
    pytest.param("enjoy.py", ["--train_dir", ""], ["--train_dir must not be empty"], id="empty-enjoy"),
    pytest.param("train.py", ["--train_dir", " "], ["--train_dir must not be empty"], id="blank"),
    pytest.param("train.py", ["--train_dir", "/", "--experiment", "sf_bad_input_probe",
                              "--restart_behavior", "overwrite"],
                 ["--train_dir must not be the filesystem root"], id="root-overwrite"),
    pytest.param("train.py", ["--train_dir", "{td}\nx"], ["--train_dir must not contain control characters", "'\\n'"],
                 id="newline"),
    pytest.param("train.py", ["--train_dir", "{victim}/precious.txt"],
                 ["--train_dir {victim}/precious.txt is not writable", "choose a directory you can write to"],
                 id="is-a-file"),
    pytest.param("train.py", ["--train_dir", "{victim}/precious.txt/sub"],
                 ["--train_dir {victim}/precious.txt/sub is not writable", "choose a directory you can write to"],
                 id="under-a-file"),
    pytest.param("train.py", ["--train_dir", "{base}/" + "/".join(["d" * 200] * 21)],
                 ["--train_dir must be at most 4000 bytes long"], id="over-4000-bytes"),
]


@pytest.mark.parametrize("script,args,expect", TRAIN_DIR_CASES)
def test_bad_train_dir(world, script, args, expect):
    run_in_world(world, script, ["--env", "test_corridor", *args], 2, expect)


# ------------------------------------------------------------------------------------------------------------------
# restart/overwrite of what is not an experiment; names that are not directories


NOT_EXPERIMENT_CASES = [
    *[pytest.param("train.py", ["--experiment", name, "--restart_behavior", b],
                   [f"--restart_behavior {b}: {{td}}/{name} is not an experiment directory",
                    "refusing to move or delete it"],
                   id=f"{name}-{b}")
      for name in ("notexp", "link") for b in ("restart", "overwrite")],
    *[pytest.param("train.py", ["--experiment", name, "--restart_behavior", b],
                   [f"--experiment: {{td}}/{name} exists and is not a directory"], id=f"{name}-{b}")
      for name in ("afile", "dangling") for b in ("resume", "restart", "overwrite")],
    pytest.param("enjoy.py", ["--experiment", "notexp"],
                 ["no latest checkpoint in {td}/notexp/checkpoint_p0", "train first"], id="notexp-enjoy"),
    pytest.param("enjoy.py", ["--experiment", "link"],
                 ["no latest checkpoint in {td}/link/checkpoint_p0", "train first"], id="link-enjoy"),
    pytest.param("enjoy.py", ["--experiment", "nope"], ["experiment directory {td}/nope does not exist",
                                                        "check --experiment and --train_dir"], id="missing-enjoy"),
    *[pytest.param("enjoy.py", ["--experiment", name], [f"experiment directory {{td}}/{name} is not a directory",
                                                        "check --experiment and --train_dir"], id=f"{name}-enjoy")
      for name in ("afile", "dangling")],
]


@pytest.mark.parametrize("script,args,expect", NOT_EXPERIMENT_CASES)
def test_not_an_experiment(world, script, args, expect):
    tiny = TINY if script == "train.py" else []  # restart/overwrite do not read the saved config: keep the run small
    run_in_world(world, script, ["--env", "test_corridor", "--train_dir", "{td}", *tiny, *args], 2, expect)


# ------------------------------------------------------------------------------------------------------------------
# absurd values (on a new experiment name: nothing may be created)


VALUE_CASES = [
    ("lr-nan", ["--learning_rate", "nan"], ["--learning_rate must be a finite number in (0, 1] (got nan)"]),
    ("lr-minus-inf", ["--learning_rate=-inf"], ["--learning_rate must be a finite number in (0, 1]"]),
    ("lr-empty", ["--learning_rate", ""], ["--learning_rate: expected a number, got ''"]),
    ("lr-zero", ["--learning_rate", "0"], ["--learning_rate must be in (0, 1] (got 0"]),
    ("gamma-50", ["--gamma", "50"], ["--gamma must be in [0, 1] (got 50"]),
    ("gamma-1e400", ["--gamma", "1e400"], ["--gamma must be a finite number in [0, 1]"]),
    ("adam_beta1-5", ["--adam_beta1", "5"], ["--adam_beta1 must be in [0, 1) (got 5"]),
    ("ppo_clip_ratio-inf", ["--ppo_clip_ratio", "inf"], ["--ppo_clip_ratio must be a finite number in (0, 10]"]),
    ("vtrace_rho-nan", ["--vtrace_rho", "nan"], ["--vtrace_rho must be a finite number in (0, 1000000]"]),
    ("seed-minus-1", ["--seed", "-1"], ["--seed must be in [0, 4294967295] or None (got -1)"]),
    ("seed-2e70", ["--seed", str(2**70)], ["--seed must be in [0, 4294967295] or None", str(2**70)]),
    ("seed-1.5", ["--seed", "1.5"], ["--seed: expected an integer, got '1.5'"]),
    ("seed-abc", ["--seed", "abc"], ["--seed: expected an integer, got 'abc'"]),
    ("num_workers-1e6", ["--num_workers", "1000000"], ["--num_workers must be in [1, 200] (got 1000000)"]),
    ("num_workers-0", ["--num_workers", "0"], ["--num_workers must be in [1, 200] (got 0)"]),
    ("rnn_size-1e7", ["--rnn_size", "10000000"], ["--rnn_size must be in [1, 65536] (got 10000000)"]),
    ("batch_size-1e12", ["--batch_size", "1000000000000"], ["--batch_size must be in [1, 16777216]"]),
    ("rollout-abc", ["--rollout", "abc"], ["--rollout: expected an integer, got 'abc'"]),
    ("train_for_env_steps-0", ["--train_for_env_steps", "0"],
     ["--train_for_env_steps must be in [1, 1000000000000000]"]),
    ("mlp-layer-0", ["--encoder_mlp_layers", "0"], ["--encoder_mlp_layers entries must be in [1, 65536] (got [0])"]),
    ("mlp-65-layers", ["--encoder_mlp_layers", *["8"] * 65],
     ["--encoder_mlp_layers must have 0 to 64 entries (got 65)"]),
    ("use_rnn-maybe", ["--use_rnn", "maybe"], ["--use_rnn: expected True or False, got 'maybe'"]),
    ("restart_behavior-bogus", ["--restart_behavior", "bogus"],
     ["--restart_behavior must be one of resume, restart, overwrite (got 'bogus')"]),
    ("device-tpu", ["--device", "tpu"],
     ["--device must be one of auto, cpu, cuda (got 'tpu')"]),  # (gpu: Sample Factory's cuda)
    # cross-parameter rules
    ("envs-not-divisible", ["--num_envs_per_worker", "3"],
     ["--num_envs_per_worker (3) must be divisible by --worker_num_splits (2)"]),
    ("too-many-envs", ["--num_workers", "200", "--num_envs_per_worker", "512"],
     ["--num_workers x --num_envs_per_worker must be at most 65536 envs in all"]),
    ("batch-not-multiple", ["--rollout", "8", "--recurrence", "8", "--batch_size", "33"],
     ["--batch_size (33) must be a multiple of --rollout (8)"]),
    ("recurrence-not-divisor", ["--rollout", "8", "--recurrence", "3", "--batch_size", "32"],
     ["--recurrence (3) must divide --rollout (8)"]),
    ("samples-per-batch", ["--rollout", "8", "--recurrence", "8", "--batch_size", "16777216",
                           "--num_batches_per_epoch", "2"],
     ["--batch_size x --num_batches_per_epoch must be at most 16777216 samples"]),
    ("traj-buffers-too-few", ["--num_traj_buffers", "5"], ["--num_traj_buffers (5) must be 0 or at least"]),
    # the command line itself
    ("unknown-flag", ["--learning_rat", "0.1"],
     ["unrecognized arguments: --learning_rat", "did you mean --learning_rate?"]),
    ("enjoy-flag-in-train", ["--no_render"], ["unrecognized arguments: --no_render"]),
    ("unknown-env", ["--env", "doom_basik"], ["--env: unknown env 'doom_basik'", "did you mean doom_basic"]),
    ("env-control-char", ["--env", "test\tcorridor"], ["--env must not contain control characters"]),
]


@pytest.mark.parametrize("args,expect", [pytest.param(a, e, id=i) for i, a, e in VALUE_CASES])
def test_absurd_value(world, args, expect):
    run_in_world(world, "train.py", ["--env", "test_corridor", "--experiment", "fresh", "--train_dir", "{td}", *args],
                 2, expect)


def test_missing_env(world):
    run_in_world(world, "train.py", ["--experiment", "fresh", "--train_dir", "{td}"], 2, ["--env is required"])


@pytest.mark.skipif(find_spec("torch") is None, reason="torch is needed to know whether CUDA is available")
def test_cuda_when_there_is_none(world):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run_in_world(world, "train.py", ["--env", "test_corridor", "--experiment", "fresh", "--train_dir", "{td}",
                                     "--device", "cuda"], 2, ["--device cuda: no CUDA device is available here"])


ENJOY_VALUE_CASES = [
    ("max_num_frames-0", ["--max_num_frames", "0"], ["--max_num_frames must be in [1, 1000000000000000] (got 0)"]),
    ("fps-minus-1", ["--fps", "-1"], ["--fps must be in [0, 1000] (got -1)"]),
    ("video_name-newline", ["--video_name", "a\nb"], ["--video_name must not contain control characters"]),
    ("checkpoint-kind-worst", ["--load_checkpoint_kind", "worst"],
     ["--load_checkpoint_kind must be one of latest, best (got 'worst')"]),
    ("train-flag-in-enjoy", ["--restart_behavior", "overwrite"],
     ["unrecognized arguments: --restart_behavior overwrite"]),
    ("rnn_size-mismatch", ["--rnn_size", "32"],
     ["checkpoint {exp}/checkpoint_p0/", "has model entry 'core.rnn.weight_ih_l0' of shape [48, 16]",
      "different model settings, e.g. --rnn_size/--hidden_size?"]),
]


@pytest.mark.parametrize("args,expect", [pytest.param(a, e, id=i) for i, a, e in ENJOY_VALUE_CASES])
def test_enjoy_bad_value(world, args, expect):
    run_in_world(world, "enjoy.py", ["--env", "test_corridor", "--experiment", "exp", "--train_dir", "{td}", *args], 2,
                 expect)


# ------------------------------------------------------------------------------------------------------------------
# rejected commands on the existing experiment leave it as it was


POISON_CASES = [
    ("batch_size-1e12", ["--batch_size", "1000000000000"], ["--batch_size must be in [1, 16777216]"]),
    ("rnn_size-32", ["--rnn_size", "32"],
     ["checkpoint {exp}/checkpoint_p0/", "has model entry", "this run's model has [96, 16]",
      "--rnn_size/--hidden_size"]),
    ("mlp-two-layers", ["--encoder_mlp_layers", "16", "16"], ["checkpoint {exp}/checkpoint_p0/", "model entry"]),
    ("nonlinearity-relu", ["--nonlinearity", "relu"],  # same shapes, another function: refused too
     ["checkpoint {exp}/checkpoint_p0/", "has model options {{'nonlinearity': 'elu'}}", "this run has model options "
      "{{'nonlinearity': 'relu'}}"]),
    ("other-env", ["--env", "test_image"],
     ["checkpoint {exp}/checkpoint_p0/", "is from env test_corridor", "use another --experiment"]),
    ("rollout-7", ["--rollout", "7"], ["--batch_size (32) must be a multiple of --rollout (7)"]),
    ("gamma-50", ["--gamma", "50"], ["--gamma must be in [0, 1] (got 50"]),
]


@pytest.mark.parametrize("args,expect", [pytest.param(a, e, id=i) for i, a, e in POISON_CASES])
def test_rejected_on_existing_experiment(world, args, expect):
    run_in_world(world, "train.py", ["--env", "test_corridor", "--experiment", "exp", "--train_dir", "{td}", *args], 2,
                 expect)


def test_rejected_commands_do_not_poison_experiment(world, tmp_path):
    """Rejected commands leave config.json byte-identical; a plain resume and enjoy of the experiment still work."""
    td = tmp_path / "td"
    shutil.copytree(world.exp, td / "exp", symlinks=True)
    config = (td / "exp" / "config.json").read_bytes()
    before = snapshot(tmp_path)
    base = ["--env", "test_corridor", "--experiment", "exp", "--train_dir", td]
    for bad, expect in ((["--batch_size", "1000000000000"], "--batch_size must be in"),
                        (["--rnn_size", "32"], "has model entry")):
        res = run("train.py", [*base, *bad], cwd=tmp_path, safe=False)
        assert_error(res, 2, [expect])
        assert (td / "exp" / "config.json").read_bytes() == config
        assert_unchanged(before, tmp_path, res)
    res = run("enjoy.py", [*base, "--no_render", "--max_num_frames", "50"], cwd=tmp_path, safe=False)
    assert res.rc == 0 and "Loaded latest checkpoint" in res.out and "Traceback" not in res.console, res.show()
    assert_unchanged(before, tmp_path, res)  # enjoy writes nothing
    res = run("train.py", base, cwd=tmp_path, timeout=180, safe=False)  # a plain resume: the saved, finished budget
    assert res.rc == 0 and "Done: nothing to train" in res.out and "Traceback" not in res.console, res.show()
    assert_unchanged(before, tmp_path, res)  # nothing trained, nothing written
    res = run("train.py", [*base, *beyond(td / "exp")], cwd=tmp_path, timeout=180, safe=False)
    assert res.rc == 0 and "Resumed from checkpoint" in res.out and "Traceback" not in res.console, res.show()


# ------------------------------------------------------------------------------------------------------------------
# forged saved config.json (in a copy of the experiment)


def _with(key, value):
    return lambda d: json.dumps({**d, key: value})


FORGED = [  # (id, the new content of config.json from the saved dict, what the line must say after the file name)
    ("rollout-abc", _with("rollout", "abc"), [": key 'rollout': expected an integer, got 'abc'"]),
    ("json-list", lambda d: json.dumps([d]), [': expected a JSON object {"key": value, ...}, got a list']),
    ("json-string", lambda d: json.dumps("config"), [": expected a JSON object", "got a string"]),
    ("mlp-layers-number", _with("encoder_mlp_layers", 5),
     [": key 'encoder_mlp_layers': expected a list of integers, got 5"]),
    ("mlp-layers-strings", _with("encoder_mlp_layers", ["a"]),
     [": key 'encoder_mlp_layers': expected an integer, got 'a'"]),
    ("invalid-json", lambda d: '{"rollout": 8,', [" is not valid JSON: Expecting property name"]),
    ("empty-file", lambda d: "", [" is not valid JSON: Expecting value"]),
    ("not-utf8", lambda d: b"\xff\xfe{", [" is not valid JSON: not UTF-8 text"]),
    ("deep-nesting", lambda d: "[" * 100_000, [" is not valid JSON"]),
    ("lr-nan", lambda d: json.dumps({**d, "learning_rate": float("nan")}),
     [": key 'learning_rate' must be a finite number in (0, 1] (got nan)"]),
    ("gamma-50", _with("gamma", 50), [": key 'gamma' must be in [0, 1] (got 50"]),
    ("rnn_size-null", _with("rnn_size", None), [": key 'rnn_size': expected an integer, got None"]),
    ("use_rnn-maybe", _with("use_rnn", "maybe"), [": key 'use_rnn': expected True or False, got 'maybe'"]),
    ("seed-2e70", _with("seed", 2**70), [": key 'seed' must be in [0, 4294967295] or None"]),
    ("recurrence-cross-rule", _with("recurrence", 3), ["--recurrence (3) must divide --rollout (8)"]),
]


@pytest.mark.parametrize("script", ["train.py", "enjoy.py"])
@pytest.mark.parametrize("forge,expect", [pytest.param(f, e, id=i) for i, f, e in FORGED])
def test_forged_saved_config(world, tmp_path, script, forge, expect):
    td = tmp_path / "td"
    shutil.copytree(world.exp, td / "exp", symlinks=True)
    path = td / "exp" / "config.json"
    content = forge(json.loads(path.read_text()))
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = snapshot(tmp_path)
    res = run(script, ["--env", "test_corridor", "--experiment", "exp", "--train_dir", td], cwd=tmp_path)
    # the file is named (but a cross-parameter rule names the flags: whose value it was is not known there)
    assert_error(res, 2, [f"{path}{e}" if e[0] in ": " else e for e in expect])
    assert_unchanged(before, tmp_path, res)  # the forged file is left as it is, nothing else is written


@pytest.mark.parametrize("script", ["train.py", "enjoy.py"])
def test_saved_config_is_a_directory(world, tmp_path, script):
    """config.json cannot be read (the OS says why): an I/O failure like a read-only disk, exit 1."""
    td = tmp_path / "td"
    shutil.copytree(world.exp, td / "exp", symlinks=True)
    (td / "exp" / "config.json").unlink()
    (td / "exp" / "config.json").mkdir()
    before = snapshot(tmp_path)
    res = run(script, ["--env", "test_corridor", "--experiment", "exp", "--train_dir", td], cwd=tmp_path)
    assert_error(res, 1, [f"cannot read {td / 'exp' / 'config.json'}: Is a directory"])
    assert_unchanged(before, tmp_path, res)


@pytest.mark.parametrize("script", ["train.py"])
def test_garbage_checkpoint(world, tmp_path, script):
    """A latest checkpoint that is not one: refused in one line (exit 2). By design (sf/learning/checkpoint_store.py)
    the file is moved into checkpoint_p0/rejected/ -- its bytes are kept, nothing is deleted."""
    td = tmp_path / "td"
    shutil.copytree(world.exp, td / "exp", symlinks=True)
    ckpt_dir = td / "exp" / "checkpoint_p0"
    latest = sorted(ckpt_dir.glob("checkpoint_*.pth"))
    assert latest
    for path in latest:
        path.write_bytes(b"garbage, not a checkpoint\n")
    before = snapshot(tmp_path)
    res = run(script, ["--env", "test_corridor", "--experiment", "exp", "--train_dir", td], cwd=tmp_path)
    assert_error(res, 2, [f"no loadable latest checkpoint in {ckpt_dir}", f"{len(latest)} file(s) unusable",
                          f"moved to {ckpt_dir / 'rejected'}"])
    expected = dict(before)
    expected[os.path.relpath(ckpt_dir / "rejected", tmp_path)] = ("dir",)
    for path in latest:  # moved, bytes kept
        expected[os.path.relpath(ckpt_dir / "rejected" / path.name, tmp_path)] = expected.pop(
            os.path.relpath(path, tmp_path))
    after = snapshot(tmp_path)
    assert after == expected, snapshot_diff(expected, after)


# ------------------------------------------------------------------------------------------------------------------
# memory that cannot fit: refused in one line, quickly, before anything starts


MEMORY_CASES = [
    pytest.param(["--env", "doom_basic", "--experiment", "mem", "--num_workers", "128", "--num_envs_per_worker", "512"],
                 1000, id="doom-128x512-workers",
                 marks=pytest.mark.skipif(find_spec("vizdoom") is None, reason="vizdoom is not installed")),
    pytest.param(["--env", "test_corridor", "--experiment", "exp", "--rnn_size", "65536", "--hidden_size", "65536",
                  "--encoder_mlp_layers", "65536", "65536"], 600, id="model-65536-on-existing-experiment"),
]


@pytest.mark.parametrize("args,at_least_gib", MEMORY_CASES)
def test_memory_cannot_fit(world, args, at_least_gib):
    if psutil.virtual_memory().available > at_least_gib * 2**30 / 2:
        pytest.skip("this machine has too much memory for the case to be refused")
    shm_before = shm_files(vizdoom=True)
    res = run_in_world(world, "train.py", ["--train_dir", "{td}", *args], 2,
                       ["this configuration needs about", "GiB of memory", "GiB is available",
                        "lower --num_workers, --num_envs_per_worker, --num_policies, --batch_size or the model size"],
                       timeout=90)
    assert res.seconds < 60, f"took {res.seconds:.0f} s to refuse\n{res.show()}"
    left = shm_left_behind(shm_before, vizdoom=True)
    assert not left, f"/dev/shm files left behind: {sorted(left)}"


# ------------------------------------------------------------------------------------------------------------------
# I/O failures: read-only filesystem, path too long, disk full


@pytest.fixture
def tmpfs():
    """mount(path, size) -> path: a fresh tmpfs there (skips the test where mounting is impossible); unmounted after."""
    mounted = []

    def mount(path: Path, size: str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        if shutil.which("mount") is None or os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root and mount(8)")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount_read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)
    probe = path / ".probe"
    with pytest.raises(OSError):
        probe.write_text("x")


def fill(fs_root: Path, leave: int) -> None:
    """Take all the space of the filesystem at fs_root but `leave` bytes."""
    st = os.statvfs(fs_root)
    free = st.f_bavail * st.f_frsize
    assert free > leave, (free, leave)
    with open(fs_root / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, free - leave)
    st = os.statvfs(fs_root)
    assert st.f_bavail * st.f_frsize == leave


RO_CASES = [  # (layout: what is the read-only mount, script, flags, exit code, what the line must say)
    pytest.param("exp_dir", ["--restart_behavior", "resume"], 1,
                 ["cannot write {exp}/config.json: Read-only file system"], id="exp-dir-ro-resume"),
    pytest.param("exp_dir", ["--restart_behavior", "restart"], 1,
                 ["cannot prepare the experiment directory {exp}:"], id="exp-dir-ro-restart"),
    pytest.param("exp_dir", ["--restart_behavior", "overwrite"], 1,
                 ["cannot prepare the experiment directory {exp}: Read-only file system"], id="exp-dir-ro-overwrite"),
    *[pytest.param("train_dir", ["--restart_behavior", b], 2,
                   ["--train_dir {td} is not writable", "choose a directory you can write to"], id=f"train-dir-ro-{b}")
      for b in ("resume", "restart", "overwrite")],
    pytest.param("train_dir", ["--experiment", "fresh"], 2, ["--train_dir {td} is not writable"],
                 id="train-dir-ro-new-experiment"),
]


@pytest.mark.parametrize("layout,flags,rc,expect", RO_CASES)
def test_read_only_filesystem(world, tmpfs, tmp_path, layout, flags, rc, expect):
    td = tmp_path / "td"
    exp = td / "exp"
    if layout == "exp_dir":
        tmpfs(exp, "4m")
        shutil.copytree(world.exp, exp, symlinks=True, dirs_exist_ok=True)
        remount_read_only(exp)
    else:
        tmpfs(td, "4m")
        shutil.copytree(world.exp, exp, symlinks=True)
        remount_read_only(td)
    before = snapshot(tmp_path)
    res = run("train.py", ["--env", "test_corridor", "--experiment", "exp", "--train_dir", td, *flags,
                           *beyond(world.exp)], cwd=tmp_path)
    assert_error(res, rc, [e.format(exp=exp, td=td) for e in expect])
    assert_unchanged(before, tmp_path, res)


def test_finished_experiment_on_read_only_filesystem(world, tmpfs, tmp_path):
    """A resume that has nothing to train (the saved budget is reached) writes nothing: it works on a read-only
    experiment directory, exit code 0, and says so."""
    td = tmp_path / "td"
    tmpfs(td / "exp", "4m")
    shutil.copytree(world.exp, td / "exp", symlinks=True, dirs_exist_ok=True)
    remount_read_only(td / "exp")
    before = snapshot(tmp_path)
    res = run("train.py", ["--env", "test_corridor", "--experiment", "exp", "--train_dir", td], cwd=tmp_path,
              safe=False)
    assert res.rc == 0 and "Done: nothing to train" in res.out and "Traceback" not in res.console, res.show()
    assert_unchanged(before, tmp_path, res)


def test_enjoy_from_read_only_filesystem(world, tmpfs, tmp_path):
    """The control of the read-only cases: enjoy only reads, so it works there."""
    td = tmpfs(tmp_path / "td", "4m")
    shutil.copytree(world.exp, td / "exp", symlinks=True)
    remount_read_only(td)
    res = run("enjoy.py", ["--env", "test_corridor", "--experiment", "exp", "--train_dir", td], cwd=tmp_path)
    assert res.rc == 0 and "Loaded latest checkpoint" in res.out and "Traceback" not in res.console, res.show()


def long_train_dir(root: Path, length: int = 3990) -> Path:
    """A path of exactly `length` bytes (under cfg's 4000-byte limit) made of components of at most 200 bytes:
    with a 128-character experiment name the experiment directory is longer than PATH_MAX (4096)."""
    p = str(root)
    while len(p) < length:
        step = min(200, length - len(p) - 1)
        if step < 1:  # one byte short: make the previous component one byte longer
            p += "d"
            break
        p += "/" + "d" * step
    assert len(p) == length
    return Path(p)


LONG_PATH_CASES = [
    pytest.param("train.py", ["--restart_behavior", "resume"], ["cannot read", "config.json: File name too long"],
                 id="train-resume"),
    pytest.param("train.py", ["--restart_behavior", "restart"],
                 ["cannot prepare the experiment directory", "File name too long"], id="train-restart"),
    pytest.param("train.py", ["--restart_behavior", "overwrite"],
                 ["cannot prepare the experiment directory", "File name too long"], id="train-overwrite"),
    pytest.param("enjoy.py", [], ["cannot read", "config.json: File name too long"], id="enjoy"),
]


@pytest.mark.parametrize("script,flags,expect", LONG_PATH_CASES)
def test_path_too_long(world, tmp_path, script, flags, expect):
    td = long_train_dir(tmp_path)
    assert len(str(td / LONG_NAME)) > 4096
    before = snapshot(tmp_path)
    tiny = TINY if script == "train.py" else []
    res = run(script, ["--env", "test_corridor", "--experiment", LONG_NAME, "--train_dir", td, *tiny, *flags],
              cwd=tmp_path)
    assert_error(res, 1, [*expect, LONG_NAME])
    assert_unchanged(before, tmp_path, res)  # nothing was created on the way


CRASH_LINE = ["learner crashed: sf.learning.checkpoint.CheckpointError: cannot write checkpoint ",
              "No space left on device (traceback in "]


def check_disk_full_run(res: Result, exp: Path, ckpt_before: dict) -> None:
    """exit 1, one line naming the checkpoint that could not be written and the log holding the traceback; the
    traceback in sf_log.txt only; the checkpoints there before are byte-identical, no temporary file is left."""
    problems = error_problems(res, 1, [CRASH_LINE[0] + str(exp / "checkpoint_p0") + "/", CRASH_LINE[1],
                                       f"(traceback in {exp / 'sf_log.txt'})"], phase="run")
    log = (exp / "sf_log.txt").read_text(errors="replace")
    if "Traceback" not in log or "CheckpointError" not in log:
        problems.append("the traceback is not in sf_log.txt")
    ckpt_after = snapshot(exp / "checkpoint_p0")
    if ckpt_after != ckpt_before:
        problems.append(f"checkpoint_p0 changed: {snapshot_diff(ckpt_before, ckpt_after)}")
    try:
        json.loads((exp / "config.json").read_text())
    except ValueError as e:
        problems.append(f"config.json is not valid JSON any more: {e}")
    assert not problems, "; ".join(problems) + "\n" + res.show()


def test_disk_full_new_experiment(world, tmpfs, tmp_path):
    """A 2 MiB train_dir and a model whose checkpoint does not fit: the learner's save fails at the end of the run."""
    td = tmpfs(tmp_path / "td", "2m")
    args = ["--env", "test_corridor", "--experiment", "big", "--train_dir", td, *TINY, "--rnn_size", "512",
            "--hidden_size", "512", "--train_for_env_steps", "1"]
    res = run("train.py", args, cwd=tmp_path, timeout=180, safe=False)
    check_disk_full_run(res, td / "big", {})


def _disk_full_resume(world, tmpfs, tmp_path, leave: int, pad_log_to: int | None = None):
    td = tmpfs(tmp_path / "td", "1m")
    exp = td / "exp"
    shutil.copytree(world.exp, exp, symlinks=True)
    if pad_log_to:
        with open(exp / "sf_log.txt", "a") as f:
            f.write("#" * (pad_log_to - (exp / "sf_log.txt").stat().st_size - 1) + "\n")
    fill(td, leave)
    ckpt_before = snapshot(exp / "checkpoint_p0")
    res = run("train.py", ["--env", "test_corridor", "--experiment", "exp", "--train_dir", td, *beyond(exp)],
              cwd=tmp_path, timeout=180, safe=False)
    return td, exp, ckpt_before, res


def test_disk_full_during_resumed_run(world, tmpfs, tmp_path):
    """The disk fills up during a resumed run: room for config.json, the log and the event file, not for a checkpoint.
    The previous checkpoint is intact and still loads."""
    leave = 32 * 1024  # room for the log and the event file of a slow run too, not for a checkpoint
    assert min(p.stat().st_size for p in (world.exp / "checkpoint_p0").glob("*.pth")) > leave + 8192
    td, exp, ckpt_before, res = _disk_full_resume(world, tmpfs, tmp_path, leave=leave)
    check_disk_full_run(res, exp, ckpt_before)
    latest = sorted((exp / "checkpoint_p0").glob("checkpoint_*.pth"))[-1]
    version = int(latest.name.split("_")[1])
    res = run("enjoy.py", ["--env", "test_corridor", "--experiment", "exp", "--train_dir", td], cwd=tmp_path)
    assert res.rc == 0 and f"Loaded latest checkpoint: policy version {version}," in res.out, res.show()
    assert "Traceback" not in res.console, res.show()


def test_disk_full_event_file(world, tmpfs, tmp_path):
    """The log takes the last free page (it is padded to end just below a page boundary), so the TensorBoard event
    file cannot be written either: still one line on the console, no traceback. (One page more is left for the
    experiment's lock file beside it, which holds the runner's pid, and the pages of config.json's new copy.)"""
    config_pages = -(-(world.exp / "config.json").stat().st_size // 4096)
    td, exp, ckpt_before, res = _disk_full_resume(world, tmpfs, tmp_path, leave=(1 + config_pages) * 4096,
                                                  pad_log_to=4090)
    check_disk_full_run(res, exp, ckpt_before)


def test_disk_full_before_the_run(world, tmpfs, tmp_path):
    """No space at all: config.json cannot be written; exit 1 in one line, the experiment byte-identical."""
    td = tmpfs(tmp_path / "td", "1m")
    exp = td / "exp"
    shutil.copytree(world.exp, exp, symlinks=True)
    fill(td, 0)
    before = snapshot(tmp_path)
    res = run("train.py", ["--env", "test_corridor", "--experiment", "exp", "--train_dir", td, *beyond(exp)],
              cwd=tmp_path)
    assert_error(res, 1, [f"cannot write {exp / 'config.json'}: No space left on device"])
    assert_unchanged(before, tmp_path, res)
