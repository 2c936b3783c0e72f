"""train.py whose learner is started with one more argument that cannot be unpickled in the learner's process: it
raises there what torch raises for a CUDA tensor in a process that cannot use CUDA (a child of a process that had
initialized it). Checks that such a process reports our one line in the run's log (tests/runner/test_fork_server.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sf.cfg import cli_main  # noqa: E402
from sf.runner import runner as runner_module  # noqa: E402
from sf.runner.startup.entry import run_training  # noqa: E402
from sf.runner.startup.experiment_lock import run_holding  # noqa: E402


def _unpickle_on_cuda():
    raise RuntimeError("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use "
                       "the 'spawn' start method")


class CudaHandle:
    """Pickled by the runner as any argument; its unpickling in the child raises."""

    def __reduce__(self):
        return _unpickle_on_cuda, ()


_start = runner_module.Runner._start


def _start_with_a_cuda_handle(self, name, target, *args, unwind=False):
    if target is run_holding:  # the learner (it holds the experiment's lock)
        args = (*args, CudaHandle())
    _start(self, name, target, *args, unwind=unwind)


runner_module.Runner._start = _start_with_a_cuda_handle

if __name__ == "__main__":
    sys.exit(cli_main(run_training, mode="train", prog="unloadable_args_train.py"))
