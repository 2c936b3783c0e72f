"""Sample Factory's command lines carry over (issue 20): the training and enjoy commands of Sample Factory's own
documentation run on train.py / enjoy.py as written. Each flag of theirs is ours under the same name, an alias
(stored under our name), a flag selecting something not implemented (only what we do is accepted, anything else is
one line and exit code 2) or a flag without meaning here (accepted, one line in the run log). See
sf/cfg/sf_compat.py SF_FLAGS.
"""
import json
import shlex

import pytest

from sf.cfg import (SF_FLAGS, ConfigError, all_params, convert, parse_cfg, save_cfg, str2bool)

# --- Sample Factory's documented commands, verbatim -------------------------------------------------------------
# Sample Factory 2.x docs, "VizDoom" page (docs/09-environment-integrations/vizdoom.md)
SF2_VIZDOOM = [
    "python -m sf_examples.vizdoom.train_vizdoom --env=doom_battle --train_for_env_steps=4000000000 --algo=APPO "
    "--env_frameskip=4 --use_rnn=True --batch_size=2048 --wide_aspect_ratio=False --num_workers=20 "
    "--num_envs_per_worker=20 --num_policies=1  --experiment=doom_battle_w20_v20",
    "python -m sf_examples.vizdoom.enjoy_vizdoom --env=doom_battle --algo=APPO --experiment=doom_battle_w20_v20",
    "python -m sf_examples.vizdoom.train_vizdoom --train_for_env_steps=500000000 --algo=APPO --env=doom_my_way_home "
    "--env_frameskip=4 --use_rnn=True --num_workers=36 --num_envs_per_worker=8 --num_policies=1 --batch_size=2048 "
    "--wide_aspect_ratio=False --experiment=doom_basic_envs",
    "python -m sf_examples.vizdoom.train_vizdoom --env=doom_battle --train_for_env_steps=4000000000 --algo=APPO "
    "--env_frameskip=4 --use_rnn=True --num_workers=72 --num_envs_per_worker=8 --num_policies=1 --batch_size=2048 "
    "--wide_aspect_ratio=False --max_grad_norm=0.0 --experiment=doom_battle",
    "python -m sf_examples.vizdoom.train_vizdoom --env=doom_battle2 --train_for_env_steps=4000000000 --algo=APPO "
    "--env_frameskip=4 --use_rnn=True --num_workers=72 --num_envs_per_worker=8 --num_policies=1 --batch_size=2048 "
    "--wide_aspect_ratio=False --max_grad_norm=0.0 --experiment=doom_battle_2",
    "python -m sf_examples.vizdoom.train_vizdoom --env=doom_benchmark --algo=APPO --env_frameskip=4 --use_rnn=True "
    "--num_workers=20 --num_envs_per_worker=32 --num_policies=1 --batch_size=4096 "
    "--experiment=doom_battle_appo_fps_20_32 "
    "--res_w=128 --res_h=72 --wide_aspect_ratio=False --policy_workers_per_policy=2 --worker_num_splits=2",
    "python -m sf_examples.vizdoom.train_vizdoom --env=doom_benchmark --algo=APPO --env_frameskip=4 --use_rnn=True "
    "--num_workers=72 --num_envs_per_worker=24 --num_policies=1 --batch_size=8192 --wide_aspect_ratio=False "
    "--experiment=doom_battle_appo_w72_v24 --policy_workers_per_policy=2",
]
# same page: population-based training (8 policies) and self-play (issue 16)
SF2_VIZDOOM_PBT = [
    "python -m sf_examples.vizdoom.train_vizdoom --env=doom_duel_bots --train_for_seconds=360000 --algo=APPO "
    "--gamma=0.995 --env_frameskip=2 --use_rnn=True --reward_scale=0.5 --num_workers=72 --num_envs_per_worker=32 "
    "--num_policies=8 --batch_size=2048 --benchmark=False --res_w=128 --res_h=72 --wide_aspect_ratio=False "
    "--pbt_replace_reward_gap=0.2 --pbt_replace_reward_gap_absolute=3.0 --pbt_period_env_steps=5000000 "
    "--save_milestones_sec=1800 --with_pbt=True --experiment=doom_duel_bots",
    "python -m sf_examples.vizdoom.train_vizdoom --env=doom_deathmatch_bots --train_for_seconds=3600000 --algo=APPO "
    "--use_rnn=True --gamma=0.995 --env_frameskip=2 --num_workers=80 --num_envs_per_worker=24 --num_policies=8 "
    "--batch_size=2048 --res_w=128 --res_h=72 --wide_aspect_ratio=False --with_pbt=True --pbt_period_env_steps=5000000 "
    "--experiment=doom_deathmatch_bots",
    "python -m sf_examples.vizdoom.train_vizdoom --env=doom_duel --train_for_seconds=360000 --algo=APPO --gamma=0.995 "
    "--env_frameskip=2 --use_rnn=True --num_workers=72 --num_envs_per_worker=16 --num_policies=8 --batch_size=2048 "
    "--res_w=128 --res_h=72 --wide_aspect_ratio=False --benchmark=False --pbt_replace_reward_gap=0.5 "
    "--pbt_replace_reward_gap_absolute=0.35 --pbt_period_env_steps=5000000 --with_pbt=True "
    "--pbt_start_mutation=100000000 --experiment=doom_duel_full",
    "python -m sf_examples.vizdoom.train_vizdoom --env=doom_deathmatch_full --train_for_seconds=360000 --algo=APPO "
    "--gamma=0.995 --env_frameskip=2 --use_rnn=True --num_workers=72 --num_envs_per_worker=16 --num_policies=8 "
    "--batch_size=2048 --res_w=128 --res_h=72 --wide_aspect_ratio=False --benchmark=False --pbt_replace_reward_gap=0.1 "
    "--pbt_replace_reward_gap_absolute=0.1 --pbt_period_env_steps=5000000 --with_pbt=True "
    "--pbt_start_mutation=100000000 --experiment=doom_deathmatch_full",
]
# Sample Factory 2.x docs, "Atari" page (docs/09-environment-integrations/atari.md), the last one its
# "Better parameters (more envs, double buffering, async learning)", one flag a line there
SF2_ATARI = [
    'python -m sf_examples.atari.train_atari --algo=APPO --env=atari_breakout --experiment="Experiment Name"',
    'python -m sf_examples.atari.enjoy_atari --algo=APPO --env=atari_breakout --experiment="Experiment Name"',
    "python -m sf_examples.atari.train_atari --experiment=breakout_faster --env=atari_breakout "
    "--summaries_use_frameskip=False --num_workers=16 --num_envs_per_worker=8 --worker_num_splits=2 "
    "--train_for_env_steps=100000000 --rollout=32 --normalize_input=True --normalize_returns=True --serial_mode=False "
    "--async_rl=True --batch_size=1024 --wandb_user=<user> --wandb_project=sf2_atari_breakout "
    "--wandb_group=breakout_w16v8r32 --with_wandb=True",
]
# Sample Factory 2.x docs, "DeepMind Lab" page (docs/09-environment-integrations/dmlab.md): 4-policy PBT, refused
SF2_DMLAB_PBT = [
    "python -m sf_examples.dmlab.train_dmlab --env=dmlab_30 --train_for_env_steps=10000000000 --algo=APPO --gamma=0.99 "
    "--use_rnn=True --num_workers=90 --num_envs_per_worker=12 --num_epochs=1 --rollout=32 --recurrence=32 "
    "--batch_size=2048 --benchmark=False --max_grad_norm=0.0 --dmlab_renderer=software "
    "--decorrelate_experience_max_seconds=120 --reset_timeout_seconds=300 --encoder_conv_architecture=resnet_impala "
    "--encoder_conv_mlp_layers=512 --nonlinearity=relu --rnn_type=lstm --dmlab_extended_action_set=True "
    "--num_policies=4 --pbt_replace_reward_gap=0.05 --pbt_replace_reward_gap_absolute=5.0 "
    "--pbt_period_env_steps=10000000 --pbt_start_mutation=100000000 --with_pbt=True "
    "--experiment=dmlab_30_resnet_4pbt_w90_v12 --dmlab_one_task_per_worker=True --set_workers_cpu_affinity=True "
    "--max_policy_lag=35 --pbt_target_objective=dmlab_target_objective "
    "--dmlab30_dataset=~/datasets/brady_konkle_oliva2008 --dmlab_use_level_cache=True "
    "--dmlab_level_cache_path=/home/user/dmlab_cache",
]
# Sample Factory 2.x docs, "MuJoCo" page (docs/09-environment-integrations/mujoco.md) and the commands its model
# cards give; its flags with their MuJoCo semantics (continuous actions, the preset's schedule and KL penalty)
SF2_MUJOCO = [
    "python -m sf_examples.mujoco.train_mujoco --algo=APPO --env=mujoco_ant --experiment=Ant",
    "python -m sf_examples.mujoco.enjoy_mujoco --algo=APPO --env=mujoco_ant --experiment=Ant",
    "python -m sf_examples.mujoco.train_mujoco --algo=APPO --env=mujoco_halfcheetah --train_dir=./train_dir "
    "--experiment=HalfCheetah --lr_schedule=linear_decay --kl_loss_coeff=0.1 --adaptive_stddev=False "
    "--policy_initialization=torch_default --value_bootstrap=True --normalize_input=True --normalize_returns=True",
]
# Sample Factory 2.x docs, "Basic Usage" (docs/01-get-started/basic-usage.md) and "Weights and Biases"
# (docs/05-monitoring/wandb.md) pages
SF2_BASIC = [
    "python -m sf_examples.vizdoom.train_vizdoom --env=doom_basic --experiment=DoomBasic --train_dir=./train_dir "
    "--num_workers=16 --num_envs_per_worker=10 --train_for_env_steps=1000000",
    "python -m sf_examples.vizdoom.enjoy_vizdoom --env=doom_basic --experiment=DoomBasic --train_dir=./train_dir",
    "python -m sf_examples.vizdoom.train_vizdoom --env=doom_basic --experiment=DoomBasic --train_dir=./train_dir "
    "--num_workers=20 --num_envs_per_worker=16 --train_for_env_steps=1000000 "
    "--with_wandb=True --wandb_user=<your_wandb_user> --wandb_tags test doom appo",
]
# Sample Factory 2.x docs, "Hugging Face Hub" page (docs/10-huggingface/huggingface.md): uploads are refused
SF2_HF = [
    "python -m sf_examples.mujoco.enjoy_mujoco --algo=APPO --env=mujoco_ant --experiment=<repo_name> "
    "--train_dir=./train_dir --max_num_episodes=10 --push_to_hub --hf_repository=<username>/<hf_repo_name> "
    "--save_video --no_render",
]
# Sample Factory 1.x README ("Running experiments", the paper's repository), Sample Factory 1.x flag names
SF1_README = [
    "python -m algorithms.appo.train_appo --env=doom_battle --train_for_env_steps=4000000000 --algo=APPO "
    "--env_frameskip=4 --use_rnn=True --ppo_epochs=1 --rollout=32 --recurrence=32 --batch_size=2048 "
    "--wide_aspect_ratio=False --num_workers=20 --num_envs_per_worker=20 --num_policies=1  "
    "--experiment=doom_battle_w20_v20",
    "python -m algorithms.appo.enjoy_appo --env=doom_battle --algo=APPO --experiment=doom_battle_w20_v20",
    "python -m algorithms.appo.train_appo --train_for_env_steps=500000000 --algo=APPO --env=doom_my_way_home "
    "--env_frameskip=4 --use_rnn=True --num_workers=36 --num_envs_per_worker=8 --num_policies=1 --ppo_epochs=1 "
    "--rollout=32 --recurrence=32 --batch_size=2048 --wide_aspect_ratio=False --experiment=doom_basic_envs",
    "python -m algorithms.appo.train_appo --env=doom_battle2 --train_for_env_steps=4000000000 --algo=APPO "
    "--env_frameskip=4 --use_rnn=True --num_workers=72 --num_envs_per_worker=8 --num_policies=1 --ppo_epochs=1 "
    "--rollout=32 --recurrence=32 --batch_size=2048 --wide_aspect_ratio=False --max_grad_norm=0.0 "
    "--experiment=doom_battle_2",
    "python -m algorithms.appo.train_appo --env=doom_benchmark --algo=APPO --env_frameskip=4 --use_rnn=True "
    "--num_workers=20 --num_envs_per_worker=32 --num_policies=1 --ppo_epochs=1 --rollout=32 --recurrence=32 "
    "--batch_size=4096 --experiment=doom_battle_appo_fps_20_32 --res_w=128 --res_h=72 --wide_aspect_ratio=False "
    "--policy_workers_per_policy=2 --worker_num_splits=2",
]
SF1_README_PBT = [
    "python -m algorithms.appo.train_appo --env=doom_duel_bots --train_for_seconds=360000 --algo=APPO --gamma=0.995 "
    "--env_frameskip=2 --use_rnn=True --reward_scale=0.5 --num_workers=72 --num_envs_per_worker=32 --num_policies=8 "
    "--ppo_epochs=1 --rollout=32 --recurrence=32 --batch_size=2048 --benchmark=False --res_w=128 --res_h=72 "
    "--wide_aspect_ratio=False --pbt_replace_reward_gap=0.2 --pbt_replace_reward_gap_absolute=3.0 "
    "--pbt_period_env_steps=5000000 --save_milestones_sec=1800 --with_pbt=True --experiment=doom_duel_bots",
]
SF1_README_REFUSED = [
    "python -m algorithms.appo.train_appo --env=dmlab_30 --train_for_seconds=3600000 --algo=APPO --gamma=0.99 "
    "--use_rnn=True --num_workers=90 --num_envs_per_worker=12 --ppo_epochs=1 --rollout=32 --recurrence=32 "
    "--batch_size=2048 --benchmark=False --ppo_epochs=1 --max_grad_norm=0.0 --dmlab_renderer=software "
    "--decorrelate_experience_max_seconds=120 --reset_timeout_seconds=300 --encoder_custom=dmlab_instructions "
    "--encoder_type=resnet --encoder_subtype=resnet_impala --encoder_extra_fc_layers=1 --hidden_size=256 "
    "--nonlinearity=relu --rnn_type=lstm --dmlab_extended_action_set=True --num_policies=4 "
    "--pbt_replace_reward_gap=0.05 --pbt_replace_reward_gap_absolute=5.0 --pbt_period_env_steps=10000000 "
    "--pbt_start_mutation=100000000 --with_pbt=True --experiment=dmlab_30_resnet_4pbt_w90_v12 "
    "--dmlab_one_task_per_worker=True --set_workers_cpu_affinity=True --max_policy_lag=35 "
    "--pbt_target_objective=dmlab_target_objective --dmlab30_dataset=~/datasets/brady_konkle_oliva2008 "
    "--dmlab_use_level_cache=True --dmlab_level_cache_path=/home/user/dmlab_cache",
    # "Dummy sampler": a random-policy sampling benchmark (here: --random_policy True)
    "python -m run_algorithm --algo=DUMMY_SAMPLER --env=doom_benchmark --num_workers=20 --num_envs_per_worker=1 "
    "--experiment=dummy_sampler --sample_env_frames=5000000",
]
# The issue's command (issue 20)
ISSUE = ["python train.py --env=doom_battle --algo=APPO --env_frameskip=4 --use_rnn=True --batch_size=2048 "
         "--wide_aspect_ratio=False --num_workers=20 --num_envs_per_worker=20 --num_policies=1 "
         "--experiment=doom_battle_w20_v20"]

ACCEPTED = SF2_VIZDOOM + SF2_VIZDOOM_PBT + SF2_ATARI + SF2_MUJOCO + SF2_BASIC + SF1_README + SF1_README_PBT + ISSUE
REFUSED = SF2_DMLAB_PBT + SF2_HF + SF1_README_REFUSED  # DMLab's objective, Hub uploads, custom encoders, DUMMY_SAMPLER
PARAMS = {p.name: p for p in all_params()}
ALIASES = {f.name: f for f in SF_FLAGS if f.kind == "alias"}


def _split(command: str, tmp_path) -> tuple[list[str], str]:
    """The flags of a documented command (after `python -m module` / `python script.py`), with --train_dir under
    tmp_path (a documented --train_dir too), and the mode: enjoy for Sample Factory's enjoy scripts."""
    words = shlex.split(command)
    first = next(i for i, w in enumerate(words) if w.startswith("--"))
    args = [w for w in words[first:] if not w.startswith("--train_dir=")] + ["--train_dir", str(tmp_path)]
    return args, "enjoy" if "enjoy" in " ".join(words[:first]) else "train"


def _given(args: list[str]) -> dict[str, str]:
    """--name=value pairs of a command line."""
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


@pytest.mark.parametrize("command", ACCEPTED)
def test_documented_commands_parse_as_written(command, tmp_path):
    args, mode = _split(command, tmp_path)
    cfg = parse_cfg(args, mode=mode, prog="enjoy.py" if mode == "enjoy" else "train.py")
    for name, value in _given(args).items():  # every value landed on our parameter, aliases under our name
        if name in PARAMS:
            assert getattr(cfg, name) == convert(PARAMS[name], value), name
        elif name in ALIASES and ALIASES[name].value is None:
            assert getattr(cfg, ALIASES[name].target) == convert(PARAMS[ALIASES[name].target], value), name
        else:
            assert not hasattr(cfg, name), name  # SF's flags without a parameter here are not stored


def test_issue_command_values_and_notes(tmp_path):
    args, _ = _split(ISSUE[0], tmp_path)
    cfg = parse_cfg(args)
    assert (cfg.env, cfg.env_frameskip, cfg.use_rnn, cfg.batch_size) == ("doom_battle", 4, True, 2048)
    assert (cfg.num_workers, cfg.num_envs_per_worker, cfg.experiment) == (20, 20, "doom_battle_w20_v20")
    assert not hasattr(cfg, "algo") and not hasattr(cfg, "wide_aspect_ratio") and cfg.num_policies == 1
    assert any(n.startswith("--wide_aspect_ratio False: ") for n in cfg._notes), cfg._notes


@pytest.mark.parametrize("command", REFUSED)
def test_documented_commands_selecting_what_is_not_implemented_are_one_line(command, tmp_path):
    args, mode = _split(command, tmp_path)
    with pytest.raises(ConfigError) as e:
        parse_cfg(args, mode=mode)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(("--algo ", "--push_to_hub ", "--encoder_", "--pbt_target_objective ")), msg


def test_pbt_command_lands_on_the_population_parameters(tmp_path):
    args, _ = _split(SF2_VIZDOOM_PBT[2], tmp_path)  # the self-play duel of the paper
    cfg = parse_cfg(args)
    assert (cfg.env, cfg.num_policies, cfg.with_pbt, cfg.pbt_period_env_steps) == ("doom_duel", 8, True, 5_000_000)
    assert (cfg.pbt_replace_reward_gap, cfg.pbt_replace_reward_gap_absolute) == (0.5, 0.35)
    assert cfg.pbt_start_mutation == 100_000_000


# --- aliases ----------------------------------------------------------------------------------------------------
def _parse(tmp_path, *args, env="test_corridor", mode="train"):
    return parse_cfg(["--env", env, "--train_dir", str(tmp_path), *args], mode=mode)


@pytest.mark.parametrize("args, param, value", [
    (["--ppo_epochs=3"], "num_epochs", 3),
    (["--ppo_epochs", "3"], "num_epochs", 3),  # --flag value as well as --flag=value
    (["--num_batches_per_iteration=2"], "num_batches_per_epoch", 2),
    (["--async_rl=False"], "sync_mode", "ppo"),
    (["--async_rl", "True"], "sync_mode", "async"),
    (["--async_rl=False", "--sync_mode=hts"], "sync_mode", "hts"),  # both synchronous: they agree
    (["--res_w=96", "--res_h=64"], "doom_res_w", 96),
    (["--res_h=64"], "doom_res_h", 64),
    (["--env_framestack=2"], "atari_framestack", 2),
    (["--encoder_subtype=convnet_atari"], "encoder_conv_architecture", "convnet_atari"),
    (["--encoder_subtype=resnet_impala"], "encoder_conv_architecture", "resnet_impala"),
    (["--num_bots=3"], "doom_num_bots", 3),
    (["--num_bots=-1"], "doom_num_bots", None),  # SF's "the scenario's default"
    (["--timelimit=2.5"], "doom_bots_timelimit", 2.5),
    (["--timelimit=None"], "doom_bots_timelimit", 4.0),  # SF's default: ours
    (["--dmlab30_dataset=/data/bko"], "dmlab_dataset_path", "/data/bko"),
    (["--dmlab_level_cache_path=/data/cache"], "dmlab_level_cache_dir", "/data/cache"),
    (["--device=gpu"], "device", "cuda"),  # SF's spelling of a value (checked: here there may be no CUDA)
])
def test_aliases_land_on_our_parameter(tmp_path, args, param, value, monkeypatch):
    if param == "device":
        import torch
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = _parse(tmp_path, *args)
    assert getattr(cfg, param) == value
    saved = json.loads(save_cfg(cfg, tmp_path / "e").read_text())
    assert saved[param] == value
    # aliases not stored
    assert not {a.split("=")[0][2:] for a in args if a.startswith("--")} - set(PARAMS) & set(saved)


def test_device_gpu_without_cuda_is_one_line(tmp_path, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError,
                       match=r"^--device cuda: no CUDA device is available here; use --device auto or cpu$"):
        _parse(tmp_path, "--device=gpu")


def test_alias_wins_over_the_preset_and_the_saved_config(tmp_path):
    assert _parse(tmp_path, "--ppo_epochs=1", env="doom_basic").num_epochs == 1  # the doom_basic preset says 4
    exp = tmp_path / "e"
    exp.mkdir()
    (exp / "config.json").write_text(json.dumps({"num_epochs": 5}))
    assert _parse(tmp_path, "--experiment", "e").num_epochs == 5
    assert _parse(tmp_path, "--experiment", "e", "--ppo_epochs", "2").num_epochs == 2


@pytest.mark.parametrize("args, needle", [
    (["--ppo_epochs=2", "--num_epochs=3"], "--ppo_epochs 2 conflicts with --num_epochs 3"),
    (["--async_rl=True", "--sync_mode=hts"], "--async_rl True conflicts with --sync_mode hts"),
    (["--async_rl=False", "--sync_mode=async"], "--async_rl False conflicts with --sync_mode async"),
    (["--ppo_epochs=0"], "--ppo_epochs must be in [1, 1024] (got 0)"),  # checked as the target, named as given
    (["--res_w=abc"], "--res_w: expected an integer, got 'abc'"),
    (["--async_rl=maybe"], "--async_rl: expected True or False, got 'maybe'"),
    (["--encoder_subtype=resnet"], "--encoder_subtype must be one of auto, convnet_simple, convnet_impala, "
                                   "convnet_atari, resnet_impala"),
])
def test_alias_mistakes_are_one_line(tmp_path, args, needle):
    with pytest.raises(ConfigError) as e:
        _parse(tmp_path, *args)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


# --- refused and ignored flags ----------------------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.parametrize("script, args, needle", [
    ("train.py", ["--algo=A2C"], "--algo A2C: only APPO is implemented here"),
    ("train.py", ["--pbt_optimize_gamma=True"], "--pbt_optimize_gamma True: PBT mutates the learning rate"),
    ("train.py", ["--num_policies=2", "--sync_mode=hts"], "--sync_mode hts trains one policy; a population"),
])
def test_refused_flags_one_line_exit_2(entry, tmp_path, script, args, needle):
    res = entry(script, "--env", "test_corridor", "--train_dir", str(tmp_path), *args)
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("args, needle", [
    (["--wide_aspect_ratio=True"], "--wide_aspect_ratio True: the game renders 4:3"),
    (["--num_agents=2"], "--num_agents 2: the env decides how many agents it hosts"),
    (["--decoder_mlp_layers", "64"], "--decoder_mlp_layers 64: no layers between the core and the heads"),
    (["--encoder_type=transformer"], "--encoder_type transformer: conv, mlp or resnet"),
    (["--pbt_optimize_batch_size"], "--pbt_optimize_batch_size True:"),  # a bare boolean flag means True, as in SF
    (["--num_policies=x"], "--num_policies: expected an integer, got 'x'"),
])
def test_refused_values_name_the_flag_and_what_is_supported(tmp_path, args, needle):
    with pytest.raises(ConfigError) as e:
        _parse(tmp_path, *args)
    assert str(e.value).startswith(needle) and "\n" not in str(e.value), str(e.value)


def test_supported_values_of_selecting_flags_are_accepted_silently(tmp_path):
    cfg = _parse(tmp_path, "--algo=APPO", "--num_policies=1", "--with_pbt=False", "--kl_loss_coeff=0",
                 "--exploration_loss=entropy", "--optimizer=adam", "--lr_schedule=constant", "--rnn_num_layers=1",
                 "--decoder_mlp_layers", "--num_agents=-1", "--num_humans=0", "--use_cpc=False")
    assert [n for n in cfg._notes if not n.startswith(("--seed ", "--num_envs_per_worker "))] == []
    cfg = _parse(tmp_path, "--policy_index=0", "--push_to_hub=False", "--eval_env_frameskip=None", mode="enjoy")
    assert cfg._notes == ()


def test_ignored_flags_are_noted_not_stored(tmp_path):
    cfg = _parse(tmp_path, "--benchmark", "--summaries_use_frameskip=False", "--decorrelate_experience_max_seconds=120",
                 "--decorrelate_envs_on_one_worker=True", "--num_minibatches_to_accumulate=2",
                 "--actor_worker_gpus", "0", "1")
    notes = cfg._notes
    assert "--benchmark True: ignored; Sample Factory's benchmark mode; see --sampler_only, --random_policy" in notes
    assert any(n.startswith("--summaries_use_frameskip False: ignored; ") for n in notes), notes
    assert ("--decorrelate_experience_max_seconds 120, --decorrelate_envs_on_one_worker True: ignored; no start-up "
            "decorrelation delays here: envs are seeded apart") in notes  # one line for the flags of one reason
    assert any(n.startswith("--actor_worker_gpus 0 1: ignored; ") for n in notes), notes
    assert all("\n" not in n for n in notes)
    saved = json.loads(save_cfg(cfg, tmp_path / "e").read_text())
    assert not {"benchmark", "summaries_use_frameskip", "decorrelate_experience_max_seconds",
                "actor_worker_gpus"} & set(saved)
    with pytest.raises(ConfigError, match=r"^--num_minibatches_to_accumulate: expected an integer, got 'x'$"):
        _parse(tmp_path, "--num_minibatches_to_accumulate=x")  # the type is still checked


def test_every_sf_flag_is_classified_once_and_never_shadows_a_parameter():
    names = [f.name for f in SF_FLAGS]
    assert len(names) == len(set(names))
    assert not set(names) & set(PARAMS)
    for f in SF_FLAGS:
        assert f.kind in ("alias", "only", "ignored"), f
        assert (f.target in PARAMS) if f.kind == "alias" else (f.ok or f.kind == "ignored"), f
        assert f.why or f.kind == "alias", f


# --- booleans, W&B and the new parameters -----------------------------------------------------------------------
@pytest.mark.parametrize("spelling, value", [("True", True), ("False", False), ("true", True), ("false", False),
                                             ("t", True), ("f", False), ("1", True), ("0", False), ("yes", True),
                                             ("no", False), ("y", True), ("n", False)])
def test_sample_factory_boolean_spellings(tmp_path, spelling, value):
    assert str2bool(spelling) is value  # Sample Factory's str2bool: yes/true/t/y/1, no/false/f/n/0
    assert _parse(tmp_path, f"--use_rnn={spelling}").use_rnn is value
    assert _parse(tmp_path, "--normalize_input", spelling).normalize_input is value


def test_wandb_parameters(tmp_path):
    cfg = _parse(tmp_path)
    assert (cfg.with_wandb, cfg.wandb_user, cfg.wandb_project, cfg.wandb_group, cfg.wandb_job_type, cfg.wandb_tags) == \
        (False, None, "sf", None, None, [])
    cfg = _parse(tmp_path, "--with_wandb=True", "--wandb_user=me", "--wandb_project=p", "--wandb_group", "g",
                 "--wandb_job_type=SF", "--wandb_tags", "test", "doom", "appo")
    assert (cfg.with_wandb, cfg.wandb_user, cfg.wandb_project, cfg.wandb_group, cfg.wandb_job_type, cfg.wandb_tags) == \
        (True, "me", "p", "g", "SF", ["test", "doom", "appo"])
    assert json.loads(save_cfg(cfg, tmp_path / "e").read_text())["wandb_tags"] == ["test", "doom", "appo"]
    assert _parse(tmp_path, "--experiment", "e").wandb_tags == ["test", "doom", "appo"]  # resumed from config.json
    assert _parse(tmp_path, "--experiment", "e", "--wandb_tags").wandb_tags == []  # a flag with no tags clears them
    for args, needle in [(["--wandb_project=a/b"], "--wandb_project must not contain any of"),
                         (["--wandb_tags", "x" * 65], "--wandb_tags entries must be at most 64 characters"),
                         (["--wandb_user="], "--wandb_user must not be empty")]:
        with pytest.raises(ConfigError) as e:
            _parse(tmp_path, *args)
        assert str(e.value).startswith(needle), str(e.value)


def test_reward_scale_and_milestones_parameters(tmp_path):
    cfg = _parse(tmp_path)
    assert (cfg.reward_scale, cfg.reward_clip, cfg.save_milestones_sec) == (1.0, 1000.0, -1)  # Sample Factory's
    cfg = _parse(tmp_path, "--reward_scale=0.5", "--reward_clip=10", "--save_milestones_sec=1800")
    assert (cfg.reward_scale, cfg.reward_clip, cfg.save_milestones_sec) == (0.5, 10.0, 1800)


@pytest.mark.e2e
def test_help_lists_sample_factory_flags(entry):
    out = " ".join(entry("train.py", "--help").stdout.split())
    assert "--ppo_epochs PPO_EPOCHS Sample Factory's name for --num_epochs" in out
    assert "--algo ALGO Accepted: APPO; anything else is refused" in out
    assert "--wide_aspect_ratio [WIDE_ASPECT_RATIO]" in out and "--benchmark [BENCHMARK] Accepted and ignored" in out
    for name in ("with_wandb", "wandb_user", "wandb_project", "wandb_group", "wandb_job_type", "wandb_tags",
                 "reward_scale", "save_milestones_sec", "async_rl", "res_w"):
        assert f"--{name}" in out, name
    out = entry("enjoy.py", "--help").stdout
    assert "--policy_index" in out and "--push_to_hub" in out and "--ppo_epochs" not in out


# --- one real run -----------------------------------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.doom
def test_sample_factory_command_trains_end_to_end(entry, tmp_path):
    """Sample Factory's basic VizDoom command (docs "Basic Usage") with its usual extra flags, on 1 worker."""
    pytest.importorskip("vizdoom")
    args, _ = _split("python -m sf_examples.vizdoom.train_vizdoom --env=doom_basic --experiment=DoomBasic "
                     "--train_dir=./train_dir --num_workers=16 --num_envs_per_worker=10 --train_for_env_steps=1000000 "
                     "--algo=APPO --env_frameskip=4 --use_rnn=True --ppo_epochs=1 --wide_aspect_ratio=False "
                     "--num_policies=1 --benchmark=False --async_rl=True --device=cpu", tmp_path)
    res = entry("train.py", *args, "--train_for_env_steps", "2000", "--num_workers", "1", "--num_envs_per_worker", "4",
                timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    log = (tmp_path / "DoomBasic" / "sf_log.txt").read_text()
    assert "--wide_aspect_ratio False: " in log and "--benchmark False: ignored; " in log
    saved = json.loads((tmp_path / "DoomBasic" / "config.json").read_text())
    assert saved["num_epochs"] == 1 and saved["sync_mode"] == "async" and saved["use_rnn"] is True
    assert not {"ppo_epochs", "algo", "wide_aspect_ratio", "benchmark", "async_rl"} & set(saved)
    assert saved["num_policies"] == 1
    assert list((tmp_path / "DoomBasic" / "checkpoint_p0").glob("checkpoint_*.pth"))
