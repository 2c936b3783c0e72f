"""This process's place among the ranks torchrun started (`World`, from torchrun's environment) and the start verdict
rank 0 gives the others through torchrun's store before any process group exists.

    world = world_from_env()     # RANK, WORLD_SIZE, ... as torchrun sets them; one rank without torchrun
    world.policies(num_policies)  # the policies this rank trains
    publish_start(world)          # rank 0: the run starts (or ends, with its exit code and line)
    await_start(world, timeout)   # ranks > 0: None, or (exit code, rank 0's line)

The learners' process group and its collectives are the learning layer's (sf/learning/collectives.py); this module is
the processes layer's: it imports nothing of sf above sf/utils (torch.distributed only for torchrun's store).
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Mapping, Optional

from sf.utils.files import first_line

# torchrun's variables: https://pytorch.org/docs/stable/elastic/run.html#environment-variables
DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT = "127.0.0.1", 29500  # torchrun's defaults


@dataclass(frozen=True)
class World:
    """This process's place among the data-parallel ranks (one rank: rank 0 of 1)."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0  # rank among the ranks of this machine (which GPU to use)
    local_world_size: int = 1
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def policies(self, num_policies: int) -> list[int]:
        """The policies this rank trains. One policy: every rank trains it (data-parallel). A population
        (num_policies > 1): policy p lives on rank p mod world size alone (its learner, its policy workers, the agents
        it plays), so its learner forms no group with other ranks."""
        if num_policies > 1:
            return list(range(self.rank, num_policies, self.world_size))
        return list(range(num_policies))

    def data_parallel(self, num_policies: int) -> bool:
        """Whether the learners of this run average gradients across ranks: torchrun with one policy."""
        return self.distributed and num_policies == 1


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def world_from_env(env: Optional[Mapping[str, str]] = None) -> World:
    """The World torchrun describes in `env` (default os.environ): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT. Without RANK and WORLD_SIZE: a single rank (World()). LOCAL_RANK / LOCAL_WORLD_SIZE
    default to RANK / WORLD_SIZE (one machine) for launchers that set only those. ValueError (one line) if a
    variable is not an integer, only one of RANK and WORLD_SIZE is set, or the ranks are out of range."""
    env = os.environ if env is None else env
    given = [k for k in ("RANK", "WORLD_SIZE") if env.get(k, "") != ""]
    if not given:
        return World()
    if len(given) == 1:
        missing = "WORLD_SIZE" if given == ["RANK"] else "RANK"
        raise ValueError(f"{given[0]} is set but {missing} is not: launch with torchrun, which sets both")
    rank, world_size = _env_int(env, "RANK", 0), _env_int(env, "WORLD_SIZE", 1)
    local_rank = _env_int(env, "LOCAL_RANK", rank)
    local_world_size = _env_int(env, "LOCAL_WORLD_SIZE", world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} WORLD_SIZE={world_size}: need WORLD_SIZE >= 1 and 0 <= RANK < WORLD_SIZE")
    if not 1 <= local_world_size <= world_size or not 0 <= local_rank < local_world_size:
        raise ValueError(f"LOCAL_RANK={local_rank} LOCAL_WORLD_SIZE={local_world_size}: need "
                         f"1 <= LOCAL_WORLD_SIZE <= WORLD_SIZE ({world_size}) and 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE")
    port = _env_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT)
    if not 0 < port < 65536:
        raise ValueError(f"MASTER_PORT={port} is not a TCP port")
    return World(rank, world_size, local_rank, local_world_size, env.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR, port)


# --- the start verdict: rank 0 tells the others whether the run starts ----------------------------------------------
# Only rank 0 holds the experiment (without a shared filesystem the others cannot see it): whether it trains, has
# nothing to train, or refuses (bad input, the experiment's lock held) is decided there. Before the learners' group
# exists, the other ranks learn it through torchrun's own store (TORCHELASTIC_USE_AGENT_STORE: the agent of the first
# node serves it at MASTER_ADDR:MASTER_PORT), so that they stop at once with rank 0's line instead of waiting
# --distributed_timeout_sec for a group that will never form.
START_KEY = "sf/start/{restart}"  # one per torchrun restart (a restarted world decides again)
TRAIN = "train"


def agent_store(world: World, timeout_sec: float):
    """A client of torchrun's store (the start verdict below; a population's PBT: sf/runner/population/link.py), or None
    (one rank, or a launcher without torchrun's agent store)."""
    if not world.distributed or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import torch.distributed as dist
    return dist.TCPStore(world.master_addr, world.master_port, is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_sec))


def _start_key() -> str:
    return START_KEY.format(restart=os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


_start_said = False  # rank 0 gave its verdict: a failure after the start changes nothing for the others


def publish_start(world: World, code: Optional[int] = None, line: str = "", timeout_sec: float = 60.0) -> None:
    """Rank 0, once: the run starts (`code` None), or it ends with exit code `code` and `line` (one line: callers pass
    sf.utils.files.first_line of the error). A store
    that cannot be reached within min(timeout_sec, 10 s) is left alone (the other ranks then time out, as they would
    without the verdict)."""
    global _start_said
    if _start_said:
        return
    _start_said = True
    try:
        store = agent_store(world, min(timeout_sec, 10.0))
        if store is not None:
            store.set(_start_key(), TRAIN if code is None else f"{code} {line}")
    except (RuntimeError, OSError):  # (DistStoreError, DistNetworkError: RuntimeErrors)
        pass


def await_start(world: World, timeout_sec: float) -> Optional[tuple[int, str]]:
    """Ranks > 0: None when rank 0 starts the run (or there is no store to ask), else (exit code, rank 0's line).
    RuntimeError (one line) when rank 0 says nothing within `timeout_sec`."""
    store = agent_store(world, timeout_sec)
    if store is None:
        return None
    try:
        store.wait([_start_key()], datetime.timedelta(seconds=timeout_sec))
        verdict = store.get(_start_key()).decode()
    except RuntimeError as e:
        raise RuntimeError(f"rank {world.rank}: rank 0 did not say within {timeout_sec:g} s (--distributed_timeout_sec)"
                           f" whether the run starts, at {world.master_addr}:{world.master_port} "
                           f"({type(e).__name__}: {first_line(e)})") from None
    if verdict == TRAIN:
        return None
    code, _, line = verdict.partition(" ")
    return int(code), line
