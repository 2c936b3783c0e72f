"""enjoy.py's body: run a trained policy, show it or record it, report episode rewards.

Loads the experiment's saved configuration (command-line flags override it; the device is this machine's: --device,
else auto) and its latest or best checkpoint onto that device (sf/policy_loading.py); carries the recurrent state
across steps and resets it between episodes.

A population (--num_policies N in the saved configuration) plays a match between the policies of --policy_index: agent a
of a multi-agent env (doom_duel, test_race) is played by the a-th of them (cycling through the list), a single-agent env
by the first. Each agent's episodes are printed with the policy that played them, and a summary per policy at the end;
the video of a multi-agent Doom match shows every player's view side by side.

--save_video writes an H.264 .mp4 (yuv420p, +faststart: plays in browsers) of the env's rendered frames at their
resolution, and with --video_gif an animated GIF beside it (VideoWriter, PyAV). A bad video path is a one-line
ConfigError before the env starts; the files appear under their final names only once complete.

`python -m sf.enjoy ...` (main() below), `python enjoy.py ...` and the `sf-enjoy` console script are one program.
"""
from __future__ import annotations

import os
import secrets
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sf.cfg import ConfigError, RunError, cli_main, experiment_dir, resolve_device
from sf.policy_loading import check_experiment_dir, load_policy, open_env
from sf.utils.files import replace_durably
from sf_envs.families import FAMILIES
from sf_envs.registry import env_spec

if TYPE_CHECKING:
    from sf.cfg.config import Config

# torch is imported where used: `--help` and bad flags answer at once.

NATIVE_FPS = {f.name: f.native_fps for f in FAMILIES if f.native_fps}  # the simulators' frame rates


def _render_mode(cfg: Config) -> str | None:
    if cfg.save_video:
        return "rgb_array"
    if not cfg.no_render and os.environ.get("DISPLAY"):
        return "human"
    return None


def video_paths(cfg: Config) -> tuple[Path, Path | None]:
    """Where --save_video writes: the .mp4 and, with --video_gif, the .gif beside it. A one-line ConfigError
    naming the directory for a path that cannot be a new file (checked again by VideoWriter, which tries)."""
    name = cfg.video_name or f"replay_{cfg.experiment}.mp4"
    has_dir = os.sep in name or bool(os.altsep and os.altsep in name)
    path = Path(name) if has_dir else experiment_dir(cfg) / name
    if os.path.isdir(path):
        raise ConfigError(f"--video_name {path} is a directory; give a file name in it, such as {path / 'replay.mp4'}")
    if path.suffix.lower() != ".mp4":
        raise ConfigError(f"--video_name must end in .mp4 (got {name!r}); --video_gif adds a .gif beside it")
    directory = path.parent
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.lexists(directory) else "does not exist"
        raise ConfigError(f"video directory {directory} {what} (--video_name {name})")
    return path, (path.with_suffix(".gif") if cfg.video_gif else None)


class _Output:
    """One file being encoded (FFmpeg container and stream), under a temporary name in its final directory until
    finish() gives it its final name (fsynced, renamed, the directory fsynced). Creating the temporary file up front
    proves the directory writable before anything runs."""

    def __init__(self, final: Path):
        self.final = final
        self.tmp = final.parent / f".{final.stem[:64]}.{os.getpid()}.{secrets.token_hex(4)}.part"
        try:
            os.close(os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except OSError as e:
            raise ConfigError(f"cannot write the video in directory {final.parent}: {e.strerror or e}") from None
        self.container: Any = None  # PyAV's output container and stream (PyAV ships no type information)
        self.stream: Any = None
        self._src: Any = None  # _Gif's filter graph
        self._sink: Any = None
        self._graph: Any = None
        self.count = 0

    def add(self, frame: np.ndarray, rate: Fraction) -> None:
        raise NotImplementedError

    def _encode(self, frame) -> None:
        for packet in self.stream.encode(frame):
            self.container.mux(packet)

    def finish(self) -> None:
        if self.container is not None:
            self._flush()
            self.container.close()
            self.container = None
        replace_durably(self.tmp, self.final)  # fsynced first: a crash never leaves an empty file under the final name

    def _flush(self) -> None:
        self._encode(None)

    def discard(self) -> None:
        container, self.container = self.container, None
        if container is not None:
            try:
                container.close()
            except Exception:
                pass
        try:
            os.unlink(self.tmp)
        except OSError:
            pass


class _Mp4(_Output):
    """H.264 (libx264), yuv420p, moov atom first (+faststart): plays in browsers and common players."""

    def add(self, frame: np.ndarray, rate: Fraction) -> None:
        import av
        h, w = frame.shape[:2]
        if h % 2 or w % 2:  # yuv420p needs even sizes: repeat the last row / column
            frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        if self.container is None:
            self.container = av.open(str(self.tmp), "w", format="mp4", options={"movflags": "+faststart"})
            self.stream = self.container.add_stream("libx264", rate=rate, options={"crf": "20", "preset": "fast"})
            self.stream.width, self.stream.height = frame.shape[1], frame.shape[0]
            self.stream.pix_fmt = "yuv420p"
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        vf.pts, vf.time_base = self.count, 1 / rate
        self._encode(vf)  # converted to yuv420p by the encoder
        self.count += 1


class _Gif(_Output):
    """Animated GIF at the rendered size, one 256-color palette per frame (FFmpeg's palettegen + paletteuse)."""

    def add(self, frame: np.ndarray, rate: Fraction) -> None:
        import av
        if self.container is None:
            h, w = frame.shape[:2]
            self.container = av.open(str(self.tmp), "w", format="gif")
            self.stream = self.container.add_stream("gif", rate=rate)
            self.stream.width, self.stream.height, self.stream.pix_fmt = w, h, "pal8"
            self._graph = graph = av.filter.Graph()  # kept: its filters die with it
            self._src = graph.add_buffer(width=w, height=h, format="rgb24", time_base=1 / rate)
            split, gen = graph.add("split"), graph.add("palettegen", "stats_mode=single")
            use, self._sink = graph.add("paletteuse", "new=1"), graph.add("buffersink")
            self._src.link_to(split)
            split.link_to(gen, 0, 0)
            split.link_to(use, 1, 0)
            gen.link_to(use, 0, 1)
            use.link_to(self._sink)
            graph.configure()
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        vf.pts, vf.time_base = self.count, 1 / rate
        self._src.push(vf)
        self._drain()
        self.count += 1

    def _drain(self) -> None:
        import av
        while True:
            try:
                frame = self._sink.pull()
            except (av.error.BlockingIOError, av.error.EOFError):
                return
            self._encode(frame)

    def _flush(self) -> None:
        self._src.push(None)
        self._drain()
        self._encode(None)

    def discard(self) -> None:
        super().discard()
        self._src = self._sink = self._graph = None  # filters first, then their graph


class VideoWriter:
    """What a person would see (the env's rendered frames, RGB uint8 [H, W, 3]) as an H.264 .mp4 that browsers and
    players play (yuv420p; an odd width or height is padded by one pixel, repeating the edge) and, with `gif_path`,
    an animated GIF at the rendered size. Encoded with PyAV (FFmpeg with libx264).

    The constructor creates the files under temporary names in their directories (a ConfigError naming the directory
    if it cannot), so a bad path fails before anything runs; close() finishes them and renames them to their final
    names, abort() (or a failure) removes them: nothing half-written is ever left under a final name."""

    def __init__(self, path, fps: float, gif_path=None):
        try:
            import av  # noqa: F401
        except ImportError:
            raise ConfigError("--save_video needs PyAV (pip install av)") from None
        self.path, self.gif_path, self.fps = Path(path), (Path(gif_path) if gif_path is not None else None), fps
        self.rate = Fraction(fps).limit_denominator(1001)
        self.frames = 0
        self.shape: tuple | None = None  # [H, W, 3] of the first frame: every frame must match it
        self._outputs: list[_Output] = []
        self._done = False
        try:
            self._outputs.append(_Mp4(self.path))
            if self.gif_path is not None:
                self._outputs.append(_Gif(self.gif_path))
        except BaseException:
            self.abort()
            raise

    def set_fps(self, fps: float) -> None:
        """The frame rate, before the first frame (the env's own, known once it is open)."""
        if self.frames:
            raise RuntimeError("VideoWriter.set_fps after the first frame")
        self.fps, self.rate = fps, Fraction(fps).limit_denominator(1001)

    @property
    def size(self) -> tuple[int, int] | None:
        """(width, height) of the .mp4 (the rendered size rounded up to even numbers), once a frame is written."""
        return None if self.shape is None else (self.shape[1] + self.shape[1] % 2, self.shape[0] + self.shape[0] % 2)

    def add(self, frame: np.ndarray) -> None:
        if self._done:
            raise RuntimeError("VideoWriter is closed")
        frame = np.asarray(frame)
        if self.shape is None:
            if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3 or 0 in frame.shape:
                self.abort()
                raise RunError(f"cannot write video {self.path}: the env rendered {frame.dtype} {list(frame.shape)}, "
                               f"not RGB uint8 [H, W, 3]")
            self.shape = frame.shape
        elif frame.shape != self.shape or frame.dtype != np.uint8:
            self.abort()
            raise RunError(f"cannot write video {self.path}: the rendered frame changed from {list(self.shape)} uint8 "
                           f"to {list(frame.shape)} {frame.dtype}")
        self._run(lambda: [out.add(frame, self.rate) for out in self._outputs])
        self.frames += 1

    def close(self) -> None:
        """Finish the files and give them their final names (no file at all when no frame was written)."""
        if self._done:
            return
        if self.frames == 0:
            self.abort()
            return
        self._run(lambda: [out.finish() for out in self._outputs])
        self._done = True

    def abort(self) -> None:
        """Remove what was written so far; the final names are left untouched."""
        self._done = True
        for out in self._outputs:
            out.discard()

    def _run(self, step) -> None:
        try:
            step()
        except Exception as e:
            self.abort()
            raise RunError(f"cannot write video {self.path}: {e}") from None


def run_enjoy(cfg: Config) -> int:
    import torch
    for note in cfg._notes:  # e.g. Sample Factory flags that mean nothing here
        print(note)
    device = torch.device(resolve_device(cfg))
    spec = env_spec(cfg.env, cfg)
    check_experiment_dir(cfg)
    fps = cfg.fps or NATIVE_FPS.get(spec.family, 30) / spec.frameskip
    video = None
    if cfg.save_video:  # a bad path fails here, before the env starts and the episodes run
        mp4_path, gif_path = video_paths(cfg)
        video = VideoWriter(mp4_path, fps, gif_path=gif_path)
    try:
        rewards, lengths, frames = _play(cfg, spec, device, video)
        if video is not None:
            video.close()
    except BaseException:
        if video is not None:
            video.abort()
        raise
    if rewards:
        print(f"{len(rewards)} episodes: reward mean {np.mean(rewards):.3f} std {np.std(rewards):.3f}, "
              f"length mean {np.mean(lengths):.1f} frames")
    else:
        print(f"No episode finished within {frames} env frames")
    if video is not None:
        if video.frames:
            w, h = video.size
            print(f"Video: {video.path} ({video.frames} frames, {w}x{h}, H.264, at {video.fps:.1f} fps)")
            if video.gif_path is not None:
                print(f"GIF: {video.gif_path}")
        else:
            print("Video: none written (no frame was recorded)")
    return 0


def check_policy_index(cfg: Config) -> None:
    """--policy_index names policies of the experiment's population (one line otherwise)."""
    bad = [p for p in cfg.policy_index if p >= cfg.num_policies]
    if bad:
        have = "policy 0" if cfg.num_policies == 1 else f"policies 0-{cfg.num_policies - 1}"
        raise ConfigError(f"--policy_index {' '.join(map(str, cfg.policy_index))}: the experiment has {have} "
                          f"(--num_policies {cfg.num_policies})")


def _play(cfg: Config, spec, device, video):
    """The episodes: (agent 0's episode rewards, their lengths, env frames). Ctrl-C stops early and keeps what was
    played. Every agent of a multi-agent env is played by its policy of --policy_index (see the module docstring)."""
    import torch
    check_policy_index(cfg)
    env = open_env(cfg, render_mode=_render_mode(cfg))
    if video is not None and not cfg.fps and spec.family not in NATIVE_FPS:  # MuJoCo, gym, PettingZoo: the env's rate
        native_fps = (getattr(env, "metadata", None) or {}).get("render_fps")  # (Hopper 125/s, HalfCheetah 20)
        if native_fps:
            video.set_fps(float(native_fps) / spec.frameskip)
    multi = bool(getattr(env, "is_multiagent", False))
    num_agents = env.num_agents if multi else 1
    players = [cfg.policy_index[a % len(cfg.policy_index)] for a in range(num_agents)]  # agent -> policy
    rewards, lengths = [], []
    per_policy: dict[int, list[dict]] = {p: [] for p in players}
    frames = 0
    try:
        models = {}
        for p in dict.fromkeys(players):
            models[p], state = load_policy(cfg, env.observation_space, env.action_space, device, p)
            who = f"policy {p}: " if cfg.num_policies > 1 else ""
            print(f"Loaded {cfg.load_checkpoint_kind} checkpoint: {who}policy version {state['policy_version']}, "
                  f"{state['env_steps']} env frames, on {device}")
        rnn = [torch.zeros((1, models[p].rnn_state_size), device=device) for p in players]
        obs, _ = env.reset(seed=cfg.seed)
        obs = obs if multi else [obs]
        while len(rewards) < cfg.max_num_episodes and frames < cfg.max_num_frames:
            if video is not None and video.frames < cfg.video_frames:
                video.add(env.render())
            actions = []
            for a, p in enumerate(players):
                action, rnn[a] = _act(models[p], obs[a], rnn[a], cfg.eval_deterministic, device)
                actions.append(action[0] if action.shape == (1,) and env.action_space.shape == () else action)
            if multi:
                obs, _, terminated, truncated, infos = env.step(actions)
            else:
                o, r, te, tr, info = env.step(actions[0])
                obs, terminated, truncated, infos = [o], [te], [tr], [info]
            frames += spec.frameskip
            if _render_mode(cfg) == "human" and cfg.fps:
                time.sleep(1.0 / cfg.fps)
            for a, p in enumerate(players):
                if not (terminated[a] or truncated[a]):
                    continue
                rnn[a] = torch.zeros_like(rnn[a])
                if "episode" in infos[a]:  # every env reports real episode ends (not Atari life losses) here
                    ep = infos[a]["episode"]
                    per_policy[p].append(ep)
                    if a == 0:
                        rewards.append(float(ep["reward"]))
                        lengths.append(int(ep["length"]))
                    extra = "".join(f", {k} {ep[k]:.2f}" for k in ("score", "win") if k in ep)
                    who = f" (agent {a}, policy {p})" if multi or cfg.num_policies > 1 else ""
                    print(f"Episode {len(per_policy[p])}{who}: reward {float(ep['reward']):.3f}, length "
                          f"{int(ep['length'])} frames{extra}")
            if not multi and (terminated[0] or truncated[0]):
                obs = [env.reset()[0]]
    except KeyboardInterrupt:
        pass
    finally:
        env.close()
    if len(per_policy) > 1:
        _print_policy_summary(per_policy)
    return rewards, lengths, frames


def _act(model, obs: dict, rnn_state, deterministic: bool, device):
    """One agent's action for one observation (each key's array, unbatched): (the action as a numpy array, unbatched:
    [] or [heads], the new recurrent state [1, H])."""
    import torch
    with torch.inference_mode():
        obs_t = {k: torch.as_tensor(np.asarray(v)).unsqueeze(0).to(device) for k, v in obs.items()}
        out = model.forward_step(obs_t, rnn_state)
        dist = model.action_distribution(out.action_logits)
        action = (dist.mode() if deterministic else dist.sample())[0].cpu().numpy()
    return action, out.new_rnn_states


def _print_policy_summary(per_policy: dict) -> None:
    """A match between policies: one line per policy that finished episodes (reward mean, score and win rate)."""
    for p, eps in per_policy.items():
        if eps:
            extra = "".join(f", {k} mean {np.mean([e[k] for e in eps]):.2f}" for k in ("score", "win") if k in eps[0])
            print(f"Policy {p}: {len(eps)} episodes, reward mean {np.mean([e['reward'] for e in eps]):.3f}{extra}")


def main(argv=None, *, prog: str | None = None) -> int:
    """`python -m sf.enjoy` / `python enjoy.py` / the `sf-enjoy` console script: parse the enjoy flags and run.
    Bad input is one line on stderr and exit code 2, an I/O failure one line and exit code 1."""
    return cli_main(run_enjoy, mode="enjoy", prog=prog or os.path.basename(sys.argv[0] or "") or "sf-enjoy", argv=argv)


if __name__ == "__main__":
    sys.exit(main(prog="python -m sf.enjoy"))
