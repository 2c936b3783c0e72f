#!/usr/bin/env python
"""Watch or evaluate a trained agent: `python enjoy.py --env doom_basic --experiment NAME [--save_video]`."""
import sys

from sf.cfg import cli_main


def main(cfg) -> int:
    from sf.enjoy import run_enjoy
    return run_enjoy(cfg)


if __name__ == "__main__":
    sys.exit(cli_main(main, mode="enjoy", prog="enjoy.py"))
