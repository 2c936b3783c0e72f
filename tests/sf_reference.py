"""Sample Factory 2.1.1's side of tests/test_import_sf.py, run by .venv-sf's python (Sample Factory is installed there,
not in .venv; this file imports nothing of ours):

    python tests/sf_reference.py train --env ENV [its flags]   Sample Factory's example training of ENV (doom_, atari_)
    python tests/sf_reference.py forward SF_EXPERIMENT_DIR IN.npz OUT.npz
    python tests/sf_reference.py init OUT.npz OBS_SPEC [its flags]

`forward` builds Sample Factory's actor-critic from the experiment's config.json and its env's spaces (the env made by
Sample Factory's own env factory), loads policy 0's newest checkpoint (the file its enjoy.py picks), and runs it on the
observations in IN.npz ("obs:<key>" [T, *shape], "resets" [T]: zero the recurrent state before that step), one step at
a time, the recurrent state carried from step to step. OUT.npz: action_logits [T, L], values [T] (denormalized by its
returns normalizer, as its learner does), new_rnn_states [T, H].
"""
import json
import os
import sys

try:  # ale-py registers its gymnasium ids where its vector env imports, which needs gymnasium >= 1.0 (Sample Factory
    # 2.1.1 needs < 1.0): registered here, at import, so that Sample Factory's spawned workers have them too
    from ale_py.registration import register_v0_v4_envs
    register_v0_v4_envs()
except ImportError:
    pass


def _example(env: str):
    """The Sample Factory example module of `env` (its main() trains, its register_*_components() registers)."""
    if env.startswith("doom_"):
        import sf_examples.vizdoom.train_vizdoom as m
        return m, m.register_vizdoom_components
    if env.startswith("atari_"):
        import sf_examples.atari.train_atari as m
        return m, m.register_atari_components
    raise SystemExit(f"sf_reference.py: no Sample Factory example for env {env}")


def train(args):
    env = args[args.index("--env") + 1]
    module, _ = _example(env)
    sys.argv = [sys.argv[0], *args]
    return module.main()


def forward(exp_dir, npz_in, npz_out):
    import numpy as np
    import torch
    from sample_factory.algo.learning.learner import Learner
    from sample_factory.algo.utils.make_env import make_env_func_batched
    from sample_factory.algo.utils.rl_utils import prepare_and_normalize_obs
    from sample_factory.model.actor_critic import create_actor_critic
    from sample_factory.model.model_utils import get_rnn_size
    from sample_factory.utils.attr_dict import AttrDict

    torch.set_num_threads(1)
    with open(os.path.join(exp_dir, "config.json")) as f:
        cfg = AttrDict(json.load(f))
    cfg.train_dir, cfg.experiment = os.path.dirname(os.path.abspath(exp_dir)), os.path.basename(exp_dir)
    _example(cfg.env)[1]()
    env = make_env_func_batched(cfg, env_config=AttrDict(worker_index=0, vector_index=0, env_id=0), render_mode=None)
    model = create_actor_critic(cfg, env.observation_space, env.action_space)
    env.close()
    model.eval()
    # Sample Factory's Learner.load_checkpoint calls torch.load with torch's default weights_only, True since torch 2.6,
    # which refuses its numpy best_performance: the file (this test's own) is loaded as Sample Factory 2.1.1's torch did
    path = Learner.get_checkpoints(Learner.checkpoint_dir(cfg, 0))[-1]
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(checkpoint["model"])

    data = np.load(npz_in)
    keys = [k.split(":", 1)[1] for k in data.files if k.startswith("obs:")]
    rnn = torch.zeros((1, get_rnn_size(cfg)), dtype=torch.float32)
    logits, values, states = [], [], []
    with torch.no_grad():
        for t in range(len(data["resets"])):
            if data["resets"][t]:
                rnn = torch.zeros_like(rnn)
            obs = {k: torch.from_numpy(data[f"obs:{k}"][t:t + 1]) for k in keys}
            out = model(prepare_and_normalize_obs(model, obs), rnn)
            v = out["values"].reshape(1).clone()
            if model.returns_normalizer is not None:
                model.returns_normalizer(v, denormalize=True)  # in place
            rnn = out["new_rnn_states"]
            logits.append(out["action_logits"][0].numpy())
            values.append(float(v[0]))
            states.append(rnn[0].numpy())
    np.savez(npz_out, action_logits=np.stack(logits), values=np.asarray(values, np.float32),
             new_rnn_states=np.stack(states))
    return 0


def init(out_npz, obs_spec, *args):
    """Sample Factory's actor-critic as its learner builds it (seed 0) for the observation spaces of OBS_SPEC
    ("key=C,H,W;key=D": uint8 images, float vectors), Discrete(5) actions and its flags `args` (--env doom_...: its
    Doom encoder and defaults). OUT.npz: parameter name -> weight, every Linear and Conv2d weight outside the RNN."""
    import gymnasium as gym
    import numpy as np
    import torch
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.model.actor_critic import create_actor_critic

    env = args[args.index("--env") + 1]
    if env.startswith("doom_"):
        from sf_examples.vizdoom.train_vizdoom import parse_vizdoom_cfg, register_vizdoom_models
        register_vizdoom_models()
        cfg = parse_vizdoom_cfg(argv=list(args))
    else:
        parser, _ = parse_sf_args(argv=list(args))
        cfg = parse_full_cfg(parser, list(args))
    spaces = {}
    for item in obs_spec.split(";"):
        key, shape = item.split("=")
        shape = tuple(int(x) for x in shape.split(","))
        spaces[key] = gym.spaces.Box(0, 255, shape, np.uint8) if len(shape) == 3 else \
            gym.spaces.Box(-1.0, 1.0, shape, np.float32)
    torch.manual_seed(0)
    model = create_actor_critic(cfg, gym.spaces.Dict(spaces), gym.spaces.Discrete(5))
    np.savez(out_npz, **{name: p.detach().numpy() for name, p in model.named_parameters()
                         if name.endswith("weight") and p.dim() in (2, 4) and not name.startswith("core.")})
    return 0


if __name__ == "__main__":
    command, rest = sys.argv[1], sys.argv[2:]
    sys.exit(train(rest) if command == "train" else {"forward": forward, "init": init}[command](*rest))
