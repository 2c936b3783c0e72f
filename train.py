#!/usr/bin/env python
"""Train an agent: `python train.py --env doom_basic --num_workers 2` (see --help for every parameter).

A thin wrapper of sf.train (the same as `python -m sf.train` and the installed console script `sf-train`)."""
import sys

from sf.train import main

if __name__ == "__main__":
    sys.exit(main(prog="train.py"))
