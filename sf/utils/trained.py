"""Whether a finished train.py run trained: what benchmarks/gpu_check.sh's train stage and the CUDA tests require of a
run beyond exit code 0 (a run whose every optimizer step was skipped on the device exits 0 too).

    python -m sf.utils.trained LOG EXP_DIR     # one line: "trained: ..." (exit 0) or "not trained: ..." (exit 1)

Required: the Done line's policy version > 0 and not every optimizer step skipped ("(S of N optimizer steps
skipped)"), the final weights changed from the learner's start (the "Final weights sha256" line), and every loss the
run wrote to TensorBoard (train/*loss*, train/entropy, train/grad_norm) finite. One policy's run (a population's
lines differ)."""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path

DONE = re.compile(r"Done: .*policy version (\d+) \((\d+) of (\d+) optimizer steps skipped\)")
FINAL = re.compile(r"Final weights sha256: [0-9a-f]{64} .*; (changed|UNCHANGED) from this process's start")
FINITE_TAGS = re.compile(r"^train/(.*loss|entropy|grad_norm)$")


def check_trained(log_text: str, exp_dir: Path) -> tuple[bool, str]:
    """(whether the run trained, one line: the figures, or what is missing)."""
    from sf.utils.events import read_scalar_events
    done, final = DONE.findall(log_text), FINAL.findall(log_text)
    if not done:
        return False, "no Done line with the optimizer steps skipped"
    version, skipped, steps = map(int, done[-1])
    problems = []
    if version == 0:
        problems.append("policy version 0")
    if steps == 0 or skipped == steps:
        problems.append(f"every optimizer step skipped ({skipped} of {steps})")
    if not final or final[-1] != "changed":
        problems.append("weights unchanged from the start" if final else "no Final weights line")
    scalars = read_scalar_events(exp_dir)
    losses = {tag: [v for _, _, v in points] for tag, points in scalars.items() if FINITE_TAGS.match(tag)}
    bad = sorted(tag for tag, values in losses.items() if not all(math.isfinite(v) for v in values))
    if not losses:
        problems.append("no loss in TensorBoard")
    if bad:
        problems.append(f"non-finite {', '.join(bad)}")
    last_loss = losses.get("train/policy_loss", [float("nan")])[-1]
    figure = (f"policy version {version}, {skipped} of {steps} optimizer steps skipped, weights "
              f"{final[-1] if final else '?'}, {sum(map(len, losses.values()))} loss points finite"
              f", last policy_loss {last_loss:.4g}")
    return (False, "; ".join(problems) + f" ({figure})") if problems else (True, figure)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m sf.utils.trained LOG EXP_DIR", file=sys.stderr)
        return 2
    log, exp = Path(args[0]), Path(args[1])
    if not log.is_file() or not exp.is_dir():
        print(f"sf.utils.trained: error: {log if not log.is_file() else exp} does not exist", file=sys.stderr)
        return 2
    ok, line = check_trained(log.read_text(errors="replace"), exp)
    print(f"{'trained' if ok else 'not trained'}: {line}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
