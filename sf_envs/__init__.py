"""Env integrations of the training system: VizDoom, Atari, DeepMind Lab, gymnasium, built-in test envs.

The contract is in docs/architecture.md ("Env contract"); the families and their details in docs/envs.md.
"""
from sf_envs.errors import EnvUnavailableError, UnknownEnvError
from sf_envs.registry import check_env_available, env_names, env_spec, make_env, register_env, unregister_env
from sf_envs.spec import EnvSpec

__all__ = ["EnvSpec", "EnvUnavailableError", "UnknownEnvError", "check_env_available", "env_names", "env_spec",
           "make_env", "register_env", "unregister_env"]
