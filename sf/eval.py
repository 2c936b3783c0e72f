"""Evaluate a trained experiment: a fixed number of episodes in parallel, one CSV row per episode, the mean return with
its confidence interval per policy.

    python -m sf.eval train_dir/NAME --episodes 1000 [--num_workers N] [--num_envs_per_worker K] [--deterministic]
                      [--env_engine native|envpool] [--env_agents A]
                      [--seed S] [--csv FILE] [--policy P] [--load_checkpoint_kind latest|best] [--device D]
    python -m sf.eval NAME --train_dir DIR --episodes 1000

The episodes run on the processes of training's sampler (rollout workers and policy workers, started, supervised and
stopped by the runner's lifecycle, sf/runner/evaluator.py: a first Ctrl-C stops every process and writes nothing, a
second one kills them at once) without its learners: each policy's weights come from its checkpoint
(sf/policy_loading.py) and are published once into the shared weights. The layout defaults to the experiment's
(config.json); the model, env and its parameters are the experiment's; the device is this machine's (--device, else
auto).

Policies. Every policy of a population plays (agent i of the run, counted over rollout workers, envs and agents, is
played by policy i % num_policies: --policy_mapping fixed, so a multi-agent env such as test_race or doom_duel plays a
match between policies), or only --policy P (every agent). Each policy that plays is evaluated on --episodes episodes.

Repeatability: the same flags (seed, layout, checkpoint) give the same CSV but for its wall_time column. Every env is
seeded from --seed (sf/seeding.py's ENV stream; env_seed is the seed of its first reset, its later episodes follow
from it), every agent draws the noise of its actions from its own stream (ACTION_NOISE; --deterministic: the most
likely action instead) and the policy workers run the model on fixed-size chunks of rows, so no action depends on how
requests were batched; and which episodes count is fixed in advance: each agent records its first episodes up to a
quota (sf/sampling/evaluation.py), an episode still running when its agent met the quota is discarded.

CSV (default EXP/eval_<checkpoint>_seed<S>_<episodes>ep[_argmax][_p<P>].csv, written atomically once every
episode is in): episode (0.. in the order of the rows: by policy, then agent of the run, then time), policy, agent (its
index in its env), env_seed, return (the env's episode reward, unshaped units as training reports them), length (env
frames), true_objective (the win where the env reports wins, else the game score, else empty), wall_time (seconds the
episode took). Printed per policy: the mean return, the sample standard deviation and a 95% confidence interval
mean +- t(0.975, n-1) * std / sqrt(n) (Student's t).

Bad input (a missing or foreign experiment directory, --episodes below 1, a --csv that cannot be written, --policy out
of range, ...) is one line on stderr and exit code 2, before anything runs or is written.
"""
from __future__ import annotations

import argparse
import csv
import io
import logging
import math
import os
import sys
from pathlib import Path

from sf.cfg import (ConfigError, OneLineArgumentParser, Param, RunError, optional_int, parse_cfg, run_guarded, str2bool,
                    verify)
from sf.cfg.params import all_params
from sf.cfg.shape import RunShape
from sf.cfg.validate import from_command_line
from sf.export import add_experiment_arguments, experiment_env, experiment_path
from sf.sampling.evaluation import EvalPlan
from sf.utils.files import temp_path, write_text_atomic
from sf.utils.stats import t_quantile
from sf_envs.registry import env_spec

COLUMNS = ("episode", "policy", "agent", "env_seed", "return", "length", "true_objective", "wall_time")
CONFIDENCE = 0.95
_TABLE = {p.name: p for p in all_params()}
# sf.eval's own flags, checked like the table's (one line naming the flag and the valid range)
EPISODES = Param("episodes", int, None, "Episodes per policy that plays", min_value=1, max_value=10**9)
POLICY = Param("policy", optional_int, None, "Evaluate only this policy of the population (it plays every agent)",
               min_value=0, max_value=63)
SEED = Param("seed", int, 0, "Seed of the envs and of the action noise", min_value=0, max_value=2**32 - 1)
DETERMINISTIC = Param("deterministic", str2bool, False, "Take the most likely action instead of sampling")


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog=prog, allow_abbrev=False, description=__doc__.split("\n\n")[0])
    add_experiment_arguments(parser)
    parser.add_argument("--episodes", required=True, help=f"{EPISODES.help}; range [1, 1e9]")
    parser.add_argument("--num_workers", help="rollout worker processes (default: the experiment's)")
    parser.add_argument("--num_envs_per_worker", help="envs per rollout worker (default: the experiment's)")
    parser.add_argument("--env_engine", help="what steps the env: native or envpool (default: the experiment's; a "
                        "policy trained on either engine plays on the other)")
    parser.add_argument("--env_agents", help="--env_engine envpool: games per pool (default: the experiment's)")
    parser.add_argument("--deterministic", nargs="?", const="True", default="False", help=DETERMINISTIC.help)
    parser.add_argument("--seed", default="0", help=f"{SEED.help}; range [0, {2**32 - 1}] (default: 0)")
    parser.add_argument("--csv", help="the CSV to write (default: EXP/eval_<checkpoint>_seed<S>_<N>ep...csv)")
    parser.add_argument("--policy", help=POLICY.help)
    parser.add_argument("--load_checkpoint_kind", default="latest", help="checkpoint to load: latest or best")
    parser.add_argument("--device", help="the policy workers' device: auto, cpu or cuda (default: auto, CUDA when "
                                         "this machine has it, else CPU; not the experiment's)")
    return parser


# --- the configuration -------------------------------------------------------------------------------------------
def resolve(args: argparse.Namespace, prog: str):
    """(cfg, with its EvalPlan as cfg._eval_plan; the CSV's path) from the command line and the experiment's
    config.json; every check of the input, in one line each (ConfigError), before anything runs or is written."""
    episodes = from_command_line(EPISODES, args.episodes)
    policy = from_command_line(POLICY, args.policy)
    deterministic = from_command_line(DETERMINISTIC, args.deterministic)
    seed = from_command_line(SEED, args.seed)  # (never None: the episodes must be repeatable)
    exp_dir = experiment_path(args.experiment, args.train_dir)
    env = experiment_env(exp_dir)
    argv = ["--env", env, "--experiment", exp_dir.name, "--train_dir", str(exp_dir.parent), "--seed", str(seed),
            "--load_checkpoint_kind", args.load_checkpoint_kind, "--eval_deterministic", str(deterministic)]
    if args.device is not None:
        argv += ["--device", args.device]
    layout = {name: from_command_line(_TABLE[name], getattr(args, name))  # training's flags: checked as train.py does
              for name in ("num_workers", "num_envs_per_worker", "env_engine", "env_agents")
              if getattr(args, name) is not None}
    # the sampler alone: no learner, PBT, W&B, serial mode or self-healing (a replaced worker would replay episodes)
    cfg = parse_cfg(argv, mode="enjoy", prog=prog).replace(
        **layout, sync_mode="async", sampler_only=False, random_policy=False, serial_mode=False, with_pbt=False,
        with_wandb=False, max_restarts_per_hour=0)
    verify(cfg, "enjoy")
    if policy is not None and policy >= cfg.num_policies:
        have = "policy 0" if cfg.num_policies == 1 else f"policies 0-{cfg.num_policies - 1}"
        raise ConfigError(f"--policy {policy}: the experiment has {have} (--num_policies {cfg.num_policies})")
    agents_per_env = env_spec(cfg.env, cfg).num_agents
    shape = RunShape.of_evaluation(cfg, agents_per_env, slots=0)  # (the layout's sizes; the slots come with the plan)
    num_agents = shape.agents
    playing = 1 if policy is not None else cfg.num_policies
    if num_agents < playing:
        raise ConfigError(f"{cfg.num_workers} rollout workers x {cfg.num_envs_per_worker} envs x {agents_per_env} "
                          f"agents cannot play all {playing} policies: raise --num_envs_per_worker or --num_workers, "
                          "or evaluate one policy with --policy")
    # the policy workers run the model on chunks of this many rows (fixed bits whatever the batching): one group's
    # agents of one policy, so that a request is one chunk
    group = shape.agents_per_group
    cfg = cfg.replace(_eval_plan=EvalPlan.make(num_agents, cfg.num_policies, episodes, policy),
                      sync_inference_chunk=max(1, -(-group // playing)))
    # (an engine other than the env's own is in the name: the same checkpoint evaluated on both keeps both CSVs)
    name = (f"eval_{cfg.load_checkpoint_kind}_seed{cfg.seed}_{episodes}ep{'_argmax' if deterministic else ''}"
            f"{'' if policy is None else f'_p{policy}'}{'' if cfg.env_engine == 'native' else f'_{cfg.env_engine}'}"
            ".csv")
    path = Path(args.csv) if args.csv is not None else exp_dir / name
    check_csv_path(path, "--csv" if args.csv is not None else "the CSV")
    return cfg, path


def check_csv_path(path: Path, flag: str) -> None:
    """Whether `path` can be written (a file created beside it, then removed); ConfigError naming the flag if not."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; give a file name in it, such as {path / 'eval.csv'}")
    probe = temp_path(path)
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"{flag} {path} cannot be written: {e.strerror or e} (in directory {path.parent})") from None


# --- statistics ------------------------------------------------------------------------------------------------
def summarize(returns: list[float]) -> tuple[float, float, float, float]:
    """(mean, sample standard deviation, CI low, CI high) of the returns: mean +- t(0.975, n-1) * std / sqrt(n); NaN
    where n is too small (std and CI need 2 episodes)."""
    n = len(returns)
    mean = math.fsum(returns) / n
    if n < 2:
        return mean, math.nan, math.nan, math.nan
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in returns) / (n - 1))
    half = t_quantile((1 + CONFIDENCE) / 2, n - 1) * std / math.sqrt(n)
    return mean, std, mean - half, mean + half


# --- the run -----------------------------------------------------------------------------------------------------
def rows_of(rows: list[dict], agents_per_env: int) -> list[dict]:
    """The CSV's rows from the workers' (sf/sampling/evaluation.py): sorted by policy, agent of the run and the
    agent's episode index, numbered."""
    out = []
    for n, r in enumerate(sorted(rows, key=lambda r: (r["policy"], r["agent"], r["index"]))):
        out.append({"episode": n, "policy": r["policy"], "agent": r["agent"] % agents_per_env,
                    "env_seed": r["env_seed"], "return": repr(r["return"]), "length": r["length"],
                    "true_objective": "" if r["true_objective"] is None else repr(r["true_objective"]),
                    "wall_time": f"{r['wall_time']:.3f}"})
    return out


def csv_text(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def report(rows: list[dict], path: Path, evaluator) -> None:
    """The console's summary: throughput, then per policy the mean return, its std and confidence interval."""
    frames = sum(int(r["length"]) for r in rows)
    seconds = max(evaluator.done_at - evaluator.sampling_since, 1e-9)
    print(f"Evaluated {len(rows)} episodes ({frames} env frames) in {seconds:.1f} s: {frames / seconds:.0f} env "
          f"frames/s (from the moment every process had started to the last episode)")
    for p in sorted({r["policy"] for r in rows}):
        mine = [r for r in rows if r["policy"] == p]
        mean, std, lo, hi = summarize([float(r["return"]) for r in mine])
        objective = [float(r["true_objective"]) for r in mine if r["true_objective"] != ""]
        extra = f", true objective mean {math.fsum(objective) / len(objective):.6g}" if objective else ""
        print(f"Policy {p}: {len(mine)} episodes, return mean {mean:.6g}, std {std:.6g}, "
              f"{CONFIDENCE:.0%} CI [{lo:.6g}, {hi:.6g}] (Student's t, {len(mine) - 1} degrees of freedom){extra}")
    print(f"CSV: {path}")


def run_eval(args: argparse.Namespace, prog: str) -> int:
    cfg, path = resolve(args, prog)
    # (torch and the runner imported here: --help and bad input stay instant)
    from sf.runner.evaluator import Evaluator
    from sf.runner.startup.preflight import report_background_errors, setup_logging
    evaluator = Evaluator(cfg)  # the last checks: the env, the checkpoints, memory
    logging.getLogger().removeHandler(setup_logging())  # the console only: nothing goes to the experiment directory
    report_background_errors()
    plan = cfg._eval_plan
    print(f"Evaluating {evaluator.exp_dir} ({cfg.load_checkpoint_kind} checkpoint): "
          f"{plan.total // len(evaluator.policies)} episodes of each of policies "
          f"{', '.join(map(str, evaluator.policies))} on {cfg.num_workers} rollout "
          f"workers x {cfg.num_envs_per_worker} envs, seed {cfg.seed}, "
          f"{'the most likely actions' if cfg.eval_deterministic else 'sampled actions'}, policy workers on "
          f"{evaluator.device}", flush=True)
    code = evaluator.run()
    if code != 0:
        what = "interrupted" if code == 130 else "failed (see the lines above)"
        print(f"{prog}: evaluation {what} after {len(evaluator.rows)} of {plan.total} episodes; no CSV written",
              file=sys.stderr)
        return code
    rows = rows_of(evaluator.rows, evaluator.spec.num_agents)
    try:
        write_text_atomic(path, csv_text(rows))
    except OSError as e:
        raise RunError(f"cannot write {path}: {e.strerror or e}") from None
    report(rows, path, evaluator)
    return 0


def main(argv=None, *, prog: str = "python -m sf.eval") -> int:
    """Bad input: one line on stderr, exit code 2; an I/O failure: one line, exit code 1."""
    return run_guarded(prog, lambda: run_eval(build_parser(prog).parse_args(argv), prog))


if __name__ == "__main__":
    sys.exit(main())
