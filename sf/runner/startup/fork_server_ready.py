"""Imported by the fork server last (supervision.worker_context), after sf.runner.startup.fork_server and the env
modules: the end of its preloading.

It asks the CUDA driver whether the env modules initialized CUDA (sf.processes.control.check_cuda_driver: a worker
forked from a process that did cannot use it, and refuses to start in one line naming them), then freezes the GC.
"""
import gc
import sys

from sf.processes.control import check_cuda_driver
from sf.runner.startup.fork_server import PRELOADED

_env_modules = sorted({m.split(".")[0] for m in set(sys.modules) - PRELOADED - {__name__} if not m.startswith("_")})
check_cuda_driver(f"the env modules ({', '.join(_env_modules) or 'none'})")

# Objects that exist now live for the process's lifetime: keep the cyclic GC from touching (and so copying) their pages
# in every worker.
gc.freeze()
