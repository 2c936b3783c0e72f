#!/usr/bin/env bash
# The CUDA checks in one short script, for a machine with a GPU (python3 holding a CUDA torch and the project's
# dependencies; the C++ queue built in place): the tests/gpu suite, the learner step on CUDA, and full training on
# CUDA beside pure simulation. Logs go to DIR (default /tmp/gpu_check); each stage has its own time limit so that a
# hung stage still leaves the others' logs.
#     bash benchmarks/gpu_check.sh [DIR] [NUM_WORKERS]
set -o pipefail
out=${1:-/tmp/gpu_check}
workers=${2:-$(( $(nproc) - 2 ))}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi -L 2>&1 | tee "$out/machine.log"
python3 -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__,
      torch.cuda.get_device_name(0))" 2>&1 | tee -a "$out/machine.log"
timeout 300 python3 -m pytest -q -ra -m gpu tests/gpu -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log"
timeout 90 python3 benchmarks/learner_step.py --device cuda --threads 1 --iters 10 --warmup 3 2>&1 | tee "$out/learner_cuda.log"
timeout 200 python3 benchmarks/system_throughput.py --envs doom_battle --num_workers "$workers" --duration 60 \
    --modes train --extra --device cuda 2>&1 | tee "$out/system_cuda.log"
