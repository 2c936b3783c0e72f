"""Every flag of Sample Factory 2.1.1's command lines: its core parser (training and evaluation) and the env
parameters of its examples (VizDoom, MuJoCo, DMLab; Atari adds none). Read off Sample Factory 2.1.1 itself
(`sample_factory.cfg.arguments.parse_sf_args(evaluation=True)` plus `add_doom_env_args`, `add_doom_env_eval_args`,
`add_mujoco_env_args`, `add_dmlab_env_args`, each on a parser of its own: Doom and DMLab both define --res_w). Each
one is ours under the same name or listed in sf.cfg.sf_compat.SF_FLAGS; tests/cfg/test_sf_flag_walk.py walks them."""

SF_2_1_1_FLAGS: tuple[str, ...] = (
    "actor_critic_share_weights", "actor_worker_gpus", "adam_beta1", "adam_beta2", "adam_eps", "adaptive_stddev",
    "algo", "async_rl", "batch_size", "batched_sampling", "benchmark", "continuous_tanh_scale", "decoder_mlp_layers",
    "decorrelate_envs_on_one_worker", "decorrelate_experience_max_seconds", "default_niceness", "device",
    "dmlab30_dataset", "dmlab_extended_action_set", "dmlab_gpus", "dmlab_level_cache_path",
    "dmlab_one_task_per_worker", "dmlab_renderer", "dmlab_throughput_benchmark", "dmlab_use_level_cache",
    "dmlab_with_instructions", "encoder_conv_architecture", "encoder_conv_mlp_layers", "encoder_mlp_layers",
    "enjoy_script", "env", "env_frameskip", "env_framestack", "env_gpu_actions", "env_gpu_observations",
    "eval_deterministic", "eval_env_frameskip", "experiment", "experiment_summaries_interval", "exploration_loss",
    "exploration_loss_coeff", "flush_summaries_interval", "force_envs_single_thread", "fps", "gae_lambda", "gamma",
    "heartbeat_interval", "heartbeat_reporting_interval", "hf_repository", "initial_stddev", "keep_checkpoints",
    "kl_loss_coeff", "learning_rate", "load_checkpoint_kind", "log_to_file", "lr_adaptive_max", "lr_adaptive_min",
    "lr_schedule", "lr_schedule_kl_threshold", "max_grad_norm", "max_num_episodes", "max_num_frames",
    "max_policy_lag", "no_render", "nonlinearity", "normalize_input", "normalize_input_keys", "normalize_returns",
    "num_agents", "num_batches_per_epoch", "num_batches_to_accumulate", "num_bots", "num_envs_per_worker",
    "num_epochs", "num_humans", "num_policies", "num_workers", "obs_scale", "obs_subtract_mean", "optimizer",
    "pbt_mix_policies_in_one_env", "pbt_mutation_rate", "pbt_optimize_gamma", "pbt_period_env_steps",
    "pbt_perturb_max", "pbt_perturb_min", "pbt_replace_fraction", "pbt_replace_reward_gap",
    "pbt_replace_reward_gap_absolute", "pbt_start_mutation", "pbt_target_objective", "pixel_format", "policy_index",
    "policy_init_gain", "policy_initialization", "policy_workers_per_policy", "ppo_clip_ratio", "ppo_clip_value",
    "push_to_hub", "record_to", "recurrence", "res_h", "res_w", "restart_behavior", "reward_clip", "reward_scale",
    "rnn_num_layers", "rnn_size", "rnn_type", "rollout", "save_best_after", "save_best_every_sec", "save_best_metric",
    "save_every_sec", "save_milestones_sec", "save_video", "seed", "serial_mode", "set_workers_cpu_affinity",
    "shuffle_minibatches", "start_bot_difficulty", "stats_avg", "summaries_use_frameskip", "timelimit", "train_dir",
    "train_for_env_steps", "train_for_seconds", "train_script", "use_env_info_cache", "use_record_episode_statistics",
    "use_rnn", "value_bootstrap", "value_loss_coeff", "video_frames", "video_name", "vtrace_c", "vtrace_rho",
    "wandb_group", "wandb_job_type", "wandb_project", "wandb_tags", "wandb_user", "wide_aspect_ratio", "with_pbt",
    "with_vtrace", "with_wandb", "worker_num_splits",
)
