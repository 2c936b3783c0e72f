#!/usr/bin/env python
"""Our run's settings as Sample Factory 2.1.1 flags: so that its trainer, given them, trains the same algorithm.

    python benchmarks/sf_same_settings.py train_dir/<experiment>       # the flags, and what could not be translated

Sample Factory's configuration for an env is read from its own parser, in its own Python (`sf_defaults`: every flag
with its default under its example trainer's preset). Each of its flags takes our value of the parameter of the same
name, or of the parameter it is an alias of (sf.cfg.sf_compat's table, aliases without a value mapping); a flag is
given only where our value differs from its default, so the list is also what "the same settings" change of "its
defaults". `RUN_KEYS` (the run's identity, logging, checkpoints, the device) are never translated: the caller gives
those. Parameters of ours that Sample Factory has no flag for are returned by name (`untranslated`): where one of them
changes what is trained, the two sides still differ there, and the report says so.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sf_envs.families import FAMILIES  # noqa: E402

# What the caller sets for both sides (or what does not change what is trained)
RUN_KEYS = frozenset({
    "env", "experiment", "train_dir", "restart_behavior", "seed", "device", "train_for_env_steps",
    "train_for_seconds", "save_every_sec", "keep_checkpoints", "save_best_every_sec", "save_best_metric",
    "save_best_after", "experiment_summaries_interval", "stats_avg", "heartbeat_interval",
    "heartbeat_reporting_interval", "decorrelate_experience_max_seconds", "decorrelate_envs_on_one_worker",
    "with_wandb", "wandb_user", "wandb_project", "wandb_group", "wandb_job_type", "wandb_tags", "serial_mode",
    "cli_args", "command_line", "git_hash", "git_repo_name", "train_script", "load_checkpoint_kind", "policy_index",
    "fps", "eval_env_frameskip", "max_num_frames", "max_num_episodes", "no_render", "save_video", "push_to_hub",
    # how our processes run, not what they train
    "distributed_timeout_sec", "learner_torch_threads", "policy_worker_torch_threads", "max_env_restarts",
    "max_restarts_per_hour", "num_traj_buffers", "policy_worker_batch_wait_ms", "report_interval_sec",
    "sigterm_grace_sec", "stall_timeout_sec", "sampler_only", "sync_inference_chunk", "preset_set", "random_policy",
    "eval_deterministic", "video_frames", "video_gif", "video_name", "doom_scenarios_dir",
    "doom_multiplayer_port_min", "doom_multiplayer_port_max", "doom_multiplayer_timeout_sec",
    "doom_restart_engine_steps",
})
FAMILY_PREFIXES = tuple(f.prefix for f in FAMILIES if f.prefix.endswith("_"))  # (their parameters share it)

_DEFAULTS_SCRIPT = """
import argparse, importlib, json, sys
parsers = []  # every parser Sample Factory's own parse function reads the command line with
for method in ("parse_args", "parse_known_args"):
    def recorded(self, *a, _original=getattr(argparse.ArgumentParser, method), **k):
        parsers.append(self)
        return _original(self, *a, **k)
    setattr(argparse.ArgumentParser, method, recorded)
module = importlib.import_module(sys.argv[1])
parse = next(getattr(module, n) for n in ("parse_vizdoom_cfg", "parse_atari_args", "parse_mujoco_cfg")
             if hasattr(module, n))
cfg = parse(argv=["--env", sys.argv[2]])
print("SF_DEFAULTS " + json.dumps({k: v for k, v in vars(cfg).items()
                                   if isinstance(v, (bool, int, float, str, list, type(None)))}))
choices = {a.dest: list(a.choices) for p in parsers for a in p._actions
           if a.choices and not isinstance(a.choices, dict)}
print("SF_CHOICES " + json.dumps(choices, default=str))
"""


def sf_defaults(sf_python: str, module: str, env: str) -> dict[str, Any]:
    """Every flag of Sample Factory's example trainer `module` with its value for `env` when not given, and under
    CHOICES the values each flag that has a list of them accepts."""
    out = subprocess.run([sf_python, "-c", _DEFAULTS_SCRIPT, module, env], capture_output=True, text=True)
    found = {tag: json.loads(ln[len(tag) + 1:]) for ln in out.stdout.splitlines()
             for tag in ("SF_DEFAULTS", "SF_CHOICES") if ln.startswith(tag + " ")}
    if out.returncode != 0 or len(found) != 2:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"Sample Factory's parser for {env} ({module}) failed: {tail}")
    return dict(found["SF_DEFAULTS"], **{CHOICES: found["SF_CHOICES"]})


CHOICES = "__choices__"
# Parameters that act on image observations only, in both implementations' models (Sample Factory scales its "obs" key
# whatever it holds: for a family of vector observations our value is its 1.0, i.e. theirs when not given)
IMAGE_ONLY = frozenset({"obs_scale", "obs_subtract_mean", "encoder_conv_architecture", "encoder_conv_mlp_layers"})
VECTOR_FAMILIES = ("mujoco_",)


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)) and not isinstance(ours, bool):
        return float(ours) == float(theirs)
    return ours == theirs


def _flag(name: str, value: Any) -> list[str]:
    if isinstance(value, list):
        return [f"--{name}", *map(str, value)]
    return [f"--{name}={value}"]


def translate(ours: dict[str, Any], theirs: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(Sample Factory flags giving it our values where they differ from its defaults `theirs` (`sf_defaults`), our
    parameters it has no flag or no such value for). `ours`: a run's config.json."""
    from types import SimpleNamespace

    from sf.cfg.mode import MODES
    from sf.cfg.sf_compat import SF_FLAGS
    # hts/ppo: our SGD steps per epoch are the batch's (RunMode.minibatches: one per --batch_size samples of one
    # rollout of every env), whatever --num_batches_per_epoch says; Sample Factory's sync mode takes them from
    # --num_batches_per_epoch, and refuses to start unless those minibatches make up whole rollouts
    ours = dict(ours, num_batches_per_epoch=MODES[ours["sync_mode"]].minibatches(SimpleNamespace(**ours)))
    # What a minibatch is made of. Ours: whole trajectories (--rollout steps), drawn at random with
    # --shuffle_minibatches, or single samples of the whole batch with --sample_minibatches. Sample Factory's:
    # mini-trajectories of --recurrence steps drawn at random with --shuffle_minibatches, in order without; its
    # recurrence is 1 without an RNN, so a feed-forward run of ours (MuJoCo's) gets whole trajectories there only
    # with its --recurrence at our rollout (without, it trained on single samples: another algorithm at "the same
    # settings"), and a --sample_minibatches run gets single samples only with its shuffle on
    composition = "sample_minibatches" in ours and not ours.get("use_rnn", True)
    if composition and not ours["sample_minibatches"] and ours.get("shuffle_minibatches"):
        ours = dict(ours, recurrence=ours["rollout"])
    elif composition and ours["sample_minibatches"]:
        ours = dict(ours, shuffle_minibatches=True, recurrence=1)
    alias_of = {f.name: f.target for f in SF_FLAGS if f.kind == "alias" and f.value is None}
    family = next((p for p in FAMILY_PREFIXES if ours["env"].startswith(p)), "-")
    other_family = lambda k: k.startswith(FAMILY_PREFIXES) and not k.startswith(family)  # noqa: E731
    # --sync_mode async is Sample Factory's --async_rl True; ppo its False (its alias maps values: spelled out here)
    flags = [] if (ours["sync_mode"] == "async") == bool(theirs["async_rl"]) else \
        [f"--async_rl={ours['sync_mode'] == 'async'}"]
    covered = {"sync_mode", *(["sample_minibatches"] if composition else [])}
    choices = theirs.get(CHOICES, {})
    for name, default in theirs.items():
        key = name if name in ours else alias_of.get(name)
        if key is None or key not in ours or key in RUN_KEYS or name in RUN_KEYS or other_family(key):
            continue
        if key in IMAGE_ONLY and ours["env"].startswith(VECTOR_FAMILIES):
            covered.add(key)
            continue
        value = ours[key]
        if value is None or _same(value, default):
            covered.add(key)
            continue
        if name in choices and not all(str(v) in map(str, choices[name]) for v in (value if isinstance(value, list)
                                                                                  else [value])):
            continue  # a value its command line refuses: named among the untranslated
        covered.add(key)
        flags += _flag(name, value)
    untranslated = sorted(k for k in ours if k not in covered and k not in RUN_KEYS and not other_family(k))
    return flags, untranslated


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("exp_dir", help="an experiment directory of ours (its config.json)")
    ap.add_argument("--sf_python", default=str(ROOT / ".venv-sf" / "bin" / "python"))
    ap.add_argument("--module", default=None, help="Sample Factory's example trainer (default: by the env's family)")
    args = ap.parse_args(argv)
    ours = json.loads((Path(args.exp_dir) / "config.json").read_text())
    module = args.module or SF_MODULES[ours["env"].split("_")[0]]
    flags, untranslated = translate(ours, sf_defaults(args.sf_python, module, ours["env"]))
    print(" ".join(flags))
    print(f"ours only (no Sample Factory flag): {', '.join(untranslated)}", file=sys.stderr)
    return 0


SF_MODULES = {"doom": "sf_examples.vizdoom.train_vizdoom", "atari": "sf_examples.atari.train_atari",
              "mujoco": "sf_examples.mujoco.train_mujoco"}

if __name__ == "__main__":
    sys.exit(main())
