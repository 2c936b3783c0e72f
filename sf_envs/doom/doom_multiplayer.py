"""Multi-agent VizDoom (doom_duel, doom_deathmatch_full): a match of A learning agents, plus in-game bots, with one
engine per agent joined over VizDoom's network mode on localhost. The env of the multi-agent contract
(docs/architecture.md): lists of A observations, rewards and dones in and out, one agent's spaces.

How a match runs
- Agent 0's engine hosts (`-host A -port P`, deathmatch rules, the bots), the others join (`-join 127.0.0.1 -port P`);
  P is leased from sf_envs/doom/ports.py for the match's lifetime. The engines run in lockstep over UDP: a player's
  make_action returns only once every player has sent its input for those tics, so the A calls of a step must run
  at once. vizdoom releases the GIL inside init, make_action and new_episode (measured: with a thread blocked in
  make_action waiting for its peer, the main thread runs on and can make the peer's call), so each agent has a
  thread of its own that runs its whole step (action, make_action, frame, measurements, shaping), and step() hands
  the A threads their actions and waits for all. The threads are daemons: one stuck in the engine never blocks exit.
- The match ends for every agent at once at its time limit (--doom_multiplayer_timelimit): terminated, with each
  agent's report (training reward, frames, frags, win). The next match starts inside that step() (new_episode on
  every engine at once, as VizDoom's multiplayer requires); the returned observations are its first ones.
- A failed step (an engine gone: its own make_action raises at once; or no answer within
  --doom_multiplayer_timeout_sec: an engine hung, or a peer died and the others wait for it forever) aborts the
  match: its engines are SIGKILLed (which frees the calls blocked in them), their shared memory is removed, and a
  new match starts on a new port. Every agent gets truncated, reward 0, infos["final_obs"] its latest observation
  (the one after its action when its engine still made that step, else the last one step() returned),
  infos["match_aborted"] the reason, and no "episode" report (the cut-short match is not counted).

Known limit (vizdoom 1.3.2, measured): an engine that exits while its init() runs (a host whose port another program
took, a joiner that found no host within the connect timeout, an engine killed then) crashes this Python process with
a segfault instead of raising. Hence the port locks and bind test, and a generous connect timeout (MIN_CONNECT_TIMEOUT).
Seeding: seeded matches start from seeds drawn as in doom_env.py, but a network game is not reproducible (the engines'
tic timing differs from run to run).
"""
from __future__ import annotations

import queue
import threading
import time
import weakref
from functools import partial
from typing import Optional

import gymnasium as gym
import numpy as np
import psutil

from sf_envs.doom.doom_env import DoomEnv
from sf_envs.doom.engine_shm import engine_shm_files
from sf_envs.doom.ports import PortLease, lease_port
from sf_envs.doom.scenarios import DoomScenario
from sf_envs.params import get_param
from sf_envs.utils import cfg_seed, derive_seed

MAX_PLAYERS = 16  # VizDoom's limit, learning agents and bots together
START_TRIES = 3
MIN_CONNECT_TIMEOUT = 60  # s: engines that fail to connect in time crash this process (see above), so be generous


class MatchFailed(RuntimeError):
    """A call on the match's engines failed or did not return in time."""


class _Player(DoomEnv):
    """One learning agent's engine in a match: DoomEnv's actions, frames, measurements, shaping and episode counters,
    with the network arguments of a host or a joiner. Its methods run in the agent's thread."""

    def __init__(self, scenario: DoomScenario, cfg, env_index: int, agent: int, render_mode: Optional[str]):
        super().__init__(scenario, cfg, env_index, render_mode)
        self.agent = agent
        self.port: Optional[int] = None
        self.seed: Optional[int] = None
        self.slot = agent  # the engine's player number (0-based), read at every match start

    def _add_match_args(self, game) -> None:
        minutes = float(get_param(self.cfg, "doom_multiplayer_timelimit"))
        connect = f"+viz_connect_timeout {connect_timeout(self.cfg)}"
        if self.agent == 0:
            args = [f"-host {self.scenario.num_agents}", f"-port {self.port}", *self._match_args(minutes), connect]
        else:
            args = ["-join 127.0.0.1", f"-port {self.port}", connect]
        game.add_game_args(" ".join(args + [f"+name AI{self.agent} +colorset {self.agent % 8}"]))
        game.set_episode_timeout(int(minutes * 60 * game.get_ticrate()))

    def start(self) -> None:
        game = self._new_game()
        if self.seed is not None:
            game.set_seed(self.seed)
        self.game = game  # before init: close() must find it whatever happens
        game.init()
        self._engine_steps = 0

    def new_match(self, seed: Optional[int]) -> None:
        if seed is not None:
            self.game.set_seed(seed)
        self.game.new_episode()

    def _add_bots(self) -> None:
        if self.agent == 0:  # the host's bots
            super()._add_bots()

    def begin(self) -> None:
        import vizdoom as vzd
        self.slot = int(self.game.get_game_variable(vzd.GameVariable.PLAYER_NUMBER))
        self._begin_episode()

    def frags_by_slot(self, n: int) -> list:
        import vizdoom as vzd
        var = vzd.GameVariable
        return [float(self.game.get_game_variable(getattr(var, f"PLAYER{k + 1}_FRAGCOUNT"))) for k in range(n)]


def connect_timeout(cfg) -> int:
    """Seconds the engines of a starting match wait for each other (VizDoom's +viz_connect_timeout)."""
    return max(MIN_CONNECT_TIMEOUT, round(float(get_param(cfg, "doom_multiplayer_timeout_sec"))))


def match_wins(scores: list, bot_scores: list) -> list:
    """Each learning agent's win flag: 1.0 if its score beats every other player's, learning agents' and bots' (a tie
    is no win)."""
    return [float(s > max([o for j, o in enumerate(scores) if j != i] + list(bot_scores), default=float("-inf")))
            for i, s in enumerate(scores)]


class _AgentThreads:
    """One daemon thread per agent; run() hands each agent its call and waits for all of them, or the first error:
    MatchFailed for vizdoom's exceptions and the timeout, any other exception as it is. A result of an earlier,
    abandoned run() is recognized by its round number and dropped."""

    def __init__(self, n: int):
        self._jobs = [queue.SimpleQueue() for _ in range(n)]
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._round = 0
        self._pending = [0] * n  # per agent: calls handed over and not returned yet
        self._threads = [threading.Thread(target=self._loop, args=(i,), name=f"doom-agent{i}", daemon=True)
                         for i in range(n)]
        for t in self._threads:
            t.start()

    def _loop(self, i: int) -> None:
        while True:
            job = self._jobs[i].get()
            if job is None:
                return
            rnd, fn = job
            try:
                out = (True, fn())
            except BaseException as e:  # reported to run(); the thread serves the next match
                out = (False, e)
            self._results.put((rnd, i, out))

    def run(self, fns: list, timeout: float) -> list:
        self._round += 1
        rnd, results, left = self._round, [None] * len(fns), set(range(len(fns)))
        for i, fn in enumerate(fns):
            self._pending[i] += 1
            self._jobs[i].put((rnd, fn))
        deadline = time.monotonic() + timeout
        while left:
            try:
                r, i, (ok, value) = self._results.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise MatchFailed(f"agent(s) {sorted(left)}: no answer from the engine within {timeout:g} s") from None
            self._pending[i] -= 1
            if r != rnd:
                continue
            if not ok:
                if not type(value).__module__.startswith("vizdoom"):
                    raise value  # a bug (a malformed action, say), not the engine's failure: not to be hidden
                raise MatchFailed(f"agent {i}: {type(value).__name__}: {str(value).strip() or 'no message'}") from value
            results[i] = value
            left.discard(i)
        return results

    @property
    def inflight(self) -> bool:
        return any(self._pending)

    def wait_idle(self, timeout: float) -> bool:
        """Collect the calls still running (their results are dropped); False if some are still running after that."""
        deadline = time.monotonic() + timeout
        while self.inflight:
            try:
                _, i, _ = self._results.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return False
            self._pending[i] -= 1
        return True

    def stop(self) -> None:
        for q in self._jobs:
            q.put(None)


def match_engines(port: int) -> list:
    """The engine processes (children of this process) started with `-port port`: one match's engines."""
    out = []
    for c in psutil.Process().children():
        try:
            cl = c.cmdline()
        except psutil.Error:
            continue
        if "+viz_instance_id" in cl and "-port" in cl and cl[cl.index("-port") + 1:][:1] == [str(port)]:
            out.append(c)
    return out


def kill_engines(engines: list) -> None:
    """SIGKILL engine processes and remove their shared memory once they are dead (sf/processes/control.py does the
    same for the engines of a killed worker): a killed engine's Python side may never close its game."""
    files = []
    for p in engines:
        try:
            files += engine_shm_files(p.cmdline())
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(engines, timeout=5)
    for f in files:
        try:
            f.unlink(missing_ok=True)
        except OSError:
            pass


class _MatchProcesses:
    """The running match's engines and port lease, apart from the env: an env dropped or left open at the
    interpreter's exit has them killed and freed by weakref.finalize (engines do not die with their Python process)."""

    def __init__(self):
        self.engines: list = []  # psutil.Process of the match's engines
        self.lease: Optional[PortLease] = None

    def all_engines(self) -> list:
        engines = {e.pid: e for e in self.engines}
        if self.lease is not None and self.lease.held:
            engines.update((e.pid, e) for e in match_engines(self.lease.port))  # e.g. of a start under way
        return list(engines.values())

    def kill(self) -> None:
        kill_engines(self.all_engines())
        if self.lease is not None:
            self.lease.release()
        self.engines, self.lease = [], None


class DoomMultiplayerEnv(gym.Env):
    """A multi-agent Doom scenario (num_agents > 1) as the env of the multi-agent contract; see the module's doc.
    Engines start at the first reset() (making the env to read its spaces is cheap)."""

    metadata = {"render_modes": ["human", "rgb_array"], "render_fps": 35}

    def __init__(self, scenario: DoomScenario, cfg=None, env_index: int = 0, render_mode: Optional[str] = None):
        self.scenario = scenario
        self.cfg = cfg
        self.render_mode = render_mode
        self.num_agents = scenario.num_agents
        self.is_multiagent = True
        self.players = [_Player(scenario, cfg, env_index, i, render_mode) for i in range(self.num_agents)]
        host = self.players[0]
        self.observation_space, self.action_space = host.observation_space, host.action_space
        self.action_heads, self.frameskip = host.action_heads, host.frameskip
        self.num_players = self.num_agents + host.num_bots
        if self.num_players > MAX_PLAYERS:
            raise ValueError(f"{scenario.name}: {self.num_agents} agents + {host.num_bots} bots exceed VizDoom's "
                             f"{MAX_PLAYERS} players (lower --doom_num_bots)")
        self.timeout = float(get_param(cfg, "doom_multiplayer_timeout_sec"))
        self.port_range = (int(get_param(cfg, "doom_multiplayer_port_min")),
                           int(get_param(cfg, "doom_multiplayer_port_max")))
        if self.port_range[0] > self.port_range[1]:
            raise ValueError(f"--doom_multiplayer_port_min {self.port_range[0]} > --doom_multiplayer_port_max "
                             f"{self.port_range[1]}")
        self._restart_steps = int(get_param(cfg, "doom_restart_engine_steps"))
        self._rng_seed = derive_seed(cfg_seed(cfg), env_index)
        self._seeds: Optional[np.random.Generator] = None  # a seeded env's seeds of its engine starts
        self._pending_seed: Optional[int] = None
        self._threads: Optional[_AgentThreads] = None
        self._procs = _MatchProcesses()
        self._finalizer = weakref.finalize(self, self._procs.kill)  # never called by close(), which ends them first
        self._running = False
        self._frag_start: list = []
        self.matches = 0  # matches started
        self.aborted_matches = 0
        self.engine_starts = 0  # engine sets started (first match, restarts, aborts)

    # --- the match's engines ---
    @property
    def engines(self) -> list:
        return self._procs.engines

    @property
    def lease(self) -> Optional[PortLease]:
        return self._procs.lease

    def _run(self, fns: list, timeout: Optional[float] = None) -> list:
        if self._threads is None:
            self._threads = _AgentThreads(self.num_agents)
        return self._threads.run(fns, self.timeout if timeout is None else timeout)

    def _take_seed(self) -> int:
        if self._pending_seed is not None:
            seed, self._pending_seed = self._pending_seed, None
        elif self._seeds is not None:
            seed = int(self._seeds.integers(2**31))
        else:  # unseeded run: fresh entropy, never the same seed for every env
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        return seed % 2**31

    def _launch(self) -> None:
        """Start the engines of a new match on a freshly leased port (another port on each of a few tries)."""
        failed, error = (), None
        for _ in range(START_TRIES):
            self._procs.lease = lease_port(*self.port_range, exclude=failed)
            seed = self._take_seed()
            for p in self.players:
                p.port, p.seed = self.lease.port, seed
            try:  # the engines wait for each other up to the connect timeout: vizdoom gives up before this one
                self._run([p.start for p in self.players], timeout=connect_timeout(self.cfg) + 30.0)
            except MatchFailed as e:
                failed, error = failed + (self.lease.port,), e
                self._end_match(hard=True)
                continue
            self._procs.engines, self._running = match_engines(self.lease.port), True
            self.engine_starts += 1
            return
        raise RuntimeError(f"{self.scenario.name}: the VizDoom match did not start in {START_TRIES} tries (ports "
                           f"{', '.join(map(str, failed))}): {error}")

    def _end_match(self, hard: bool = False) -> None:
        """Close the match's games and free its port. hard (or a call still running in an engine): SIGKILL the
        engines first, which also makes the calls blocked in them return. Whatever still runs is killed, and the
        shared memory of every killed engine removed: no engine outlives its match."""
        engines = self._procs.all_engines()
        if hard or (self._threads is not None and self._threads.inflight):
            kill_engines(engines)
            if self._threads is not None and not self._threads.wait_idle(10.0):
                self._threads.stop()  # a call still stuck in vizdoom: leave its thread (a daemon) and game behind
                self._threads = None
                for p in self.players:
                    p.game = None
        for p in self.players:
            p.close()
        _, alive = psutil.wait_procs(engines, timeout=5)
        self._procs.engines = alive
        self._procs.kill()  # what did not close; frees the port
        self._running = False

    def _start_match(self, seed: Optional[int] = None) -> list:
        """The next match's first observations: new_episode on the running engines, or new engines (first match,
        an engine restart due, or engines that fail)."""
        due = self._restart_steps and self.players[0]._engine_steps >= self._restart_steps
        if self._running and due:
            self._end_match()
        if self._running:
            try:
                self._run([partial(p.new_match, seed) for p in self.players])
            except MatchFailed:  # an engine died between matches: new engines
                self._end_match(hard=True)
        if not self._running:
            self._pending_seed = seed if seed is not None else self._pending_seed
            self._launch()
        self.players[0]._add_bots()
        for p in self.players:
            p.begin()
        self._frag_start = self.players[0].frags_by_slot(self.num_players)
        self.matches += 1
        return [p._obs for p in self.players]

    # --- gym API ---
    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        if seed is not None:
            self._seeds = np.random.default_rng(seed)
        elif self._seeds is None and self._rng_seed is not None:
            self._seeds = np.random.default_rng(self._rng_seed)
        obs = self._start_match(seed)
        return obs, [{} for _ in range(self.num_agents)]

    def step(self, actions):
        if not self._running:
            raise RuntimeError(f"{self.scenario.name}: call reset() before step()")
        if len(actions) != self.num_agents:
            raise ValueError(f"{self.scenario.name} takes {self.num_agents} actions per step (got {len(actions)})")
        try:
            results = self._run([partial(p.step, a) for p, a in zip(self.players, actions)])
            obs, rewards, term, trunc, infos = map(list, zip(*results))
            if not any(term) and not any(trunc):
                return obs, rewards, term, trunc, infos
            self._report_match(infos)  # reads the finished games' counters
        except MatchFailed as e:
            return self._abort(str(e))
        A = self.num_agents
        return self._start_match(), rewards, [True] * A, [False] * A, infos

    def _report_match(self, infos: list) -> None:
        """Each agent's report of the match that just ended, with its win flag: 1.0 if it has more frags than every
        other player, learning agents and bots (ties 0.0)."""
        try:
            reports = [info.get("episode") or p._episode_report() for p, info in zip(self.players, infos)]
            frags = self.players[0].frags_by_slot(self.num_players)
        except Exception as e:  # an engine died at the match's end
            raise MatchFailed(f"reading the match's scores: {type(e).__name__}: {e}") from e
        slots = {p.slot for p in self.players}
        bots = [f - s for k, (f, s) in enumerate(zip(frags, self._frag_start)) if k not in slots]
        for info, rep, win in zip(infos, reports, match_wins([r["score"] for r in reports], bots)):
            info["episode"] = dict(rep, win=win)

    def _abort(self, reason: str):
        """The match failed: kill it, start a new one; every agent truncated with reward 0 and no report."""
        final = [p._obs for p in self.players]
        self.aborted_matches += 1
        self._end_match(hard=True)
        obs = self._start_match()
        A = self.num_agents
        infos = [{"final_obs": final[i], "match_aborted": reason} for i in range(A)]
        return obs, [0.0] * A, [False] * A, [True] * A, infos

    # --- reward shaping (population-based training: per agent, i.e. per policy) ---
    def reward_shaping_defaults(self) -> dict:
        return self.players[0].reward_shaping_defaults()

    def set_reward_shaping(self, coeffs: dict, agent: int = 0) -> None:
        """Change agent `agent`'s shaping coefficients (by param name) from its next step on."""
        self.players[agent].set_reward_shaping(coeffs)

    def render(self):
        """Every learning agent's 160x120 view, side by side: [120, 160 * A, 3] uint8."""
        return np.concatenate([p._screen for p in self.players], axis=1)

    def close(self):
        self._end_match()
        if self._threads is not None:
            self._threads.stop()
            self._threads = None
