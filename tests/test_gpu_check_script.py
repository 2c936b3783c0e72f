"""benchmarks/gpu_check.sh, the one-call proof of the GPU path, in its CPU dry-run (--device cpu): the same stages on
the CPU, so that the script a GPU machine runs rarely cannot rot here. It passes, with a PASS or a SKIP with its reason
for every stage in DIR/summary.txt, a log per stage and the logs packed in one file; a stage that fails for real (a run
handed an env that does not exist) fails the script, and the stages after it still run; bad arguments are one line."""
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from e2e_helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STAGES = ["setup", "fork_proof", "train", "pytest_unit", "resume_cpu", "resume_cuda", "pbt", "enjoy", "eval", "export",
          "pytest_e2e", "learner_bench", "system_bench"]
LINE = re.compile(r"^(PASS|FAIL|SKIP) (\S+) +(\d+)s  (.*)$")


def run_check(out_dir, *args, env=None, timeout=540):
    # this interpreter: the one CI set up, whatever .venv/bin/python is
    full_env = {**os.environ, "SF_CHECK_PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), str(out_dir), "--device", "cpu", *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=ROOT)


def summary(out_dir) -> dict:
    """stage -> (status, seconds, key figure), in the file's order; the result line under "#result"."""
    rows = {}
    for line in (out_dir / "summary.txt").read_text().splitlines():
        if line.startswith("# result: "):
            rows["#result"] = line[len("# result: "):]
        elif not line.startswith("#"):
            m = LINE.match(line)
            assert m, f"a summary line not `STATUS stage seconds figure`: {line!r}"
            rows[m.group(2)] = (m.group(1), int(m.group(3)), m.group(4))
    return rows


@pytest.mark.e2e
@pytest.mark.doom
@pytest.mark.serial  # its stages' time limits are a quiet machine's (a bare GPU machine's): alone, not beside 4 tests
def test_cpu_dry_run_passes_every_stage(tmp_path):
    pytest.importorskip("vizdoom")
    out = tmp_path / "check"
    # the any-device e2e tests restricted to one (-k export: their whole set is make gpu-rehearsal's); the benchmarks
    # skipped (--stages: their figures are the GPU's)
    res = run_check(out, "--stages", ",".join(s for s in STAGES if not s.endswith("_bench")),
                    env={"SF_CHECK_PYTEST_K": "export"})
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-4000:]
    rows = summary(out)
    assert [s for s in rows if s != "#result"] == STAGES, rows
    for stage in STAGES:
        status, _, figure = rows[stage]
        assert status in ("PASS", "SKIP") and figure.strip(), (stage, rows[stage], text[-3000:])
        if status == "SKIP":  # only a benchmark: the stages that prove something all ran
            assert stage.endswith("_bench") and figure.startswith("not selected"), (stage, figure)
        assert (out / f"{stage}.log").is_file() or status == "SKIP", stage
    assert rows["#result"].startswith("PASS")
    assert "on cpu" in rows["resume_cpu"][2] and "resumed at policy version" in rows["resume_cpu"][2]
    assert re.search(r"restarted after [0-9.]+ s, [1-9]\d* PBT decisions, run exit code 0", rows["pbt"][2])
    assert "every policy trained" in rows["pbt"][2]  # ended by its frames, not by its time cap
    assert re.search(r"policy version [1-9]\d*, 0 of [1-9]\d* optimizer steps skipped, weights changed",
                     rows["train"][2])
    assert re.search(r"trained on cpu .*loss [0-9.]+ -> [0-9.]+", rows["fork_proof"][2])
    with tarfile.open(out / "logs.tar.gz") as tar:
        packed = {os.path.basename(n) for n in tar.getnames()}
    assert {"summary.txt", "pbt.log", "pytest_unit.xml", "pytest_e2e.xml"} <= packed


@pytest.mark.e2e
@pytest.mark.doom
def test_a_failed_stage_fails_the_script_and_the_next_stages_still_run(tmp_path):
    """The pbt stage's train.py is handed an env that does not exist (SF_CHECK_PBT_ARGS, appended to its command: the
    last --env wins), so it fails for real: exit status 1, FAIL with train.py's own one-line error, and the stage
    after it still runs and passes. (A read-only directory would not do: tests run as root here.) Three stages only:
    the dry run of every stage is the test above."""
    pytest.importorskip("vizdoom")
    out = tmp_path / "check"
    res = run_check(out, "--stages", "fork_proof,pbt,learner_bench",
                    env={"SF_CHECK_PBT_ARGS": "--env doom_no_such_env"})
    text = res.stdout + res.stderr
    assert res.returncode == 1, text[-4000:]
    rows = summary(out)
    status, _, figure = rows["pbt"]
    assert status == "FAIL" and "run exit code 2" in figure and "doom_no_such_env" in figure, rows["pbt"]
    for stage in ("fork_proof", "learner_bench"):
        assert rows[stage][0] == "PASS", (stage, rows[stage], text[-3000:])
    assert rows["setup"][0] == "SKIP" and "not selected" in rows["setup"][2]
    assert rows["#result"].startswith("FAIL: 2 passed, 1 failed")


def test_bad_arguments_are_one_line(tmp_path):
    for args, why in (([], "DIR is required"), ([str(tmp_path), "--device", "tpu"], "--device tpu"),
                      ([str(tmp_path), "--stages", "nope"], "unknown stage nope"),
                      ([str(tmp_path), "--seconds", "0"], "--seconds 0")):
        res = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert res.returncode == 2 and why in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        if args:  # DIR given: the summary says it too, before the exit
            rows = summary(tmp_path)
            assert rows["setup"][0] == "FAIL" and why in rows["setup"][2] and rows["#result"].startswith("FAIL")


def test_no_python_with_torch_is_a_summary_too(tmp_path):
    """A Python that cannot import torch (here one that does not exist): FAIL setup in the summary, exit code 1."""
    res = subprocess.run(["bash", str(SCRIPT), str(tmp_path), "--device", "cpu"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env=dict(os.environ, SF_CHECK_PYTHON="/nonexistent/python3"))
    assert res.returncode == 1, res.stdout + res.stderr
    rows = summary(tmp_path)
    assert rows["setup"][0] == "FAIL" and "no Python that imports torch (/nonexistent/python3" in rows["setup"][2]


SKIP_EVERY_STEP = '''import torch.nn.utils as u
_clip = u.clip_grad_norm_
def _inf(*args, **kwargs):  # a device whose every gradient is non-finite: the learner skips every optimizer step
    _clip(*args, **kwargs)
    import torch
    return torch.tensor(float("inf"))
u.clip_grad_norm_ = _inf
'''


@pytest.mark.e2e
@pytest.mark.doom
def test_a_run_that_skips_every_step_fails_the_train_stage(tmp_path):
    """train.py exits 0 when the optimizer skipped every step (a non-finite gradient each time, here forced through a
    sitecustomize on PYTHONPATH that every process of the run imports): the train stage must fail, saying so."""
    pytest.importorskip("vizdoom")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SKIP_EVERY_STEP)
    out = tmp_path / "check"
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    res = run_check(out, "--stages", "train", env={"PYTHONPATH": path})
    assert res.returncode == 1, (res.stdout + res.stderr)[-3000:]
    status, _, figure = summary(out)["train"]
    assert status == "FAIL" and "train.py exit code 0 but not trained: policy version 0" in figure, figure
    assert re.search(r"every optimizer step skipped \(([1-9]\d*) of \1\)", figure), figure
    assert "non-finite train/grad_norm" in figure, figure  # (the weights' digest moved: the input normalizer learns)


def _wheel(path, name: str, version: str) -> None:
    """A minimal pure-Python wheel of package `name` (a module printing nothing) at `path`."""
    import base64
    import hashlib
    import zipfile
    files = {f"{name}/__init__.py": b"",
             f"{name}-{version}.dist-info/METADATA": (f"Metadata-Version: 2.1\nName: {name}\n"
                                                      f"Version: {version}\n").encode(),
             f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                  b"Tag: py3-none-any\n"}
    record = "".join(f"{f},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},"
                     f"{len(b)}\n" for f, b in files.items()) + f"{name}-{version}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, b in files.items():
            z.writestr(f, b)
        z.writestr(f"{name}-{version}.dist-info/RECORD", record)


def test_a_refused_wheel_is_named_and_the_others_install(tmp_path):
    """The setup stage installs the bundle's wheels one pip call each: a broken wheel is named in its line (REFUSED)
    and the good one beside it is installed all the same. Into a throwaway venv that sees this one's packages (a .pth
    adding its site-packages), not into the environment the tests run in."""
    import sysconfig
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "zz_test_parent.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    _wheel(bundle / "wheels" / "sfcheckgood-1.0-py3-none-any.whl", "sfcheckgood", "1.0")
    (bundle / "wheels" / "sfcheckbroken-1.0-py3-none-any.whl").write_bytes(b"not a zip file")
    out = tmp_path / "check"
    res = run_check(out, "--stages", "setup", env={"SF_CHECK_PYTHON": str(py), "SF_GPU_BUNDLE": str(bundle)},
                    timeout=300)
    status, _, figure = summary(out)["setup"]
    assert "WHEELS REFUSED" in figure and "sfcheckbroken-1.0-py3-none-any.whl" in figure, (figure, res.stdout[-2000:])
    assert "sfcheckgood-1.0" in figure.split("WHEELS REFUSED")[0], figure  # installed, named in "wheels installed"
    assert subprocess.run([str(py), "-c", "import sfcheckgood"]).returncode == 0
    assert "REFUSED: sfcheckbroken-1.0-py3-none-any.whl" in (out / "setup.log").read_text()
    assert status == "FAIL" and res.returncode == 1, (status, res.returncode, figure)


@pytest.mark.e2e
@pytest.mark.doom
def test_a_stage_past_the_budget_is_stopped_and_the_rest_reported(tmp_path):
    """A train stage that would run for hours (SF_CHECK_TRAIN_ARGS: no frame limit, a day of seconds) under a 45-s
    budget: `timeout` stops it at the deadline (FAIL "timed out"), the stage after it finds no time left (FAIL "not
    run"), the script ends within the budget and a few seconds with its result line, and no process of the run is
    left behind."""
    import psutil
    pytest.importorskip("vizdoom")
    out = tmp_path / "check"
    res = run_check(out, "--stages", "train,enjoy", "--budget", "45",
                    env={"SF_CHECK_TRAIN_ARGS": "--train_for_env_steps 100000000000 --train_for_seconds 86400"},
                    timeout=180)
    rows = summary(out)
    status, took, figure = rows["train"]
    limit = re.search(r"timed out \(limit (\d+) s\)", figure)
    assert status == "FAIL" and limit and int(limit.group(1)) <= 45, (rows["train"], res.stdout[-2000:])
    assert took <= int(limit.group(1)) + 15, took  # (its processes get 10 s to stop in order, then SIGKILL)
    assert rows["enjoy"][0] == "FAIL" and "not run" in rows["enjoy"][2], rows["enjoy"]
    assert rows["#result"].startswith("FAIL: 0 passed, 2 failed") and res.returncode == 1, rows["#result"]
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(out) in part for part in (p.info["cmdline"] or [])):
                left.append(p.info["cmdline"])
        except psutil.Error:
            pass
    assert not left, left
