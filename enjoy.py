#!/usr/bin/env python
"""Watch or evaluate a trained agent: `python enjoy.py --env doom_basic --experiment NAME [--save_video]`.
The same as `python -m sf.enjoy` (see sf/enjoy.py)."""
import sys

from sf.enjoy import main

if __name__ == "__main__":
    sys.exit(main(prog="enjoy.py"))
