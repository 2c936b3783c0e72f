"""Train an agent: `python -m sf.train --env doom_basic --num_workers 2` (see --help for every parameter).

The same entry point as the console script `sf-train` (installed with the package) and the clone's `train.py`.
Exit codes: 0 done, 2 bad input (one line on stderr), 1 a failure of the run (one line; see the experiment's log).
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Optional, Sequence

from sf.cfg import cli_main

if TYPE_CHECKING:
    from sf.cfg.config import Config


def run(cfg: Config) -> int:
    """Train with a resolved configuration (sf.cfg.parse_cfg); returns the exit code."""
    from sf.runner.startup.entry import run_training
    return run_training(cfg)


def _prog() -> str:
    """How the user invoked us, for messages: sf-train, train.py, or python -m sf.train."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m sf.train" if name in ("", "-c", "-m", "train.py", "__main__.py") else name


def _auto_layout(cfg: Config, explicit):
    """--num_workers auto: the layout sf.autolayout cached for this env and machine (measured now if none is)."""
    from sf.autolayout import resolve_auto
    return resolve_auto(cfg, explicit)


def main(argv: Optional[Sequence[str]] = None, *, prog: Optional[str] = None) -> int:
    """Parse argv (default: the command line), train; returns the exit code (bad input: one line, exit code 2)."""
    # torch.cuda.is_available() (--device auto/cuda) then asks NVML instead of initializing CUDA in the runner: a
    # process that initialized CUDA cannot hand CUDA to a child it forks (sf.autolayout's measuring child is spawned
    # anyway; the workers come from the fork server)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    return cli_main(run, mode="train", prog=prog or _prog(), argv=None if argv is None else list(argv),
                    auto_layout=_auto_layout)


if __name__ == "__main__":
    sys.exit(main())
