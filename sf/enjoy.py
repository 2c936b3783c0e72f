"""enjoy.py's body: run a trained policy, show it or record it, report episode rewards.

Loads the experiment's saved configuration (command-line flags override it) and its latest or best
checkpoint; carries the recurrent state across steps and resets it between episodes.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from sf.cfg import ConfigError, experiment_dir, resolve_device
from sf.learning.learner import checkpoint_meta
from sf.model.actor_critic import create_actor_critic
from sf.runner.checkpoint import CheckpointError, CheckpointManager, check_compatible, load_into
from sf_envs.registry import env_spec, make_env

NATIVE_FPS = {"doom": 35, "atari": 60, "dmlab": 60}


def load_policy(cfg, obs_space, action_space, device):
    """Model with the requested checkpoint's weights; one-line ConfigError for every user-side problem."""
    exp_dir = experiment_dir(cfg)
    if not exp_dir.is_dir():
        raise ConfigError(f"experiment directory {exp_dir} does not exist (check --experiment and --train_dir)")
    model = create_actor_critic(cfg, obs_space, action_space).to(device).eval()
    try:
        state = CheckpointManager(exp_dir, policy_id=0).load(cfg.load_checkpoint_kind, map_location=device)
        if state is None:
            raise ConfigError(f"no {cfg.load_checkpoint_kind} checkpoint in {exp_dir / 'checkpoint_p0'}; train first")
        check_compatible(state["meta"], checkpoint_meta(cfg, obs_space, action_space, model),
                         state.get("path", exp_dir / "checkpoint_p0"))
        load_into(model, None, state)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    return model, state


def _render_mode(cfg) -> str | None:
    if cfg.save_video:
        return "rgb_array"
    if not cfg.no_render and os.environ.get("DISPLAY"):
        return "human"
    return None


class VideoWriter:
    """An .mp4 of what a person would see (the env's rendered frames, RGB [H, W, 3])."""

    def __init__(self, path, fps: float):
        self.path, self.fps, self.writer, self.frames = path, fps, None, 0

    def add(self, frame: np.ndarray) -> None:
        import cv2
        if self.writer is None:
            h, w = frame.shape[:2]
            self.writer = cv2.VideoWriter(str(self.path), cv2.VideoWriter_fourcc(*"mp4v"), self.fps, (w, h))
            if not self.writer.isOpened():
                raise ConfigError(f"cannot write video {self.path} (OpenCV has no mp4 encoder here)")
        self.writer.write(np.ascontiguousarray(frame[..., ::-1]))  # RGB -> OpenCV's BGR
        self.frames += 1

    def close(self) -> None:
        if self.writer is not None:
            self.writer.release()


def run_enjoy(cfg) -> int:
    device = torch.device(resolve_device(cfg))
    spec = env_spec(cfg.env, cfg)
    try:
        env = make_env(cfg, env_index=0, render_mode=_render_mode(cfg))
    except (ImportError, FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    model, state = load_policy(cfg, env.observation_space, env.action_space, device)
    print(f"Loaded {cfg.load_checkpoint_kind} checkpoint: policy version {state['policy_version']}, "
          f"{state['env_steps']} env frames")
    fps = cfg.fps or NATIVE_FPS.get(spec.family, 30) / spec.frameskip
    video = None
    if cfg.save_video:
        name = cfg.video_name or f"replay_{cfg.experiment}.mp4"
        video = VideoWriter(experiment_dir(cfg) / name if os.sep not in name else name, fps)

    rewards, lengths = [], []
    frames = 0
    rnn = torch.zeros((1, model.rnn_state_size), device=device)
    obs, _ = env.reset(seed=cfg.seed)
    try:
        while len(rewards) < cfg.max_num_episodes and frames < cfg.max_num_frames:
            if video is not None and video.frames < cfg.video_frames:
                video.add(env.render())
            with torch.inference_mode():
                obs_t = {k: torch.as_tensor(np.asarray(v)).unsqueeze(0).to(device) for k, v in obs.items()}
                out = model.forward_step(obs_t, rnn)
                dist = model.action_distribution(out.action_logits)
                action = (dist.mode() if cfg.eval_deterministic else dist.sample())[0].cpu().numpy()
                rnn = out.new_rnn_states
            if action.shape == (1,) and env.action_space.shape == ():
                action = action[0]
            obs, reward, terminated, truncated, info = env.step(action)
            frames += spec.frameskip
            if _render_mode(cfg) == "human" and cfg.fps:
                time.sleep(1.0 / cfg.fps)
            if terminated or truncated:
                if "episode" in info:  # every env reports real episode ends (not Atari life losses) here
                    ep = info["episode"]
                    rewards.append(float(ep["reward"]))
                    lengths.append(int(ep["length"]))
                    extra = f", score {ep['score']:.2f}" if "score" in ep else ""
                    print(f"Episode {len(rewards)}: reward {rewards[-1]:.3f}, length {lengths[-1]} frames{extra}")
                rnn = torch.zeros_like(rnn)
                obs, _ = env.reset()
    except KeyboardInterrupt:
        pass
    finally:
        env.close()
        if video is not None:
            video.close()
    if rewards:
        print(f"{len(rewards)} episodes: reward mean {np.mean(rewards):.3f} std {np.std(rewards):.3f}, "
              f"length mean {np.mean(lengths):.1f} frames")
    else:
        print(f"No episode finished within {frames} env frames")
    if video is not None:
        print(f"Video: {video.path} ({video.frames} frames at {fps:.1f} fps)")
    return 0
