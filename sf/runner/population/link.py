"""Population-based training across torchrun's ranks (--num_policies N --with_pbt under torchrun, the policies placed:
policy p on rank p mod world size, sf/processes/ranks.py). Rank 0's PopulationControl decides for all N policies as on
one machine (sf/runner/population/control.py); what it needs from the other ranks, and what they need of its decisions,
travels through torchrun's own store (the agent of the first node serves it), as JSON values under keys of this run:

    figures/<rank>          each rank, about every second: its policies' trained frames and episode averages
    decisions/<k>, decided  rank 0, decision batch k = 1, 2, ...: every policy's hyperparameters and the copies
                            [[policy, source], ...]; `decided` is the last k. Batch 1, before any process starts:
                            the hyperparameters to start from (a resumed run's), which the other ranks wait for
    weights/<k>/<policy>    the source's rank, for a copy of batch k to a policy of another rank: the source's
                            published weights (torch.save of its state_dict); read once, then deleted by the receiver

Every rank applies the batches in order, rank 0 included: the hyperparameters go to SharedState (its learners and
rollout workers read those of its own policies); a copy to one of its policies from one of its own is asked of the
learner as on one machine; from another rank's, once weights/<k>/<policy> is there, the weights are published into this
rank's shared slot of the source (no learner here writes it) and then the copy is asked: the learner copies them whole,
bit for bit, as on one machine. Rank 0 alone logs the decisions and writes pbt_state.json. A store that cannot be
reached (rank 0's machine gone) ends the exchange with one warning: each rank trains on with the hyperparameters it has.
"""
from __future__ import annotations

import datetime
import io
import json
import logging
import os
import time
from typing import Callable

import torch

from sf.cfg import RunError
from sf.processes import ranks
from sf.runner.population.control import PopulationControl, apply_decisions, fill_shared, request_copy
from sf.utils.files import first_line

log = logging.getLogger("sf")
PERIOD_SEC = 1.0  # how often a rank sends its figures and looks for decisions


class PopulationLink:
    def __init__(self, world: ranks.World, num_policies: int, weights: list, make_model: Callable,
                 timeout_sec: float, state=None, control: PopulationControl | None = None):
        """weights: every policy's SharedWeights in this rank; make_model: a model of the run (a scratch copy for the
        weights that travel). With `state` (this rank's SharedState, before any process starts): start() too, and
        self.hyper holds the hyperparameters every policy starts from; control: rank 0's PopulationControl."""
        self.world, self.num_policies, self.weights, self.make_model = world, num_policies, weights, make_model
        self.mine = set(world.policies(num_policies))
        try:
            self.store = ranks.agent_store(world, timeout_sec)
        except RuntimeError as e:  # (DistNetworkError: a RunError, not "cannot allocate the run's shared memory")
            raise RunError(f"rank {world.rank}: cannot reach torchrun's store at {world.master_addr}:"
                           f"{world.master_port} for PBT across ranks: {first_line(e)}") from None
        self.prefix = f"sf/pop/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        self.applied = 0  # the last decision batch applied here
        self.serving: list[tuple[int, int, int]] = []  # (batch, policy of another rank, source of this rank)
        self.receiving: list[tuple[int, int, int]] = []  # (batch, policy of this rank, source of another rank)
        self.remote: dict[int, dict] = {}  # rank 0: the other ranks' policies' latest figures
        self.scratch: torch.nn.Module | None = None
        self.last = 0.0
        self.broken = False
        self.hyper: list[dict] | None = None
        if state is not None:
            self.start(state, control, timeout_sec)

    def _key(self, *parts) -> str:
        return self.prefix + "/".join(map(str, parts))

    def _get(self, *parts) -> bytes | None:
        key = self._key(*parts)
        return self.store.get(key) if self.store.check([key]) else None

    def start(self, state, control: PopulationControl | None, timeout_sec: float) -> None:
        """Before the processes start: rank 0 publishes every policy's hyperparameters as decision batch 1 (a resumed
        run's: pbt_state.json's); the other ranks wait for it (at most `timeout_sec`) and put it into their SharedState,
        so that every learner trains its first batch with them, as on one machine."""
        if self.store is None:
            return
        if control is not None:
            self.hyper = control.hyperparams()
            self.store.set(self._key("decisions", 1), json.dumps({"hyper": self.hyper, "copies": []}))
            self.store.set(self._key("decided"), "1")
        else:
            try:
                self.store.wait([self._key("decisions", 1)], datetime.timedelta(seconds=timeout_sec))
            except RuntimeError as e:
                raise RunError(f"rank {self.world.rank}: rank 0 did not publish the population's hyperparameters "
                               f"within {timeout_sec:g} s (--distributed_timeout_sec): {first_line(e)}") from None
            self.hyper = json.loads(self.store.get(self._key("decisions", 1)))["hyper"]
            fill_shared(state, self.hyper)
        self.applied = 1

    def step(self, state, stats, control: PopulationControl | None) -> None:
        """The runner's step (every rank; `control`: rank 0's PopulationControl, else None): at most every PERIOD_SEC,
        send this rank's figures, decide (rank 0), apply the decisions, serve and receive copied weights."""
        if self.broken or self.store is None or time.monotonic() - self.last < PERIOD_SEC:
            return
        self.last = time.monotonic()
        try:
            figures = PopulationControl.figures(state, stats, sorted(self.mine))
            if control is None:
                self.store.set(self._key("figures", self.world.rank), json.dumps(figures))
            else:
                self._decide(control, figures, stats)
            self._apply(state, stats)
            self._serve()
            self._receive(state)
        except (RuntimeError, OSError) as e:  # (the store's errors: DistStoreError, DistNetworkError)
            self.broken = True
            log.warning("PBT across ranks: torchrun's store at %s:%d cannot be reached (%s); this rank trains on with "
                        "the hyperparameters it has", self.world.master_addr, self.world.master_port,
                        " ".join(str(e).split())[:200])

    def _decide(self, control: PopulationControl, figures: dict[int, dict], stats) -> None:
        """Rank 0: every policy's figures (the other ranks' latest), its decisions published as the next batch."""
        for rank in range(1, self.world.world_size):
            sent = self._get("figures", rank)
            if sent is not None:
                self.remote.update({int(p): f for p, f in json.loads(sent).items()})
        if any(p not in figures and p not in self.remote for p in range(self.num_policies)):
            return  # (a rank that has not reported yet: no decision on part of the population)
        decided = control.decide({**self.remote, **figures}, stats)
        if decided is not None:
            hyper, copies = decided
            k = self.applied + 1
            self.store.set(self._key("decisions", k), json.dumps({"hyper": hyper, "copies": copies}))
            self.store.set(self._key("decided"), str(k))

    def _apply(self, state, stats) -> None:
        """The decision batches not applied yet, in order (module docstring)."""
        decided = self._get("decided")
        for k in range(self.applied + 1, int(decided) + 1 if decided is not None else 0):
            batch = json.loads(self.store.get(self._key("decisions", k)))
            local = []
            for p, source in batch["copies"]:
                if p in self.mine and source in self.mine:
                    local.append((p, source))
                elif p in self.mine:
                    self.receiving.append((k, p, source))
                elif source in self.mine:
                    self.serving.append((k, p, source))
            apply_decisions(state, stats, batch["hyper"], local)
            self.applied = k

    def _model(self) -> torch.nn.Module:
        if self.scratch is None:
            self.scratch = self.make_model()
        return self.scratch

    def _serve(self) -> None:
        """The weights of this rank's sources that other ranks' policies copy (retried while none whole is
        published)."""
        for item in list(self.serving):
            k, p, source = item
            version = self.weights[source].load_into(self._model(), -1)
            if version < 0:
                continue
            buf = io.BytesIO()
            torch.save({"version": version, "state_dict": self._model().state_dict()}, buf)
            self.store.set(self._key("weights", k, p), buf.getvalue())
            self.serving.remove(item)

    def _receive(self, state) -> None:
        """Copies to this rank's policies from another rank's, once their weights came: published into this rank's
        slot of the source, then asked of the learner."""
        for item in list(self.receiving):
            k, p, source = item
            sent = self._get("weights", k, p)
            if sent is None:
                continue
            self.store.delete_key(self._key("weights", k, p))
            got = torch.load(io.BytesIO(sent), map_location="cpu", weights_only=True)
            model = self._model()
            model.load_state_dict(got["state_dict"])
            self.weights[source].publish(model, int(got["version"]))
            request_copy(state, p, source)
            self.receiving.remove(item)
