#!/usr/bin/env python
"""Train an agent: `python train.py --env doom_basic --num_workers 2` (see --help for every parameter)."""
import sys

from sf.cfg import cli_main


def main(cfg) -> int:
    from sf.runner.runner import run_training
    return run_training(cfg)


if __name__ == "__main__":
    sys.exit(cli_main(main, mode="train", prog="train.py"))
