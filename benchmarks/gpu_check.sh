#!/usr/bin/env bash
# Prove the GPU path in one call of at most 7 minutes on a borrowed, bare GPU machine; or, with --device cpu, the same
# stages on the CPU (CI's dry-run, tests/test_gpu_check_script.py), so that the script cannot rot between GPU runs.
#
#     bash benchmarks/gpu_check.sh DIR [--device cuda|cpu] [--workers N] [--seconds S] [--policies N] [--budget S]
#                                      [--env ENV] [--stages a,b,...]
#
# Stages, most decisive first; each runs under its own time limit (a stage past it is stopped: FAIL), a failed stage
# does not stop the later ones, and the exit status is 1 if any stage failed (2: bad arguments):
#   setup        installs what the machine lacks from the bundle benchmarks/gpu_bundle.sh made (SF_GPU_BUNDLE, default
#                .gpu_bundle): the wheels whose package the Python lacks (pip --no-index --no-deps, into its own
#                environment; if that is read-only, into DIR/work/site on PYTHONPATH), the C++ queue built for its
#                Python (copied into sf/ipc if sf.ipc._cqueue does not load; else built in place if a compiler is
#                there), the Doom scenario data (copied into data/doom_scenarios if the checkout has none and
#                SF_DOOM_SCENARIOS is unset); then imports torch, vizdoom, gymnasium, tensorboardX and the queue, finds
#                the scenarios and, on CUDA, the GPU
#   fork_proof   benchmarks/fork_cuda_proof.py: a worker forked from the runner's fork server (its real preload, the
#                env's modules included) trains on the device
#   pytest       `pytest tests/gpu -ra`: 0 failed and 0 skipped, but skips whose reason says the test needs more GPUs
#                than the machine has (listed in the summary); with pytest-xdist, 4 processes. --device cpu:
#                SF_GPU_TESTS_DEVICE=cpu pytest tests/gpu -m any_device, restricted to one fast test with -k
#                (SF_CHECK_PYTEST_K, default "export": CI's time)
#   train        train.py on ENV (default doom_battle; --device cpu: doom_basic) for S seconds (default 60; cpu: 10),
#                an nvidia-smi snapshot once it reports; figures: frames/s, policy lag, GPU memory
#   resume_cpu   that experiment resumed with --device cpu, then
#   resume_cuda  resumed with --device cuda (--device cpu: on the CPU again), each until two more batches are trained
#                (the policy version must advance), at most S/4 seconds (at least 5; --device cpu: S, at least 20)
#   pbt          N policies (default 8) with PBT, a short PBT period; one policy worker SIGKILLed once the run reports
#                frames (found by its process name, sf:policy_p<N/2>_0, among the run's descendants): PASS only if
#                the runner logs its restart, the run exits 0 and PBT decided at least once
#   enjoy, eval, export   of the train stage's checkpoint, without --device (auto: CUDA where there is one)
#   learner_bench, system_bench   benchmarks/learner_step.py and system_throughput.py, only if the budget has time left
#
# Time (GPU, the defaults): the limits of the stages that always run add up to
#     setup 20 + fork_proof 30 + pytest 120 + train (60 + 25) + resume_cpu (15 + 15) + resume_cuda (15 + 15)
#     + pbt (30 + 25) + enjoy 15 + eval 20 + export 15 = 420 s  <=  the 420-s budget (7 min: the device call's
#     command may run 10; its start and the transfers come on top)
# and the benchmarks get only what the stages before them left of the budget (--budget, default 420 s): each is skipped,
# saying so, when too little is left. A stage's limit is a hard stop: `timeout` sends SIGTERM 5 s before it (train.py
# stops in order and writes its final checkpoint) and SIGKILL at it. On the CPU the limits are a slow machine's caps
# and the budget is 150 s: the dry-run takes about 100 s on 2 cores (120-150 s on a shared machine), system_bench
# skipped for want of time.
#
# Output: DIR/summary.txt (a line per stage: `PASS|FAIL|SKIP stage seconds key-figure`; lines starting with # are
# the header and the result), DIR/<stage>.log, DIR/train_nvidia_smi.log, DIR/logs.tar.gz (all of them in one file:
# a device call brings back at most 8 files); experiments and the installed wheels under DIR/work (not packed).
# Settings: SF_CHECK_PYTHON (default: the first of .venv/bin/python and python3 that imports torch), SF_GPU_BUNDLE,
# SF_CHECK_<STAGE>_ARGS (more arguments for that stage's command, e.g. SF_CHECK_PBT_ARGS="--env no_such_env" breaks
# the pbt stage for real: how the CI test shows a failed stage failing the script), SF_CHECK_PYTEST_K.
set -uo pipefail  # no -e: a failed stage is recorded and the next one runs
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
called_from=$PWD  # DIR, SF_GPU_BUNDLE and SF_CHECK_PYTHON given relative are relative to it
cd "$(dirname "$self")/.."

STAGES=(setup fork_proof pytest train resume_cpu resume_cuda pbt enjoy eval export learner_bench system_bench)
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
    [ "$SFC_DEVICE" = cuda ] && { nvidia-smi -L || echo "nvidia-smi -L failed"; }
    local envsh="$SFC_WORK/env.sh" site="$SFC_WORK/site" need=() how=() w dist
    : >"$envsh"
    if [ -d "$SFC_BUNDLE/wheels" ]; then
        for w in "$SFC_BUNDLE"/wheels/*.whl; do  # the wheel's distribution name is its file name up to the first -
            dist=$(basename "$w" | cut -d- -f1)
            "$SFC_PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null \
                || need+=("$w")
        done
    fi
    if [ ${#need[@]} -gt 0 ]; then
        local pip=("$SFC_PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile
                   --no-cache-dir)
        local names purelib
        names=$(for w in "${need[@]}"; do basename "$w" | cut -d- -f1-2; done | tr '\n' ' ' | sed 's/ $//')
        # into the Python's own environment (a borrowed machine is thrown away after the call): there every process
        # sees them, also the tests' train.py runs that set a PYTHONPATH of their own (tests/e2e_helpers.start_train)
        purelib=$("$SFC_PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        if [ -w "$purelib" ]; then
            echo "installing ${#need[@]} wheels into $purelib: $names"
            "${pip[@]}" "${need[@]}" \
                || { result FAIL "pip install of the bundle's wheels failed: $(why_failed "$SFC_LOG")"; return; }
            how+=("wheels installed: $names")
        else  # a read-only environment: beside it, on PYTHONPATH (what resets PYTHONPATH does not see them)
            echo "installing ${#need[@]} wheels into $site (the Python's environment is read-only): $names"
            "${pip[@]}" --target "$site" "${need[@]}" \
                || { result FAIL "pip install of the bundle's wheels failed: $(why_failed "$SFC_LOG")"; return; }
            echo "export PYTHONPATH=\"$site\${PYTHONPATH:+:\$PYTHONPATH}\"" >>"$envsh"
            how+=("wheels installed on PYTHONPATH (read-only environment): $names")
        fi
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
                result FAIL "the C++ queue sf.ipc._cqueue does not load for $SFC_PY and could not be built:" \
                    "$(why_failed "$SFC_LOG")"
                return
            fi
        fi
    fi
    if [ -z "${SF_DOOM_SCENARIOS:-}" ] && [ ! -f data/doom_scenarios/battle.wad ] \
        && [ -d "$SFC_BUNDLE/doom_scenarios" ]; then
        # where make setup puts them (git-ignored): every process finds them there, whatever environment it is given
        mkdir -p data/doom_scenarios && cp -n "$SFC_BUNDLE"/doom_scenarios/* data/doom_scenarios/ \
            || { result FAIL "cannot copy the bundle's Doom scenarios into data/doom_scenarios"; return; }
        how+=("Doom scenarios from the bundle (into data/doom_scenarios)")
    else
        how+=("Doom scenarios in ${SF_DOOM_SCENARIOS:-data/doom_scenarios}")
    fi
    local versions
    versions=$("$SFC_PY" - "$SFC_DEVICE" <<'EOF'
import sys
import numpy, torch, vizdoom, gymnasium, tensorboardX  # noqa: F401  (what a bare GPU image lacks)
import sf.ipc._cqueue  # noqa: F401
from sf_envs.doom.fetch_scenarios import scenarios_dir
if not (scenarios_dir() / "battle.wad").is_file():
    sys.exit(f"no Doom scenario data in {scenarios_dir()} (doom_battle needs it)")
where = "no GPU asked for"
if sys.argv[1] == "cuda":
    if not torch.cuda.is_available():
        sys.exit(f"torch {torch.__version__} sees no CUDA device")
    where = f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU)"
print(f"torch {torch.__version__}, numpy {numpy.__version__}, vizdoom {vizdoom.__version__}, {where}")
EOF
    ) || { result FAIL "$(why_failed "$SFC_LOG")"; return; }
    echo "$versions"
    result PASS "$versions; $(IFS=';'; echo "${how[*]}" | sed 's/;/; /g')"
}

stage_fork_proof() {
    # shellcheck disable=SC2046
    "$SFC_PY" benchmarks/fork_cuda_proof.py --device "$SFC_DEVICE" --env "$SFC_ENV" --timeout $((SFC_LIMIT - 15)) \
        $(extra_args)
    local rc=$? line
    line=$(grep '^fork proof: ' "$SFC_LOG" | tail -1 | sed -E 's/^fork proof: (PASS|FAIL): //')
    if [ $rc -eq 0 ]; then result PASS "$line"; else result FAIL "${line:-$(why_failed "$SFC_LOG")}"; fi
}

stage_pytest() {
    local args=(-m pytest tests/gpu -ra -q -p no:cacheprovider)
    if [ "$SFC_DEVICE" = cpu ]; then
        # the tests that hold on either device, on the CPU; one fast one (-k): the whole set is CI's own job
        export SF_GPU_TESTS_DEVICE=cpu
        args+=(-m any_device -k "${SF_CHECK_PYTEST_K:-export}")
    elif "$SFC_PY" -c "import xdist" 2>/dev/null; then
        args+=(-n 4)  # pytest-xdist; 16 cores and one GPU: the tests' processes overlap well within the stage's limit
    fi
    # shellcheck disable=SC2046
    "$SFC_PY" "${args[@]}" $(extra_args)
    local rc=$? counts bad_skips ok_skips
    counts=$(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error|deselected)' "$SFC_LOG" | tail -1 \
        | sed -E 's/=+//g; s/^ +| +$//g')
    bad_skips=$(grep -E '^SKIPPED \[' "$SFC_LOG" | grep -vE "$GPU_SKIP_OK")
    ok_skips=$(grep -E '^SKIPPED \[' "$SFC_LOG" | grep -E "$GPU_SKIP_OK" | grep -oE 'tests/[^:]+:[0-9]+' | tr '\n' ' ')
    local figure="${counts:-no result line}${ok_skips:+; skipped, needing more GPUs than there are: $ok_skips}"
    if [ $rc -eq 5 ]; then
        result FAIL "no test selected (pytest exit code 5): ${counts:-no result line}"
    elif [ $rc -ne 0 ]; then
        result FAIL "pytest exit code $rc: $figure"
    elif [ -n "$bad_skips" ]; then
        result FAIL "skipped tests (none may be, but for more GPUs):" \
            "$(echo "$bad_skips" | head -3 | cut -c1-150 | tr '\n' ' ')"
    else
        result PASS "$figure"
    fi
}

# train.py on the stage's experiment in DIR/work/td; the rest of its flags in "$@"
train() {
    # shellcheck disable=SC2046
    "$SFC_PY" train.py --env "$SFC_ENV" --train_dir "$SFC_WORK/td" --report_interval_sec 5 "$@" $(extra_args)
}

stage_train() {
    train --experiment gpu_check --restart_behavior overwrite --device "$SFC_DEVICE" --num_workers "$SFC_WORKERS" \
        --train_for_seconds "$SFC_SECONDS" --save_every_sec 20 &
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
    if [ $rc -eq 0 ] && ran_on "$SFC_DEVICE" "$SFC_LOG" && grep -q 'Final weights sha256' "$SFC_LOG"; then
        result PASS "$SFC_ENV on $SFC_DEVICE, $SFC_WORKERS workers, ${SFC_SECONDS} s: $(train_figures "$SFC_LOG")$gpu"
    else
        result FAIL "train.py exit code $rc: $(why_failed "$SFC_LOG")"
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
    train --experiment gpu_check --restart_behavior resume --device "$dev" --train_for_seconds "$SFC_RESUME_SECONDS" \
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
        --train_for_seconds "$SFC_PBT_SECONDS" --report_interval_sec 2 $(extra_args) <<'EOF'
"""Start the PBT run, SIGKILL one policy worker once it reports frames, wait for its restart and the run's end."""
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
out="" device=cuda workers="" seconds="" policies=8 budget="" env="" only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device=${2:-}; shift 2 || die "--device needs a value";;
        --workers) workers=${2:-}; shift 2 || die "--workers needs a value";;
        --seconds) seconds=${2:-}; shift 2 || die "--seconds needs a value";;
        --policies) policies=${2:-}; shift 2 || die "--policies needs a value";;
        --budget) budget=${2:-}; shift 2 || die "--budget needs a value";;
        --env) env=${2:-}; shift 2 || die "--env needs a value";;
        --stages) only=${2:-}; shift 2 || die "--stages needs a value";;
        -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$self"; exit 0;;
        -*) die "unknown option $1 ($usage)";;
        *) [ -z "$out" ] || die "one DIR only, got $out and $1 ($usage)"; out=$1; shift;;
    esac
done
[ -n "$out" ] || die "DIR is required ($usage)"
case "$out" in /*) ;; *) out="$called_from/$out";; esac
case "$device" in cuda|cpu) ;; *) die "--device $device: expected cuda or cpu";; esac
for v in workers seconds policies budget; do
    [ -z "${!v}" ] || [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--$v ${!v}: expected a whole number >= 1"
done
for s in ${only//,/ }; do
    [[ " ${STAGES[*]} " == *" $s "* ]] || die "--stages: unknown stage $s (stages: ${STAGES[*]})"
done

py=${SF_CHECK_PYTHON:-}
case "$py" in /*|"") ;; */*) py="$called_from/$py";; esac  # a bare name (python3) is looked up on the PATH
if [ -z "$py" ]; then
    for c in .venv/bin/python python3; do
        if "$c" -c "import torch" 2>/dev/null; then py=$c; break; fi
    done
fi
[ -n "$py" ] || die "no Python that imports torch (.venv/bin/python, python3); set SF_CHECK_PYTHON"
mkdir -p "$out" || die "cannot make $out"
out=$(cd "$out" && pwd)
# a rerun in the same DIR (--stages) keeps DIR/work: the experiments the later stages use, what setup installed there
rm -f "$out"/*.log "$out/summary.txt" "$out/logs.tar.gz" "$out"/work/*.result
mkdir -p "$out/work"

if [ "$device" = cuda ]; then
    seconds=${seconds:-60} workers=${workers:-$(( $(nproc) > 4 ? $(nproc) - 2 : 2 ))} env=${env:-doom_battle}
    resume_seconds=$(( seconds / 4 > 5 ? seconds / 4 : 5 )) pbt_seconds=$(( seconds / 2 > 20 ? seconds / 2 : 20 ))
    pbt_period=5000
    declare -A limit=([setup]=20 [fork_proof]=30 [pytest]=120 [train]=$((seconds + 25))
        [resume_cpu]=$((resume_seconds + 15)) [resume_cuda]=$((resume_seconds + 15))
        [pbt]=$((pbt_seconds + 25)) [enjoy]=15 [eval]=20 [export]=15)
else  # a slow, shared 2-core machine: the caps are generous; the run takes what it takes (~100 s)
    seconds=${seconds:-10} workers=${workers:-2} env=${env:-doom_basic}
    resume_seconds=$(( seconds > 20 ? seconds : 20 )) pbt_seconds=$(( seconds > 20 ? seconds : 20 ))
    pbt_period=500
    declare -A limit=([setup]=60 [fork_proof]=60 [pytest]=180 [train]=$((seconds + 60))
        [resume_cpu]=$((resume_seconds + 60)) [resume_cuda]=$((resume_seconds + 60))
        [pbt]=$((pbt_seconds + 90)) [enjoy]=60 [eval]=60 [export]=60)
    budget=${budget:-150}
fi
budget=${budget:-420}
declare -A min_left=([learner_bench]=$([ "$device" = cuda ] && echo 40 || echo 20) [system_bench]=75)
fixed=0
for s in "${!limit[@]}"; do fixed=$((fixed + limit[$s])); done

export SFC_PY=$py SFC_DEVICE=$device SFC_ENV=$env SFC_WORKERS=$workers SFC_SECONDS=$seconds SFC_POLICIES=$policies
export SFC_RESUME_SECONDS=$resume_seconds SFC_PBT_SECONDS=$pbt_seconds SFC_PBT_PERIOD=$pbt_period
bundle=${SF_GPU_BUNDLE:-$PWD/.gpu_bundle}
case "$bundle" in /*) ;; *) bundle="$called_from/$bundle";; esac
export SFC_OUT=$out SFC_WORK=$out/work SFC_BUNDLE=$bundle PYTHONUNBUFFERED=1
summary=$out/summary.txt
{
    echo "# gpu_check.sh --device $device on $(cat /proc/sys/kernel/hostname) ($(nproc) cores)," \
         "$(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
    echo "# python $py, env $env, $workers workers, train $seconds s, $policies policies; stage limits ${fixed} s," \
         "budget $budget s"
} >"$summary"
cat "$summary"
[ "$device" = cpu ] || [ "$fixed" -le "$budget" ] \
    || echo "gpu_check: warning: the stage limits add up to $fixed s, past the $budget-s budget (--seconds $seconds)"

start=$SECONDS failed=0 passed=0 skipped=0
record() {  # STATUS STAGE SECONDS FIGURE
    printf '%s %-13s %4ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$summary"
    case "$1" in PASS) passed=$((passed + 1));; FAIL) failed=$((failed + 1));; SKIP) skipped=$((skipped + 1));; esac
}
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
    fi
    log="$out/$stage.log"
    echo "gpu_check: $stage (limit ${stage_limit} s) ..."
    t=$SECONDS
    SFC_LOG=$log SFC_LIMIT=$stage_limit timeout -k 5 $((stage_limit - 5)) bash "$self" --internal-stage "$stage" \
        >"$log" 2>&1
    rc=$?
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

total=$((SECONDS - start))
verdict=$([ $failed -eq 0 ] && echo PASS || echo FAIL)
echo "# result: $verdict: $passed passed, $failed failed, $skipped skipped in $total s (budget $budget s)" \
    | tee -a "$summary"
# one file for all logs: a device call brings back at most 8 files from $OUT
(cd "$out" && tar czf logs.tar.gz summary.txt ./*.log) 2>/dev/null
echo "gpu_check: logs in $out (all in $out/logs.tar.gz); summary: $summary"
[ $failed -eq 0 ]
