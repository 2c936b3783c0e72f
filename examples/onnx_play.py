"""Play one episode of a policy exported by `python -m sf.export`, with onnxruntime alone: torch is never imported.

    python examples/onnx_play.py train_dir/EXP/export/policy_p0.onnx [--seed 0]

The env comes from this repository's env factory (sf_envs, which needs no torch), built from the experiment's
configuration that the export keeps in the file's metadata ("sf_config"), so it is the env the policy trained on. The
observations go in as the env gives them (the graph scales and normalizes them), the recurrent state is carried from
step to step, and the greedy action is taken: each head's argmax, or the Gaussian's mean. Single-agent envs.
"""
import argparse
import json

import numpy as np
import onnxruntime as ort
from gymnasium import spaces

from sf_envs.registry import make_env


def greedy(out: dict, space):
    if isinstance(space, spaces.Box):
        return out["action_mean"][0]
    sizes = [int(space.n)] if isinstance(space, spaces.Discrete) else [int(n) for n in space.nvec]
    action = [int(h.argmax()) for h in np.split(out["action_logits"][0], np.cumsum(sizes)[:-1])]
    return action[0] if isinstance(space, spaces.Discrete) else np.array(action)


def play(path: str, seed: int) -> float:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    env = make_env(argparse.Namespace(**json.loads(session.get_modelmeta().custom_metadata_map["sf_config"])))
    inputs = {i.name: i for i in session.get_inputs()}  # the observation keys, and rnn_state [batch, H] if recurrent
    state = np.zeros((1, inputs["rnn_state"].shape[1]), np.float32) if "rnn_state" in inputs else None
    obs, _ = env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    while not done:
        feeds = {k: np.asarray(obs[k])[None] for k in inputs if k != "rnn_state"}  # a batch of one
        if state is not None:
            feeds["rnn_state"] = state
        out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        state = out.get("new_rnn_state")
        obs, reward, terminated, truncated, _ = env.step(greedy(out, env.action_space))
        total, steps, done = total + float(reward), steps + 1, terminated or truncated
    env.close()
    print(f"Episode: return {total:.3f}, {steps} steps")
    return total


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("onnx_file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    play(args.onnx_file, args.seed)
