"""A model card for an experiment: EXP/README.md in the layout of Sample Factory's model repositories.

    python -m sf.card EXP [--train_dir DIR]

EXP is the experiment directory (train_dir/<experiment>), or with --train_dir the experiment's name in DIR (as for
python -m sf.export). The card follows what Sample Factory 2.1.1 writes when it pushes a model
(sample_factory/huggingface/huggingface_utils.py, generate_model_card): YAML front matter (library_name, tags and, once
the model is evaluated, a model-index whose mean_reward is "mean +/- std" of the evaluation episodes), the sentence
naming the algorithm and the env, then how to use, evaluate and continue training the model. Beside them:

    Results          env, env frames trained (each policy's latest checkpoint), final and best average episode reward
                     during training (the reward/reward series of the TensorBoard event files) and, per evaluation CSV
                     EXP/eval*.csv (python -m sf.eval), the mean return with its 95% confidence interval (Student's t,
                     as sf.eval prints it); else "not evaluated" and the command that evaluates it
    Learning curves  EXP/learning_curves.png, drawn by python -m sf.plot's code (reward and throughput)
    Training         the command that reproduces the run's configuration: train.py with every setting of the saved
                     config.json that differs from the defaults and preset of its env, and always the machine-dependent
                     ones (workers, envs per worker) and the seed
    Hardware         what the run log (sf_log.txt) says about the run, and this machine's CPU, memory and GPUs (the
                     machine writing the card, which need not be the one that trained)

A README.md that the card did not write (the user's own: it lacks the card's mark, an HTML comment after the front
matter) is kept: one line naming --force, which replaces it. Both files are written atomically (sf/utils/files.py). Bad
input (no such experiment, a directory train.py did not write, no checkpoint, an evaluation CSV without a return column)
is one line on stderr and exit code 2, with nothing written; an I/O failure one line and exit code 1.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import re
import shlex
import sys
from pathlib import Path

from sf.cfg import Config, ConfigError, OneLineArgumentParser, RunError, all_params, run_guarded
from sf.cfg.parse import _preset_values, read_json_object
from sf.cfg.validate import from_file
from sf.eval import summarize
from sf.export import add_experiment_arguments, experiment_cfg, experiment_path
from sf.plot import run_plot, split_policies
from sf.utils.events import drop_orphans, event_files, read_scalar_events
from sf.utils.files import write_text_atomic

ALGO = "APPO"
# the card's own mark (an HTML comment, invisible on the hub), right after the front matter: a README.md without it was
# written by someone else and is replaced only with --force
CARD_MARK = "<!-- Written by python -m sf.card: run it again to update this card. -->"
CURVES_NAME = "learning_curves.png"
EVAL_GLOB = "eval*.csv"
EVAL_EPISODES = 1000


# --- what the run left -----------------------------------------------------------------------------------------------
def train_command(saved: dict) -> list[str]:
    """The train.py command line that resolves to the configuration `saved` (a config.json): --env, --experiment and
    --train_dir, every train-mode parameter whose value differs from the table default with the env's preset over it,
    and always the seed and the worker counts (their defaults depend on the machine)."""
    params = {p.name: p for p in all_params()}
    # what parse_cfg starts from: the table defaults, the preset over them
    base = _preset_values(saved["env"], params, saved.get("preset_set"))
    always = {"seed", "num_workers", "num_envs_per_worker"}
    args = ["--env", saved["env"], "--experiment", saved["experiment"], "--train_dir", saved["train_dir"]]
    for name, p in params.items():
        if name in ("env", "experiment", "train_dir", "restart_behavior") or p.scope == "enjoy" or name not in saved:
            continue
        value = saved[name]
        if name in always or from_file("config.json", name, p, value) != base[name]:
            values = value if isinstance(value, list) else [value]
            args += [f"--{name}", *(_flag_text(v) for v in values)]
    return args


def _flag_text(v) -> str:
    return str(v) if not isinstance(v, float) else repr(v)  # repr: the shortest text that reads back the same float


def frames_trained(exp_dir: Path, num_policies: int) -> dict[int, tuple[int, int]]:
    """policy -> (env frames, policy version) of its latest verified checkpoint; ConfigError when a policy has none."""
    from sf.learning.checkpoint import REGULAR_NAME_RE, CheckpointError  # (torch: 2 s that --help does without)
    from sf.learning.checkpoint_store import CheckpointManager
    out = {}
    for p in range(num_policies):
        manager = CheckpointManager(exp_dir, policy_id=p, read_only=True)
        try:
            latest = manager.latest()
        except CheckpointError as e:
            raise RunError(str(e)) from None
        if not latest:
            raise ConfigError(f"no checkpoint in {manager.dir}; train first")
        version, steps = REGULAR_NAME_RE.match(latest[0].name).groups()  # verified: the name is its content's
        out[p] = (int(steps), int(version))
    return out


def training_rewards(exp_dir: Path) -> dict[str, tuple[float, float, int]]:
    """Series label ('' or 'p{i}' in a population) -> (final, best, points) of the average episode reward during
    training (reward/reward of the event files, orphans of a resumed run dropped); {} without event files."""
    if not event_files(exp_dir):
        return {}
    out = {}
    for label, scalars in split_policies("", read_scalar_events(exp_dir)).items():
        values = [v for _, _, v in drop_orphans(scalars.get("reward/reward", [])) if math.isfinite(v)]
        if values:
            out[label.strip("/")] = (values[-1], max(values), len(values))
    return out


def evaluations(exp_dir: Path) -> list[tuple[str, str, int, float, float, float, float]]:
    """[(file name, policy, episodes, mean return, sample std, 95% CI low, high)] per eval CSV (name order) and
    policy, summarized as python -m sf.eval does (Student's t; NaN std and CI for one episode). ConfigError naming the
    file when it has no 'return' column or a return is not a number."""
    rows = []
    for path in sorted(exp_dir.glob(EVAL_GLOB)):
        try:
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                if "return" not in (reader.fieldnames or []):
                    raise ConfigError(f"{path}: no 'return' column (columns: {', '.join(reader.fieldnames or [])}); "
                                      f"python -m sf.eval writes one")
                by_policy: dict[str, list[float]] = {}
                for line, r in enumerate(reader, start=2):
                    try:
                        value = float(r["return"])
                    except (TypeError, ValueError):
                        value = math.nan
                    if not math.isfinite(value):
                        raise ConfigError(f"{path}, line {line}: return {r['return']!r} is not a finite number")
                    by_policy.setdefault(r.get("policy") or "0", []).append(value)
        except OSError as e:
            raise RunError(f"cannot read {path}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not UTF-8 text") from None
        for policy, returns in sorted(by_policy.items(), key=lambda kv: (len(kv[0]), kv[0])):  # 2 before 10
            rows.append((path.name, policy, len(returns), *summarize(returns)))
    return rows


def run_log_hardware(exp_dir: Path) -> list[str]:
    """The run log's lines on where and how fast it ran (its 'Experiment ...' and 'Done ...' lines, the last run's)."""
    try:
        text = (exp_dir / "sf_log.txt").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found = {}
    for line in text.splitlines():
        m = re.match(r"^\[[^]]*\]\[\d+\]\[\w+\] ((Experiment|Done)\b.*)$", line)
        if m:
            found[m.group(2)] = m.group(1)
    return [found[k] for k in ("Experiment", "Done") if k in found]


def this_machine() -> str:
    """CPU model, cores, memory and NVIDIA GPUs of this machine (from /proc: no torch, no CUDA initialization)."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    text = f"{cpu}, {os.cpu_count()} logical cores"
    try:
        import psutil
        text += f", {psutil.virtual_memory().total / 2 ** 30:.0f} GiB memory"
    except ImportError:
        pass
    gpus = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            gpus += [line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                     if line.startswith("Model")]
        except OSError:
            pass
    return text + (f", GPUs: {', '.join(gpus)}" if gpus else ", no NVIDIA GPU")


# --- the card --------------------------------------------------------------------------------------------------------
def _front_matter(env: str, evals: list) -> str:
    lines = ["---", "library_name: sample-factory", "tags:", "- deep-reinforcement-learning",
             "- reinforcement-learning", "- sample-factory"]
    if evals:  # Sample Factory's metadata_eval_result: one result, "mean +/- std" (the first file's first policy)
        _, _, _, mean, std, _, _ = evals[0]
        lines += ["model-index:", f"- name: {ALGO}", "  results:", "  - task:", "      type: reinforcement-learning",
                  "      name: reinforcement-learning", "    dataset:", f"      name: {env}", f"      type: {env}",
                  "    metrics:", "    - type: mean_reward",
                  f"      value: {mean:.2f} +/- {0.0 if math.isnan(std) else std:.2f}",
                  "      name: mean_reward", "      verified: false"]
    return "\n".join(lines + ["---", ""])


def _code(*commands: str) -> str:
    return "```\n" + "\n".join(commands) + "\n```\n"


def card_text(exp_dir: Path, cfg: Config, saved: dict, curves: Path | None) -> str:
    env, exp = cfg.env, exp_dir.name
    frames = frames_trained(exp_dir, cfg.num_policies)
    rewards = training_rewards(exp_dir)
    evals = evaluations(exp_dir)
    where = shlex.quote(str(exp_dir))
    eval_cmd = f"python -m sf.eval {where} --episodes {EVAL_EPISODES}"
    population = cfg.num_policies > 1

    out = [_front_matter(env, evals), CARD_MARK + "\n",
           f"A(n) **{ALGO}** model trained on the **{env}** environment.\n",
           "It was trained with this repository's asynchronous actor-learner trainer (the Sample Factory "
           "architecture, APPO): https://github.com/alex-petrenko/sample-factory describes the method.\n",
           "## Results\n", "| | |", "|---|---|", f"| Env | `{env}` |", f"| Experiment | `{exp}` |"]
    for p, (steps, version) in frames.items():
        who = f" (policy {p})" if population else ""
        out.append(f"| Env frames trained{who} | {steps:,} (latest checkpoint, policy version {version}) |")
    if not rewards:
        out.append("| Average episode reward (training) | not recorded (no TensorBoard event files) |")
    for label, (final, best, n) in sorted(rewards.items()):
        who = f" ({label.replace('p', 'policy ', 1)})" if label else ""
        out.append(f"| Average episode reward{who}: final / best during training | {final:.3f} / {best:.3f} "
                   f"({n} summar{'y' if n == 1 else 'ies'}) |")
    if evals:
        for name, policy, n, mean, _, lo, hi in evals:
            who = f", policy {policy}" if population else ""
            ci = f"[{lo:.3f}, {hi:.3f}]" if math.isfinite(lo) else "n/a (one episode)"
            out.append(f"| Evaluation `{name}`{who} | mean return {mean:.3f} over {n} episodes, 95% CI {ci} |")
    else:
        out.append(f"| Evaluation | not evaluated: `{eval_cmd}` |")
    out.append("")
    if curves is not None:
        out += ["## Learning curves\n", f"![Learning curves]({curves.name})\n",
                f"Average episode reward and throughput vs env frames (`python -m sf.plot {where}`).\n"]
    out += ["## Training\n", "The command that trained this model (its saved configuration, config.json):\n",
            _code(shlex.join(["python", "train.py", *train_command(saved)])),
            "To continue training it (`--train_for_env_steps` counts the frames already trained):\n",
            _code(f"python train.py --env {shlex.quote(env)} --experiment {shlex.quote(exp)} --train_dir "
                  f"{shlex.quote(str(exp_dir.parent))} --restart_behavior resume --train_for_env_steps 10000000000"),
            "## Hardware\n"]
    log_lines = run_log_hardware(exp_dir)
    out += [f"- The run (its log, sf_log.txt): {line}" for line in log_lines] or ["- The run: no run log (sf_log.txt)"]
    out += [f"- This machine (where the card was written, not necessarily where it trained): {this_machine()}", "",
            "## Using the model\n", "Watch it play (add `--save_video` for an .mp4):\n",
            _code(f"python -m sf.enjoy --env {shlex.quote(env)} --experiment {shlex.quote(exp)} --train_dir "
                  f"{shlex.quote(str(exp_dir.parent))}"),
            "Evaluate it (reproduces the results above; writes an evaluation CSV into the experiment directory):\n",
            _code(eval_cmd),
            "Export it to ONNX and play it with onnxruntime alone (no torch):\n",
            _code(f"python -m sf.export {where}",
                  f"python examples/onnx_play.py {shlex.quote(str(exp_dir / 'export' / 'policy_p0.onnx'))}")]
    return "\n".join(out)


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog=prog, allow_abbrev=False,
                                   description="Write EXP/README.md, a model card of the experiment.")
    add_experiment_arguments(parser)
    parser.add_argument("--force", action="store_true",
                        help="replace a README.md that the card did not write (kept otherwise)")
    return parser


def run_card(args: argparse.Namespace, prog: str) -> Path:
    """Checks the experiment (ConfigError), draws the curves, writes EXP/README.md; returns its path."""
    exp_dir = experiment_path(args.experiment, args.train_dir)
    cfg = experiment_cfg(exp_dir, prog)
    saved = read_json_object(exp_dir / "config.json", str(exp_dir / "config.json"))
    curves = exp_dir / CURVES_NAME if event_files(exp_dir) else None
    text = card_text(exp_dir, cfg, saved, curves)  # every check, before anything is written
    path = exp_dir / "README.md"
    if not args.force and not written_by_card(path):
        raise ConfigError(f"{path}: a README.md that sf.card did not write is kept; --force replaces it")
    if curves is not None:
        run_plot(argparse.Namespace(exp_dirs=[exp_dir], out=curves, smooth=0.6, panels="reward,fps", train_dir=None,
                                    title=f"{exp_dir.name} ({cfg.env})"))
    try:
        write_text_atomic(path, text)
    except OSError as e:
        raise RunError(f"cannot write {path}: {e.strerror or e}") from None
    return path


def written_by_card(path: Path) -> bool:
    """True if there is no README.md at `path` or the card wrote it (its mark is in it)."""
    try:
        return CARD_MARK in path.read_text(errors="replace")
    except FileNotFoundError:
        return True
    except OSError as e:
        raise RunError(f"cannot read {path}: {e.strerror or e}") from None


def main(argv=None, *, prog: str = "python -m sf.card") -> int:
    """`python -m sf.card`: bad input is one line on stderr and exit code 2, an I/O failure one line and exit 1."""
    def body() -> int:
        print(f"Wrote {run_card(build_parser(prog).parse_args(argv), prog)}")
        return 0

    return run_guarded(prog, body)


if __name__ == "__main__":
    sys.exit(main())
