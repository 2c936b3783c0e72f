#!/usr/bin/env bash
# Prove the GPU path in one device call (default budget 480 s: a 10-minute call with margin for the machine's start and
# the transfers) on a borrowed, bare GPU machine; or, with --device cpu, the same stages on the CPU (CI's dry-run,
# tests/test_gpu_check_script.py; `make gpu-rehearsal`: with the GPU machine's Python and torch, from a bundle).
#
#     bash benchmarks/gpu_check.sh DIR [--device cuda|cpu] [--workers N] [--seconds S] [--policies N] [--budget S]
#                                      [--env ENV] [--stages a,b,...]
#
# One deadline: --budget seconds for everything; the stages run most decisive first, each under the least of its own
# cap and what the budget has left (`timeout`: SIGTERM 5 s before, SIGKILL at it: FAIL "timed out"); a stage that
# proves something and finds under 15 s left is FAIL "not run"; a failed stage does not stop the later ones.
# A summary whatever happens: DIR/summary.txt's header and, for bad arguments (exit code 2) or no Python that imports
# torch (exit code 1), a FAIL setup line are written before any exit; a signal to the script ends it with the stage
# it stopped and a result line. Exit code 1 if any stage failed. Stages:
#   setup        logs the environment (nvidia-smi, versions, ulimit -n, df /dev/shm, CUDA/NCCL variables); installs
#                from the bundle benchmarks/gpu_bundle.sh made (SF_GPU_BUNDLE, default .gpu_bundle; its absence is
#                named as such) each wheel whose package the Python lacks, one pip call per wheel (--no-index
#                --no-deps; a refused wheel is named, the rest go on; a read-only environment: DIR/work/site on
#                PYTHONPATH); the C++ queue (the bundle's build for this Python, else built in place); the Doom
#                scenarios; then imports everything, and on CUDA warms cuDNN with a convolution (its time reported)
#   fork_proof   benchmarks/fork_cuda_proof.py: a worker forked from the runner's fork server trains on the device
#   train        train.py on ENV (doom_battle; cpu: doom_basic) for S s (60; cpu: until 4096 env frames, S a cap),
#                an nvidia-smi snapshot; PASS needs exit 0, the device, and a run that trained (sf.utils.trained:
#                policy version > 0, not every optimizer step skipped, weights changed, finite losses)
#   pytest_unit  pytest tests/gpu -m "not e2e" (in-process), each test under its own limit (pytest-timeout), -rA,
#                DIR/pytest_unit.xml; 0 failed, 0 skipped but for more GPUs than there are (cpu: "CUDA only" too)
#   resume_cpu, resume_cuda   the experiment resumed on the CPU, then on the device, until two more batches
#   pbt          N policies (8) with PBT until every policy trained twice the PBT period (its own schedule; the time
#                a cap), a policy worker SIGKILLed once frames are reported: PASS needs its restart, a PBT decision,
#                exit code 0
#   enjoy, eval, export   of the train stage's checkpoint, without --device (auto: CUDA where there is one)
#   pytest_e2e   pytest tests/gpu -m e2e (cpu: and any_device; SF_CHECK_PYTEST_K narrows it), 4 processes with
#                pytest-xdist on CUDA, the trained fixture made once for all; per-test limit, -rA, DIR/pytest_e2e.xml
#   learner_bench, system_bench   learner_step.py and system_throughput.py, only in what the budget has left
#
# Output: DIR/summary.txt (a line per stage: `PASS|FAIL|SKIP stage seconds key-figure`; lines starting with # are
# the header and the result), DIR/<stage>.log, DIR/pytest_*.xml, DIR/train_nvidia_smi.log, DIR/logs.tar.gz (all of
# them in one file: a device call brings back at most 8 files); experiments and installed wheels under DIR/work.
# Settings: SF_CHECK_PYTHON (default: the first of .venv/bin/python and python3 that imports torch), SF_GPU_BUNDLE,
# SF_CHECK_<STAGE>_ARGS (more arguments for that stage's command, e.g. SF_CHECK_PBT_ARGS="--env no_such_env" breaks
# the pbt stage for real: how the CI test shows a failed stage failing the script), SF_CHECK_PYTEST_K.
set -uo pipefail  # no -e: a failed stage is recorded and the next one runs
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
called_from=$PWD  # DIR, SF_GPU_BUNDLE and SF_CHECK_PYTHON given relative are relative to it
cd "$(dirname "$self")/.."

STAGES=(setup fork_proof train pytest_unit resume_cpu resume_cuda pbt enjoy eval export pytest_e2e learner_bench
        system_bench)
GPU_SKIP_OK='needs [0-9]+ GPUs|needs a GPU per rank'  # the only skips allowed on the GPU: more GPUs than there are

die() { echo "gpu_check.sh: error: $*" >&2; exit 2; }
last_line() { grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -1 | cut -c1-220; }
# the line that says why a command failed: an entry point's one-line error or a traceback's last line (error_line);
# else the last line (why_failed)
error_line() {
    grep -E '^[A-Za-z_./ -]*: error: |^[A-Za-z_.]*(Error|Exception): ' "$1" 2>/dev/null | tail -1 | cut -c1-220
}
why_failed() {
    local w
    w=$(error_line "$1")
    echo "${w:-$(last_line "$1")}"
}
result() {  # STATUS FIGURE: the stage's verdict, read by the main script
    echo "$1|$2" >"$SFC_WORK/$SFC_STAGE.result"
    echo "gpu_check: $SFC_STAGE: $1: $2"
}
extra_args() { local v="SF_CHECK_$(echo "$SFC_STAGE" | tr '[:lower:]' '[:upper:]')_ARGS"; echo "${!v:-}"; }
fit() { local s=$(( SFC_LIMIT - 30 )); [ "$s" -lt 5 ] && s=5; echo $(( $1 < s ? $1 : s )); }  # seconds in the limit
ran_on() { grep -qE "Experiment .*: env [A-Za-z0-9_]+, device $1\b" "$2"; }
# key figures of a train.py log: "N frames/s, policy lag avg L"
train_figures() {
    local fps lag
    fps=$(grep -oE 'Done: .*\(([0-9.]+) frames/s\)' "$1" | tail -1 | grep -oE '[0-9.]+ frames/s')
    lag=$(grep -oE 'Policy lag \(min: [0-9.na]+, avg: [0-9.na]+' "$1" | tail -1 | grep -oE '[0-9.na]+$')
    echo "${fps:-no final frames/s}, policy lag avg ${lag:-?}"
}

# ------------------------------------------------------------------------------------------------------------------
# the stages: each runs in a process of its own (this script, --internal-stage NAME) under `timeout`, its output in
# DIR/<stage>.log, its verdict in DIR/work/<stage>.result

stage_setup() {
    echo "python: $SFC_PY ($("$SFC_PY" -V 2>&1)); device $SFC_DEVICE; bundle: $SFC_BUNDLE"
    log_environment
    local envsh="$SFC_WORK/env.sh" site="$SFC_WORK/site" need=() how=() refused=() w dist
    : >"$envsh"
    if [ -d "$SFC_BUNDLE/wheels" ]; then
        for w in "$SFC_BUNDLE"/wheels/*.whl; do  # the wheel's distribution name is its file name up to the first -
            dist=$(basename "$w" | cut -d- -f1)
            "$SFC_PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null \
                || need+=("$w")
        done
    else
        how+=("NO BUNDLE at $SFC_BUNDLE (make gpu-bundle, carry .gpu_bundle)")
    fi
    if [ ${#need[@]} -gt 0 ]; then
        local pip=("$SFC_PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile
                   --no-cache-dir) purelib target=() installed=()
        # into the Python's own environment (a borrowed machine is thrown away after the call): there every process
        # sees them, also the tests' train.py runs that set a PYTHONPATH of their own (tests/e2e_helpers.start_train)
        purelib=$("$SFC_PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        if [ ! -w "$purelib" ]; then  # a read-only environment: beside it, on PYTHONPATH
            target=(--target "$site")
            echo "export PYTHONPATH=\"$site\${PYTHONPATH:+:\$PYTHONPATH}\"" >>"$envsh"
        fi
        echo "installing ${#need[@]} wheels, each on its own, into ${target[1]:-$purelib}"
        for w in "${need[@]}"; do  # one refused wheel (another Python's, a broken file) leaves the others installed
            if "${pip[@]}" "${target[@]}" "$w"; then installed+=("$(basename "$w" | cut -d- -f1-2)")
            else refused+=("$(basename "$w")"); echo "REFUSED: $(basename "$w")"; fi
        done
        how+=("wheels installed${target[*]:+ on PYTHONPATH}: ${installed[*]:-none}")
        [ ${#refused[@]} -eq 0 ] || how+=("WHEELS REFUSED by $("$SFC_PY" -V 2>&1): ${refused[*]}")
    else
        how+=("no wheel needed")
    fi
    # shellcheck disable=SC1090
    . "$envsh"
    if "$SFC_PY" -c "import sf.ipc._cqueue" 2>/dev/null; then
        how+=("C++ queue already built")
    else
        local suffix
        suffix=$("$SFC_PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
        if [ -f "$SFC_BUNDLE/cqueue/_cqueue$suffix" ] && cp "$SFC_BUNDLE/cqueue/_cqueue$suffix" sf/ipc/ \
            && "$SFC_PY" -c "import sf.ipc._cqueue"; then
            how+=("C++ queue from the bundle")
        else  # the bundle's build does not load here (or there is none): build it in place, if a compiler is there
            echo "the bundle has no loadable _cqueue$suffix: building it in place (setup.py build_ext --inplace)"
            if "$SFC_PY" setup.py -q build_ext --inplace && "$SFC_PY" -c "import sf.ipc._cqueue"; then
                how+=("C++ queue built in place")
            else
                how+=("C++ QUEUE sf.ipc._cqueue NEITHER IN THE BUNDLE FOR $suffix NOR BUILT")
            fi
        fi
    fi
    if [ -z "${SF_DOOM_SCENARIOS:-}" ] && [ ! -f data/doom_scenarios/battle.wad ] \
        && [ -d "$SFC_BUNDLE/doom_scenarios" ]; then
        # where make setup puts them (git-ignored): every process finds them there, whatever environment it is given
        if mkdir -p data/doom_scenarios && cp -n "$SFC_BUNDLE"/doom_scenarios/* data/doom_scenarios/; then
            how+=("Doom scenarios from the bundle (into data/doom_scenarios)")
        else
            how+=("CANNOT COPY the bundle's Doom scenarios into data/doom_scenarios")
        fi
    else
        how+=("Doom scenarios in ${SF_DOOM_SCENARIOS:-data/doom_scenarios}")
    fi
    local versions state
    state=$(IFS=';'; echo "${how[*]}" | sed 's/;/; /g')
    versions=$("$SFC_PY" - "$SFC_DEVICE" <<'EOF'
import sys
import time
import numpy, torch, vizdoom, gymnasium, tensorboardX, psutil, tqdm  # noqa: F401  (what a bare GPU image may lack)
import sf.ipc._cqueue  # noqa: F401
from sf_envs.doom.fetch_scenarios import scenarios_dir
if not (scenarios_dir() / "battle.wad").is_file():
    sys.exit(f"no Doom scenario data in {scenarios_dir()} (doom_battle needs it)")
where = "no GPU asked for"
if sys.argv[1] == "cuda":
    if not torch.cuda.is_available():
        sys.exit(f"torch {torch.__version__} sees no CUDA device")
    # a cold cuDNN load and its first convolution take seconds: here, not inside a later stage's limit
    t = time.monotonic()
    conv = torch.nn.Conv2d(3, 32, 8, stride=4).cuda()
    conv(torch.randn(32, 3, 72, 128, device="cuda", requires_grad=True)).square().mean().backward()
    torch.cuda.synchronize()
    where = (f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
             f"{torch.cuda.device_count()} GPU, first convolution {time.monotonic() - t:.1f} s)")
print(f"torch {torch.__version__}, numpy {numpy.__version__}, vizdoom {vizdoom.__version__}, {where}")
EOF
    ) || { result FAIL "$(why_failed "$SFC_LOG"); $state"; return; }
    echo "$versions"
    if [ ${#refused[@]} -gt 0 ]; then result FAIL "$versions; $state"; else result PASS "$versions; $state"; fi
}

# what decides whether a run can work on this machine, into the setup stage's log (nvidia-smi, versions, limits)
log_environment() {
    echo "--- environment"
    if command -v nvidia-smi >/dev/null; then nvidia-smi || echo "nvidia-smi failed (exit code $?)"
    else echo "nvidia-smi: not found"; fi
    "$SFC_PY" - <<'EOF' || echo "python: the versions could not be read"
import importlib.metadata as m, platform, sys
names = ("torch", "numpy", "pytest", "pytest-timeout", "pytest-xdist", "vizdoom", "gymnasium", "tensorboardX",
         "tensorboard", "onnx", "onnxruntime", "opencv-python-headless", "psutil")
def version(n):
    try:
        return m.version(n)
    except m.PackageNotFoundError:
        return "absent"
print(f"python {platform.python_version()} ({sys.executable}); " + ", ".join(f"{n} {version(n)}" for n in names))
EOF
    echo "ulimit -n $(ulimit -n); ulimit -u $(ulimit -u); nproc $(nproc); $(free -g | awk '/Mem:/ {print $2 " GiB memory"}')"
    df -h /dev/shm /tmp 2>&1 | sed 's/^/df: /'
    env | grep -E '^(CUDA|NCCL|TORCH|PYTORCH|CUBLAS|CUDNN|LD_LIBRARY_PATH|OMP_|MKL_)' | sed 's/^/env: /' \
        || echo "env: no CUDA/NCCL/TORCH variables set"
    echo "---"
}

stage_fork_proof() {
    # shellcheck disable=SC2046
    "$SFC_PY" benchmarks/fork_cuda_proof.py --device "$SFC_DEVICE" --env "$SFC_ENV" --timeout $((SFC_LIMIT - 15)) \
        $(extra_args)
    local rc=$? line
    line=$(grep '^fork proof: ' "$SFC_LOG" | tail -1 | sed -E 's/^fork proof: (PASS|FAIL): //')
    if [ $rc -eq 0 ]; then result PASS "$line"; else result FAIL "${line:-$(why_failed "$SFC_LOG")}"; fi
}

# pytest on tests/gpu, one part: $1 = unit (in-process: not e2e) or e2e (tests that start train.py & co.); each test
# under its own limit (pytest-timeout, $2 s), every outcome listed (-rA), a junit file DIR/pytest_$1.xml
pytest_part() {
    local part=$1 per_test=$2 args=(-m pytest tests/gpu -rA -q -p no:cacheprovider --junitxml="$SFC_OUT/pytest_$1.xml")
    local mark; mark=$([ "$part" = e2e ] && echo "e2e" || echo "not e2e")
    local skip_ok=$GPU_SKIP_OK
    if [ "$SFC_DEVICE" = cpu ]; then  # the tests that hold on either device, on the CPU; the others skip: CUDA only
        export SF_GPU_TESTS_DEVICE=cpu
        skip_ok="$skip_ok|CUDA only"
        [ "$part" = e2e ] && mark="e2e and any_device" && [ -n "${SF_CHECK_PYTEST_K:-}" ] \
            && args+=(-k "$SF_CHECK_PYTEST_K")
    elif [ "$part" = e2e ] && "$SFC_PY" -c "import xdist" 2>/dev/null; then
        args+=(-n 4)  # pytest-xdist; 16 cores and one GPU: the tests' processes overlap well within the stage's limit
    fi
    args+=(-m "$mark")
    if "$SFC_PY" -c "import pytest_timeout" 2>/dev/null; then args+=(--timeout "$per_test")
    else echo "pytest-timeout absent: no per-test limit (the stage's limit holds)"; fi
    # shellcheck disable=SC2046
    "$SFC_PY" "${args[@]}" $(extra_args)
    local rc=$? counts bad_skips ok_skips timeouts
    counts=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error|deselected)' "$SFC_LOG" | tail -1 \
        | sed -E 's/=+//g; s/^ +| +$//g')
    bad_skips=$(grep -E '^SKIPPED \[' "$SFC_LOG" | grep -vE "$skip_ok")
    ok_skips=$(grep -E '^SKIPPED \[' "$SFC_LOG" | grep -E "$GPU_SKIP_OK" | grep -oE 'tests/[^:]+:[0-9]+' | tr '\n' ' ')
    timeouts=$(grep -oE '^FAILED [^ ]+' "$SFC_LOG" | cut -d' ' -f2 | while read -r t; do
        grep -q "Timeout" <(grep -A2 -F "$t" "$SFC_LOG") && echo "${t##*::}"; done | tr '\n' ' ')
    local figure="${counts:-no result line}${ok_skips:+; skipped, needing more GPUs than there are: $ok_skips}"
    if [ $rc -eq 5 ]; then
        result FAIL "no test selected (pytest exit code 5): ${counts:-no result line}"
    elif [ $rc -ne 0 ]; then
        result FAIL "pytest exit code $rc: $figure; failed: $(grep -oE '^(FAILED|ERROR) [^ ]+' "$SFC_LOG" \
            | sed -E 's/^[A-Z]+ //; s/.*:://' | head -5 | tr '\n' ' ')${timeouts:+; past ${per_test} s: $timeouts}"
    elif [ -n "$bad_skips" ]; then
        result FAIL "skipped tests (none may be, but for more GPUs):" \
            "$(echo "$bad_skips" | head -3 | cut -c1-150 | tr '\n' ' ')"
    else
        result PASS "$figure"
    fi
}
stage_pytest_unit() { pytest_part unit "$SFC_UNIT_TIMEOUT"; }
stage_pytest_e2e() { pytest_part e2e "$SFC_E2E_TIMEOUT"; }

# train.py on the stage's experiment in DIR/work/td; the rest of its flags in "$@"
train() {
    # shellcheck disable=SC2046
    "$SFC_PY" train.py --env "$SFC_ENV" --train_dir "$SFC_WORK/td" --report_interval_sec 5 "$@" $(extra_args)
}

stage_train() {
    train --experiment gpu_check --restart_behavior overwrite --device "$SFC_DEVICE" --num_workers "$SFC_WORKERS" \
        --train_for_seconds "$(fit "$SFC_SECONDS")" ${SFC_TRAIN_FRAMES:+--train_for_env_steps "$SFC_TRAIN_FRAMES"} \
        --save_every_sec 20 &
    local pid=$! snap=""
    if [ "$SFC_DEVICE" = cuda ]; then
        (  # the GPU's memory once the run reports: every process has made its CUDA context by then
            for _ in $(seq "$SFC_SECONDS"); do
                grep -q 'Fps is' "$SFC_LOG" && break
                kill -0 "$pid" 2>/dev/null || exit 0
                sleep 1
            done
            sleep 5
            kill -0 "$pid" 2>/dev/null || exit 0
            { nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv; nvidia-smi; } \
                >"$SFC_OUT/train_nvidia_smi.log" 2>&1
        ) &
        snap=$!
    fi
    wait $pid
    local rc=$? gpu=""
    [ -n "$snap" ] && wait "$snap"  # done within a few seconds of the run's end
    if [ "$SFC_DEVICE" = cuda ]; then
        gpu=$(sed -n 2p "$SFC_OUT/train_nvidia_smi.log" 2>/dev/null \
            | awk -F', ' '{print "GPU memory " $2 " of " $3 ", utilization " $4}')
        gpu=", ${gpu:-no nvidia-smi snapshot}"
    fi
    local trained
    # a run that exits 0 may still have trained nothing (every optimizer step skipped on the device): sf.utils.trained
    trained=$([ $rc -eq 0 ] && "$SFC_PY" -m sf.utils.trained "$SFC_LOG" "$SFC_WORK/td/gpu_check" 2>&1 | tail -1)
    if [ $rc -ne 0 ]; then
        result FAIL "train.py exit code $rc: $(why_failed "$SFC_LOG")"
    elif ! ran_on "$SFC_DEVICE" "$SFC_LOG"; then
        result FAIL "train.py exit code 0 but not on $SFC_DEVICE: $(grep -oE 'Experiment .*device [a-z:0-9]+' "$SFC_LOG")"
    elif [[ "$trained" != "trained: "* ]]; then
        result FAIL "train.py exit code 0 but ${trained:-no verdict from sf.utils.trained}"
    else
        result PASS "$SFC_ENV on $SFC_DEVICE, $SFC_WORKERS workers, ${SFC_TRAIN_FRAMES:+$SFC_TRAIN_FRAMES env frames or }\
${SFC_SECONDS} s: $(train_figures "$SFC_LOG"), \
${trained#trained: }$gpu"
    fi
}

resume_on() {
    local dev=$1 target
    # until two more training batches than the latest checkpoint holds (the seconds are the cap): the first SGD steps
    # on $dev after the checkpoint's optimizer state moved there are the point, and a slow machine still gets them
    target=$("$SFC_PY" - "$SFC_WORK/td/gpu_check" <<'EOF'
import json, re, sys
from pathlib import Path
exp = Path(sys.argv[1])
frames = [int(m.group(1)) for p in exp.glob("checkpoint_p0/checkpoint_*.pth")
          if (m := re.search(r"_(\d+)\.pth$", p.name))]
print(max(frames) + 2 * int(json.loads((exp / "config.json").read_text())["batch_size"]))
EOF
    ) || target=""
    echo "resume on $dev: until ${target:-?} env frames trained or $SFC_RESUME_SECONDS s"
    train --experiment gpu_check --restart_behavior resume --device "$dev" \
        --train_for_seconds "$(fit "$SFC_RESUME_SECONDS")" \
        ${target:+--train_for_env_steps "$target"}
    local rc=$? resumed final
    resumed=$(grep -oE 'Resumed from checkpoint: policy version [0-9]+, [0-9]+ env frames' "$SFC_LOG" | tail -1 \
        | cut -d: -f2-)
    final=$(grep -oE 'Final weights sha256: [0-9a-f]+ \(policy version [0-9]+' "$SFC_LOG" | tail -1 \
        | grep -oE 'version [0-9]+$')
    local note=""
    [ "$SFC_STAGE" = resume_cuda ] && [ "$dev" = cpu ] && note=" (--device cpu dry-run: on the CPU again)"
    local v0=${resumed#*version } v1=${final#version }
    v0=${v0%%,*}
    if [ $rc -eq 0 ] && [ -n "$resumed" ] && [ -n "$final" ] && ran_on "$dev" "$SFC_LOG" && [ "$v1" -gt "$v0" ]; then
        result PASS "on $dev$note: resumed at$resumed, ended at $final; $(train_figures "$SFC_LOG")"
    elif [ $rc -eq 0 ]; then
        local missing=()
        [ -n "$resumed" ] || missing+=("no 'Resumed from checkpoint' line")
        ran_on "$dev" "$SFC_LOG" || missing+=("not on $dev")
        [ -n "$final" ] || missing+=("no final weights")
        [ -z "$final" ] || [ -z "$resumed" ] || [ "$v1" -gt "$v0" ] \
            || missing+=("no SGD step after the resume (version $v0 -> $v1)")
        result FAIL "train.py exit code 0 but $(IFS=','; echo "${missing[*]}" | sed 's/,/, /g')"
    else
        result FAIL "train.py exit code $rc: $(why_failed "$SFC_LOG")"
    fi
}
stage_resume_cpu() { resume_on cpu; }
stage_resume_cuda() { resume_on "$SFC_DEVICE"; }

stage_pbt() {
    local victim=$((SFC_POLICIES / 2))
    # shellcheck disable=SC2046
    "$SFC_PY" - "$SFC_LOG" "$victim" "$SFC_POLICIES" -- \
        "$SFC_PY" train.py --env "$SFC_ENV" --train_dir "$SFC_WORK/td" --experiment gpu_check_pbt \
        --restart_behavior overwrite --device "$SFC_DEVICE" --num_workers "$SFC_WORKERS" \
        --num_policies "$SFC_POLICIES" \
        --with_pbt True --pbt_period_env_steps "$SFC_PBT_PERIOD" --pbt_start_mutation 0 \
        --train_for_env_steps $((2 * SFC_PBT_PERIOD)) --train_for_seconds "$(fit 100000)" --report_interval_sec 2 \
        $(extra_args) <<'EOF'
"""Start the PBT run, SIGKILL one policy worker once it reports frames, wait for its restart and the run's end. The run
ends when every policy has trained twice the PBT period (its own schedule: each crosses a PBT update at least once),
the time limit only a cap: the pass follows from what the run did, not from how fast the machine is."""
import re
import signal
import subprocess
import sys
import time

import psutil

from sf.processes.control import process_title
from sf.processes.shared_state import policy_worker_name

log_path, victim, num_policies = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cmd = sys.argv[sys.argv.index("--") + 1:]
name = policy_worker_name(victim, 0, num_policies)
title = process_title(name)  # what the worker calls itself (sf.processes.control.set_process_name)
print("pbt:", " ".join(cmd), flush=True)
start = time.monotonic()
# into this process's stdout, the stage's log (read below); stdin is this script
run = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def stop(signum, frame):
    """`timeout`'s SIGTERM reached the run too (one process group): it stops in order; wait for it."""
    try:
        run.wait(timeout=30)
    finally:
        sys.exit(128 + signum)


signal.signal(signal.SIGTERM, stop)


def text() -> str:
    with open(log_path, errors="replace") as f:
        return f.read()


def find() -> list:
    """The run's own process of that name: never another run's on a shared machine."""
    try:
        return [p for p in psutil.Process(run.pid).children(recursive=True) if p.name() == title]
    except psutil.Error:
        return []


killed = restarted = None
frames = []
while run.poll() is None:
    frames = [int(n) for n in re.findall(r"Total num frames: (\d+)", text())] or frames
    if killed is None and frames and frames[-1] > 0 and find():
        pid = find()[0].pid
        psutil.Process(pid).send_signal(signal.SIGKILL)
        killed = time.monotonic() - start
        print(f"pbt: SIGKILLed {title} (pid {pid}) at {killed:.0f} s, {frames[-1]} env frames", flush=True)
    if killed is not None and restarted is None and f"Restarted {name} (pid " in text():
        restarted = time.monotonic() - start
        print(f"pbt: {name} restarted {restarted - killed:.1f} s after the kill", flush=True)
    time.sleep(0.25)
out = text()
if restarted is None and f"Restarted {name} (pid " in out:
    restarted = time.monotonic() - start
decisions = len(re.findall(r"PBT: ", out))
faults = re.search(r"Faults: (\d+ restarts \([^)]*\))", out)
figure = (f"{num_policies} policies, {title} killed at {killed:.0f} s" if killed is not None else
          f"{num_policies} policies, {title} never killed: the run " +
          ("had no such process" if frames and frames[-1] > 0 else "ended before it reported frames"))
figure += (f", restarted after {restarted - killed:.1f} s" if restarted is not None and killed is not None
           else ", no restart line") + f", {decisions} PBT decisions, run exit code {run.returncode}"
figure += f"; faults: {faults.group(1)}" if faults else ""
trained = [int(f) for f in re.findall(r"Final weights sha256: [0-9a-f]+ \(policy \d+, version \d+, (\d+) env frames", out)]
target = int(cmd[cmd.index("--train_for_env_steps") + 1])
figure += (f"; every policy trained {min(trained)} >= {target} env frames" if trained and min(trained) >= target else
           f"; policies' env frames {min(trained) if trained else '?'} of {target}: the run ended on its time cap")
ok = run.returncode == 0 and killed is not None and restarted is not None and decisions > 0
print(f"pbt: {'PASS' if ok else 'FAIL'}: {figure}", flush=True)
sys.exit(0 if ok else 1)
EOF
    local rc=$? line
    line=$(grep -E '^pbt: (PASS|FAIL): ' "$SFC_LOG" | tail -1 | sed -E 's/^pbt: (PASS|FAIL): //')
    local err
    err=$(error_line "$SFC_LOG")
    if [ $rc -eq 0 ]; then result PASS "$line"; else result FAIL "${line:-exit code $rc}${err:+: $err}"; fi
}

stage_enjoy() {
    # shellcheck disable=SC2046
    "$SFC_PY" enjoy.py --env "$SFC_ENV" --experiment gpu_check --train_dir "$SFC_WORK/td" --no_render \
        --max_num_frames 2000 $(extra_args)
    local rc=$? loaded eps
    loaded=$(grep -oE 'Loaded .* on [a-z:0-9]+$' "$SFC_LOG" | tail -1)
    eps=$(grep -oE '^[0-9]+ episodes: reward mean [-0-9.]+' "$SFC_LOG" | tail -1)
    if [ $rc -eq 0 ] && [[ "$loaded" == *" on $SFC_DEVICE"* ]]; then
        result PASS "$loaded; ${eps:-no episode ended in 2000 frames}"
    else
        result FAIL "enjoy.py exit code $rc${loaded:+ ($loaded; expected on $SFC_DEVICE)}: $(why_failed "$SFC_LOG")"
    fi
}

stage_eval() {
    # shellcheck disable=SC2046
    # few envs: 4 episodes of doom_battle (up to 2100 frames each) end in seconds, not in the preset's 32 envs' time
    "$SFC_PY" -m sf.eval "$SFC_WORK/td/gpu_check" --episodes 4 --num_workers 2 --num_envs_per_worker 2 $(extra_args)
    local rc=$? rate on
    rate=$(grep -oE 'Evaluated [0-9]+ episodes \([0-9]+ env frames\) in [0-9.]+ s: [0-9]+ env frames/s' "$SFC_LOG" \
        | tail -1)
    on=$(grep -oE 'policy workers on [a-z:0-9]+' "$SFC_LOG" | tail -1)
    if [ $rc -eq 0 ] && [ -n "$rate" ] && [[ "$on" == *" $SFC_DEVICE"* ]]; then
        result PASS "$rate, $on"
    else
        result FAIL "python -m sf.eval exit code $rc${on:+ ($on; expected $SFC_DEVICE)}: $(why_failed "$SFC_LOG")"
    fi
}

stage_export() {
    # shellcheck disable=SC2046
    "$SFC_PY" -m sf.export "$SFC_WORK/td/gpu_check" $(extra_args)
    local rc=$? wrote
    wrote=$(grep -oE 'onnxruntime matches torch within [0-9.e+-]+' "$SFC_LOG" | tail -1)
    if [ $rc -eq 0 ] && [ -n "$wrote" ]; then result PASS "ONNX written, $wrote"
    else result FAIL "python -m sf.export exit code $rc: $(why_failed "$SFC_LOG")"; fi
}

stage_learner_bench() {
    local args=(--device "$SFC_DEVICE" --threads 1)
    if [ "$SFC_DEVICE" = cpu ]; then args+=(--iters 1 --warmup 0 --encoders convnet_simple --batch_size 256)
    else args+=(--iters 10 --warmup 3); fi
    # shellcheck disable=SC2046
    "$SFC_PY" benchmarks/learner_step.py "${args[@]}" $(extra_args)
    local rc=$? rows
    rows=$(grep -oE '^[a-z_]+ threads=[0-9]+ .*: APPO.train [0-9.]+ ms/batch \(median\), [0-9.]+ samples/s' "$SFC_LOG" \
        | sed -E 's/ threads=[0-9]+ encoder [a-z0-9.]+//; s/ \(median\)//; s/APPO.train //' | tr '\n' ';' \
        | sed 's/;$//; s/;/; /g')
    if [ $rc -eq 0 ] && [ -n "$rows" ]; then result PASS "$rows"
    else result FAIL "learner_step.py exit code $rc: $(why_failed "$SFC_LOG")"; fi
}

stage_system_bench() {
    # shellcheck disable=SC2046
    "$SFC_PY" benchmarks/system_throughput.py --envs "$SFC_ENV" --num_workers "$SFC_WORKERS" \
        --duration "$SFC_SYSTEM_DURATION" --modes train --device "$SFC_DEVICE" --rounds 1 $(extra_args)
    local rc=$? row
    row=$(grep -E '\| full training' "$SFC_LOG" | tail -1 | awk -F'|' '{gsub(/ +/, " ");
        print "full training" $3 "envs/worker:" $4 "frames/s, ratio to simulation" $5}')
    if [ $rc -eq 0 ] && [ -n "$row" ] && ! [[ "$row" == *nan* ]]; then result PASS "$SFC_SYSTEM_DURATION s: $row"
    else result FAIL "system_throughput.py exit code $rc: ${row:-$(why_failed "$SFC_LOG")}"; fi
}

if [ "${1:-}" = --internal-stage ]; then  # one stage, in the process `timeout` limits
    export SFC_STAGE=$2
    # `timeout` signals the whole group: train.py stops in order by itself; wait for it rather than orphan it (the
    # SIGKILL 5 s later ends whatever is left), so that no stage's processes overlap the next one's
    trap 'trap - TERM; wait; exit 143' TERM
    [ -f "$SFC_WORK/env.sh" ] && . "$SFC_WORK/env.sh"
    "stage_$2"
    exit 0
fi

# ------------------------------------------------------------------------------------------------------------------
# the main script: arguments, the stages in order, the summary

usage="usage: bash benchmarks/gpu_check.sh DIR [--device cuda|cpu] [--workers N] [--seconds S] [--policies N]"
usage+=" [--budget S] [--env ENV] [--stages a,b,...]"
out="" device=cuda workers="" seconds="" policies=8 budget="" env="" only="" bad=""
# a bad argument is one line and exit code 2; once DIR is known, also in DIR/summary.txt (header and FAIL setup)
complain() { [ -n "$bad" ] || bad="$*"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --device|--workers|--seconds|--policies|--budget|--env|--stages)
            if [ $# -lt 2 ]; then complain "$1 needs a value"; shift; continue; fi
            case "$1" in
                --device) device=$2;; --workers) workers=$2;; --seconds) seconds=$2;; --policies) policies=$2;;
                --budget) budget=$2;; --env) env=$2;; --stages) only=$2;;
            esac
            shift 2;;
        -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$self"; exit 0;;
        -*) complain "unknown option $1 ($usage)"; shift;;
        *) [ -z "$out" ] || complain "one DIR only, got $out and $1 ($usage)"; out=${out:-$1}; shift;;
    esac
done
[ -n "$out" ] || die "DIR is required ($usage)"  # nowhere to write a summary: the one line only
case "$out" in /*) ;; *) out="$called_from/$out";; esac
case "$device" in cuda|cpu) ;; *) complain "--device $device: expected cuda or cpu";; esac
for v in workers seconds policies budget; do
    [ -z "${!v}" ] || [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || complain "--$v ${!v}: expected a whole number >= 1"
done
for s in ${only//,/ }; do
    [[ " ${STAGES[*]} " == *" $s "* ]] || complain "--stages: unknown stage $s (stages: ${STAGES[*]})"
done
mkdir -p "$out" || die "cannot make $out"
out=$(cd "$out" && pwd)
# a rerun in the same DIR (--stages) keeps DIR/work: the experiments the later stages use, what setup installed there
rm -f "$out"/*.log "$out"/*.xml "$out/summary.txt" "$out/logs.tar.gz" "$out"/work/*.result
mkdir -p "$out/work"
summary=$out/summary.txt
start=$SECONDS failed=0 passed=0 skipped=0
reap_stage() {  # GROUP: what a stage left in its process group when `timeout` returned, stopped
    # timeout exits once the stage's shell is gone; on a time-out its SIGTERM also reached the stage's runs, and a
    # train.py then stops in order (a final checkpoint): they get 10 s more, then SIGKILL, before the next stage starts
    local waited=0
    while kill -0 -- "-$1" 2>/dev/null && [ $waited -lt 10 ]; do sleep 1; waited=$((waited + 1)); done
    kill -KILL -- "-$1" 2>/dev/null
    stage_group=""
}
record() {  # STATUS STAGE SECONDS FIGURE
    printf '%s %-13s %4ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$summary"
    case "$1" in PASS) passed=$((passed + 1));; FAIL) failed=$((failed + 1));; SKIP) skipped=$((skipped + 1));; esac
}
finish() {  # the result line, every log in one file (a device call brings back at most 8 files from $OUT), the exit
    local verdict; verdict=$([ $failed -eq 0 ] && echo PASS || echo FAIL)
    echo "# result: $verdict: $passed passed, $failed failed, $skipped skipped in $((SECONDS - start)) s" \
         "(budget ${budget:-?} s)" | tee -a "$summary"
    (cd "$out" && tar czf logs.tar.gz summary.txt ./*.log ./*.xml 2>/dev/null)
    echo "gpu_check: logs in $out (all in $out/logs.tar.gz); summary: $summary"
    exit "${1:-$([ $failed -eq 0 ] && echo 0 || echo 1)}"
}
echo "# gpu_check.sh --device $device on $(cat /proc/sys/kernel/hostname) ($(nproc) cores)," \
     "$(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)" | tee "$summary"
# killed from outside (the device call's own limit): the summary still ends with the stage it stopped and a result
trap 'trap - TERM INT; [ -n "${stage_group:-}" ] && kill -TERM -- "-$stage_group" 2>/dev/null && reap_stage "$stage_group"
      record FAIL "${stage:-setup}" 0 "interrupted by a signal (the call past its own limit?)"; finish 143' TERM INT
if [ -n "$bad" ]; then
    echo "gpu_check.sh: error: $bad" >&2
    record FAIL setup 0 "bad arguments: $bad"
    finish 2
fi

py=${SF_CHECK_PYTHON:-}
case "$py" in /*|"") ;; */*) py="$called_from/$py";; esac  # a bare name (python3) is looked up on the PATH
tried=${py:-.venv/bin/python, python3}
if [ -n "$py" ]; then
    "$py" -c "import torch" >"$out/work/python_check.txt" 2>&1 || py=""
else
    for c in .venv/bin/python python3; do
        if "$c" -c "import torch" >"$out/work/python_check.txt" 2>&1; then py=$c; break; fi
    done
fi
if [ -z "$py" ]; then
    record FAIL setup 0 "no Python that imports torch ($tried: $(tail -1 "$out/work/python_check.txt" 2>/dev/null \
        | cut -c1-120)); set SF_CHECK_PYTHON"
    finish 1
fi

if [ "$device" = cuda ]; then
    seconds=${seconds:-60} workers=${workers:-$(( $(nproc) > 4 ? $(nproc) - 2 : 2 ))} env=${env:-doom_battle}
    resume_seconds=$(( seconds / 4 > 5 ? seconds / 4 : 5 )) pbt_period=5000 unit_timeout=90 e2e_timeout=150
    # each stage's cap; it gets the least of its cap and what the budget has left (the default budget: a 10-minute
    # device call with 2 minutes' margin for the machine's start, the copy and the transfers back)
    declare -A limit=([setup]=60 [fork_proof]=45 [train]=$((seconds + 40)) [pytest_unit]=120
        [resume_cpu]=$((resume_seconds + 40)) [resume_cuda]=$((resume_seconds + 30)) [pbt]=90 [enjoy]=30 [eval]=40
        [export]=30 [pytest_e2e]=240)
    budget=${budget:-480}
else  # a slow, shared 2-core machine: the caps are generous, the run takes what it takes
    # training until 4096 env frames (the seconds a cap): on a loaded machine 10 s may not finish one batch
    seconds=${seconds:-100} workers=${workers:-2} env=${env:-doom_basic} train_frames=4096
    resume_seconds=60 pbt_period=500 unit_timeout=60 e2e_timeout=240
    declare -A limit=([setup]=90 [fork_proof]=60 [train]=$((seconds + 40)) [pytest_unit]=120
        [resume_cpu]=$((resume_seconds + 60)) [resume_cuda]=$((resume_seconds + 60)) [pbt]=180 [enjoy]=60 [eval]=60
        [export]=60 [pytest_e2e]=300)
    budget=${budget:-600}
fi
declare -A min_left=([learner_bench]=$([ "$device" = cuda ] && echo 40 || echo 20) [system_bench]=75)

export SFC_PY=$py SFC_DEVICE=$device SFC_ENV=$env SFC_WORKERS=$workers SFC_SECONDS=$seconds SFC_POLICIES=$policies
export SFC_RESUME_SECONDS=$resume_seconds SFC_PBT_PERIOD=$pbt_period
export SFC_UNIT_TIMEOUT=$unit_timeout SFC_E2E_TIMEOUT=$e2e_timeout SFC_TRAIN_FRAMES=${train_frames:-}
bundle=${SF_GPU_BUNDLE:-$PWD/.gpu_bundle}
case "$bundle" in /*) ;; *) bundle="$called_from/$bundle";; esac
export SFC_OUT=$out SFC_WORK=$out/work SFC_BUNDLE=$bundle PYTHONUNBUFFERED=1
env_line=$("$py" -c "import platform, torch, numpy; print(f'python {platform.python_version()}, torch {torch.__version__}"\
", numpy {numpy.__version__}')" 2>&1 | tail -1)
{
    echo "# python $py ($env_line), env $env, $workers workers, train ${train_frames:+$train_frames env frames or }" \
         "$seconds s, $policies policies; budget" \
         "$budget s, each stage the least of its cap and what is left"
    echo "# machine: ulimit -n $(ulimit -n), /dev/shm $(df -h --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')" \
         "free, $(env | grep -cE '^(CUDA|NCCL)') CUDA/NCCL variables set (setup.log has them, nvidia-smi and versions)"
} | tee -a "$summary"

for stage in "${STAGES[@]}"; do
    if [ -n "$only" ] && [[ ",$only," != *",$stage,"* ]]; then
        record SKIP "$stage" 0 "not selected (--stages $only)"
        continue
    fi
    left=$((budget - (SECONDS - start))); [ "$left" -lt 0 ] && left=0
    stage_limit=${limit[$stage]:-}
    if [ -z "$stage_limit" ]; then  # a benchmark: only in the time the budget has left
        if [ "$left" -lt "${min_left[$stage]}" ]; then
            record SKIP "$stage" 0 "no time left: ${left} s of the ${budget}-s budget, it needs ${min_left[$stage]} s"
            continue
        fi
        stage_limit=$left
        # system_throughput took 53 s with --duration 5 and 147 s with 60 here (2 simulations and a training run, each
        # started): about 45 s + 1.7 x duration; its 10-s windows need at least 10
        dur=$(( (left - 50) / 2 )); [ "$dur" -gt 60 ] && dur=60; [ "$dur" -lt 10 ] && dur=10
        [ "$device" = cpu ] && dur=10  # the dry-run checks the command, not the machine
        export SFC_SYSTEM_DURATION=$dur
    elif [ "$left" -lt 15 ]; then  # a stage that proves something, not run: not proven
        record FAIL "$stage" 0 "not run: ${left} s left of the ${budget}-s budget (the stages before it took the rest)"
        continue
    elif [ "$left" -lt "$stage_limit" ]; then
        stage_limit=$left
    fi
    log="$out/$stage.log"
    echo "gpu_check: $stage (limit ${stage_limit} s) ..."
    t=$SECONDS
    SFC_LOG=$log SFC_LIMIT=$stage_limit timeout -k 5 $((stage_limit - 5)) bash "$self" --internal-stage "$stage" \
        >"$log" 2>&1 &
    stage_group=$!  # timeout leads a process group of its own, the stage's processes in it
    wait "$stage_group"
    rc=$?
    reap_stage "$stage_group"
    took=$((SECONDS - t))
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        record FAIL "$stage" "$took" "timed out (limit ${stage_limit} s); last line: $(last_line "$log")"
    elif [ -f "$out/work/$stage.result" ]; then
        IFS='|' read -r status figure <"$out/work/$stage.result"
        record "$status" "$stage" "$took" "$figure"
    else
        record FAIL "$stage" "$took" "exit code $rc and no verdict; last line: $(last_line "$log")"
    fi
done
finish
