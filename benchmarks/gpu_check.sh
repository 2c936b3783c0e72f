#!/usr/bin/env bash
# The CUDA checks in one short script, for a machine with a GPU (python3 holding a CUDA torch and the project's
# dependencies; the C++ queue built in place): the tests/gpu suite, the learner step on CUDA (APPO.train on a batch
# gathered from shared memory as the learner does it), and full training on CUDA beside pure simulation; then, where a
# Python with Sample Factory 2.1.1 is found (SF_PYTHON, default .venv-sf/bin/python; skipped with a line otherwise),
# Sample Factory's doom_battle on the same GPU with the same workers and the paper's batch. Logs go to DIR (default
# /tmp/gpu_check); each stage has its own time limit so that a hung stage still leaves the others' logs.
#     bash benchmarks/gpu_check.sh [DIR] [NUM_WORKERS]
#     SF_PYTHON=/path/to/sf-venv/bin/python bash benchmarks/gpu_check.sh
set -o pipefail
out=${1:-/tmp/gpu_check}
workers=${2:-$(( $(nproc) - 2 ))}
sf_python=${SF_PYTHON:-.venv-sf/bin/python}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi -L 2>&1 | tee "$out/machine.log"
python3 -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__,
      torch.cuda.get_device_name(0))" 2>&1 | tee -a "$out/machine.log"
timeout 300 python3 -m pytest -q -ra -m gpu tests/gpu -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log"
timeout 90 python3 benchmarks/learner_step.py --device cuda --threads 1 --iters 10 --warmup 3 2>&1 | tee "$out/learner_cuda.log"
timeout 200 python3 benchmarks/system_throughput.py --envs doom_battle --num_workers "$workers" --duration 60 \
    --modes train --device cuda 2>&1 | tee "$out/system_cuda.log"
# Sample Factory 2.1.1 on the same GPU: doom_battle, the same workers, the paper's batch (system_throughput.py's
# PAPER_DOOM); its 10-s "Fps is" reports are in the log (the first two are start-up)
if "$sf_python" -c "import sample_factory, sf_examples" 2>/dev/null; then
    "$sf_python" -c "import sample_factory; print('sample_factory', sample_factory.__version__)" 2>&1 | tee "$out/sf_cuda.log"
    timeout 200 "$sf_python" -m sf_examples.vizdoom.train_vizdoom --env doom_battle --experiment gpu_check \
        --train_dir "$out/sf_td" --restart_behavior overwrite --device gpu --num_workers "$workers" \
        --num_envs_per_worker 16 --use_rnn True --batch_size 2048 --num_batches_per_epoch 1 --num_epochs 1 \
        --learning_rate 1e-4 --exploration_loss_coeff 0.003 --train_for_seconds 60 2>&1 | tee -a "$out/sf_cuda.log" \
        | grep "Fps is"
else
    echo "Sample Factory 2.1.1 not compared: $sf_python cannot import sample_factory and sf_examples (set SF_PYTHON)" \
        | tee "$out/sf_cuda.log"
fi
