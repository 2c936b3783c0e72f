"""PettingZoo envs (`pettingzoo_<env>`, e.g. pettingzoo_simple_spread_v3) as multi-agent envs of the contract.

Importing this package imports no PettingZoo module; see pettingzoo_env.py for what is supported and how.
"""
from sf_envs.pettingzoo.pettingzoo_env import PREFIX, PettingZooEnv, find_env, pettingzoo_spec

__all__ = ["PREFIX", "PettingZooEnv", "find_env", "pettingzoo_spec"]
