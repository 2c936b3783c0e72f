"""APPO: the learner's SGD step (PPO clipping + V-trace or GAE), Sample Factory paper section 3.4.

`APPO.train(experience, policy_version, on_sgd_step)` takes one training batch in the storage layout of
docs/architecture.md (`N` trajectories of `T` steps, slot `T` holding the state after the last step):

    for each of cfg.num_epochs epochs, for each of cfg.num_batches_per_epoch minibatches (trajectories
    shuffled; a single minibatch is used in place, without a copy):
        logits, values = model.forward_sequence(obs [n, T+1], ...)      # one encoder call, RNN over time
        -> time-major [T(+1), n] (a free transpose: the model's outputs are time-major underneath)
        lag = version - policy_versions; valid = lag <= cfg.max_policy_lag (async mode; hts/ppo bound the lag),
        and, in a population, only steps this policy acted (mb["own"] [n, T], from the learner)
        values of step T (learner's own weights) bootstrap V-trace (IMPALA) or GAE; a step whose episode was
        truncated (time limit) is bootstrapped from the value of its final observation (final_obs) with
        cfg.value_bootstrap (without it, a truncation is a termination)
        loss = PPO clipped surrogate + value_loss_coeff * clipped value loss + exploration loss (entropy bonus or
        symmetric KL from uniform) + kl_loss_coeff * KL(pi || mu) (masked means; sf.learning.losses.appo_loss)
        backward, clip grad norm, optimizer step (Adam or LAMB: sf.learning.optimizers) at the rate of
        sf.learning.lr_schedule, version += 1, on_sgd_step(version); the schedule moves after the step (and after
        each epoch)

With --sample_minibatches (feed-forward, GAE) a minibatch is instead a random set of single steps of the whole batch,
as m one-step trajectories carrying the batch's targets, computed once before the first epoch (_batch_targets,
sf.learning.sample_minibatches).

Minibatch order comes from a generator seeded from --seed (its state goes into checkpoints); in hts/ppo modes a
training batch is one rollout of every env, split into cfg.mode.minibatches(cfg) SGD steps of --batch_size samples.

Input normalizers (vector obs, measurements) are updated once per `train` call, from steps 0..T-1 of the
whole batch (with experience["own"], populations and multi-agent envs: only the steps this policy acted), before the
first forward. With cfg.normalize_returns the returns normalizer is updated with
each minibatch's (valid) value targets, and the critic is trained on normalized targets.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import torch

from sf.buffers.trajectory_buffers import DONES_HOST
from sf.learning.gae import gae
from sf.learning.losses import appo_loss, masked_mean, symmetric_kl_with_uniform
from sf.learning.lr_schedule import KL_ADAPTIVE, LrSchedule
from sf.learning.optimizers import make_optimizer
from sf.learning.sample_minibatches import TARGET_KEYS, sample_minibatch
from sf.learning.phase_timing import LAPS  # SF_PROFILE: phase times (benchmarks/profile_training.py)
from sf.learning.vtrace import truncation_bootstrap, vtrace
from sf.model.action_spaces import MASKED_LOGIT, action_heads
from sf.seeding import MINIBATCH, run_seed, stream_seed

if TYPE_CHECKING:
    from sf.cfg.config import Config
    from sf.cfg.shape import RunShape

OPTIMIZER_HYPERPARAMS = ("learning_rate", "exploration_loss_coeff", "adam_beta1", "adam_beta2", "adam_eps")
LOSS_KEYS = ("loss", "policy_loss", "value_loss", "exploration_loss", "kl_loss", "entropy", "kl_divergence",
             "clip_fraction", "grad_norm")
# lr: the rate the step used (Sample Factory's tag train/lr)
STAT_KEYS = (*LOSS_KEYS, "lr", "lag_min", "lag_avg", "lag_max", "masked_fraction", "num_samples", "num_masked",
             "policy_version")
SKIPPED = "skipped"  # a step's 1.0 if the optimizer skipped it (read with the stats, then taken out: APPO.last_skipped)


def exploration_loss_problem(cfg: Config, action_space) -> Optional[str]:
    """Why cfg's --exploration_loss cannot train `action_space` (one line), or None."""
    if cfg.exploration_loss == "symmetric_kl" and not action_heads(action_space):
        return (f"--exploration_loss symmetric_kl needs discrete actions (its prior is the uniform distribution over "
                f"them); the action space {action_space} is continuous: use --exploration_loss entropy")
    return None


def cfg_hyperparams(cfg: Config) -> dict[str, float]:
    """The configuration's OPTIMIZER_HYPERPARAMS (flag > saved config.json > preset, as sf.cfg.parse_cfg resolved
    them)."""
    return {k: float(getattr(cfg, k)) for k in OPTIMIZER_HYPERPARAMS}


class APPO:
    def __init__(self, model: torch.nn.Module, cfg: Config, device, policy_id: int = 0,
                 grad_hook: Optional[Callable[[], None]] = None, frames_per_sample: float = 1.0,
                 shape: Optional[RunShape] = None):
        """`grad_hook()`: called after every backward, before gradient clipping and the optimizer step (e.g.
        sf.learning.collectives.GradientAllReduce: data-parallel learners average their gradients there; the KL-adaptive
        learning rate then follows the KL of all ranks' minibatches, so that every rank keeps the same rate).
        frames_per_sample: env frames one sample stands for in the run's progress (frameskip x data-parallel ranks):
        how far an SGD step moves the linear decay of the learning rate. shape: the run's sizes (hts/ppo: the
        training batch's samples, every agent's, make the SGD steps per epoch); None: a single-agent env's."""
        self.model, self.cfg, self.device = model, cfg, torch.device(device)
        self.grad_hook = grad_hook
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer_kind = cfg.optimizer
        self.optimizer = make_optimizer(cfg.optimizer, self.params, cfg.learning_rate,
                                        (cfg.adam_beta1, cfg.adam_beta2), cfg.adam_eps)
        self.lr_schedule = LrSchedule.from_cfg(cfg)
        self.frames_per_sample = float(frames_per_sample)
        self.base_lr = float(cfg.learning_rate)
        problem = exploration_loss_problem(cfg, model.action_space)
        if problem:
            raise ValueError(problem)
        self.set_hyperparams(**cfg_hyperparams(cfg))
        self.num_minibatches = cfg.mode.minibatches(cfg, shape)  # (shape None: a single-agent env's)
        self.max_policy_lag = cfg.max_policy_lag if cfg.mode.lag_bounded else float("inf")
        # the minibatch order's generator lives on the host whatever the device: its state (a CPU generator's 5,056
        # bytes) goes into checkpoints, and a run resumes on either device (a CUDA generator's 16-byte state fits only
        # a CUDA one); the permutations it draws are the same on every device
        self.generator = torch.Generator()
        self.generator.manual_seed(stream_seed(run_seed(cfg), MINIBATCH, policy_id))
        self._placed_for: Optional[bool] = None  # fused or not: how the optimizer state was placed (None: not yet)

    def set_hyperparams(self, **values: float) -> None:
        """Hyperparameters in force from the next SGD step on: any of OPTIMIZER_HYPERPARAMS (population-based training's
        mutations; after an optimizer state was loaded, the configuration's: a loaded state brings the values of the run
        that saved it). Every param group of the optimizer gets them."""
        unknown = set(values) - set(OPTIMIZER_HYPERPARAMS)
        if unknown:
            raise ValueError(f"unknown hyperparameters {sorted(unknown)}; known: {OPTIMIZER_HYPERPARAMS}")
        self.base_lr = float(values.get("learning_rate", self.base_lr))
        for group in self.optimizer.param_groups:
            beta1, beta2 = group["betas"]
            group["lr"] = self.lr_schedule.rate(self.base_lr)
            group["betas"] = (float(values.get("adam_beta1", beta1)), float(values.get("adam_beta2", beta2)))
            group["eps"] = float(values.get("adam_eps", group["eps"]))
            # the optimizer's own (Adam: none; LAMB: Sample Factory's 1e-4): a loaded state must not change it
            group["weight_decay"] = self.optimizer.defaults["weight_decay"]
        if "exploration_loss_coeff" in values:
            self.exploration_loss_coeff = float(values["exploration_loss_coeff"])

    def hyperparams(self) -> dict[str, float]:
        """The OPTIMIZER_HYPERPARAMS in force (those of the first param group: every group holds the same);
        learning_rate is the base rate (the param groups' lr is the schedule's rate from it)."""
        group = self.optimizer.param_groups[0]
        return {"learning_rate": self.base_lr, "exploration_loss_coeff": float(self.exploration_loss_coeff),
                "adam_beta1": float(group["betas"][0]), "adam_beta2": float(group["betas"][1]),
                "adam_eps": float(group["eps"])}

    # --- one SGD step ---
    def _sgd_step(self, mb: dict, version: int) -> tuple[dict, bool, Optional[float]]:
        """One minibatch `mb` (storage layout, n trajectories of T steps): forward, targets, loss, backward, optimizer
        step. Returns (stats, whether the optimizer stepped, the KL divergence for the learning-rate schedule: the
        mean over the valid steps, of every rank's minibatch in a data-parallel run; None if none was measured)."""
        cfg, model = self.cfg, self.model
        n, t_len = mb["rewards"].shape
        num = float(n * t_len)
        valid, lag_stats = self._valid_steps(mb, version)
        # every sample too old: nothing to learn, no forward, no step, no new version (data-parallel learners still go
        # through the step: the others wait for this rank's gradients; none of them steps if no rank had any)
        # (sync-free steps: the optimizer skips it on the device instead, see _sync_free_steps)
        if self.grad_hook is None and not self._sync_free_steps() and lag_stats[3] == 0:
            out = self._stats(dict(zip(("lag_min", "lag_avg", "lag_max"), lag_stats)), num, 0.0)
            return {**out, SKIPPED: 1.0}, False, None
        given = TARGET_KEYS[0] in mb  # one-step samples with the batch's targets (sf.learning.sample_minibatches)
        # [n, T+1]: the done of step T is never used (samples: [n, 1], no state after the step)
        seq_dones = mb["dones"] if given else torch.nn.functional.pad(mb["dones"], (0, 1))
        cut_dones = mb.get(DONES_HOST)  # a CUDA batch's dones in host memory: the RNN's cuts without a device read
        if cut_dones is not None:
            cut_dones = torch.nn.functional.pad(cut_dones, (0, 1))
        normalize_returns = self._normalizes_returns()

        logits, values = model.forward_sequence(mb["obs"], mb["rnn_states"], seq_dones, cfg.recurrence,
                                                normalized_values=normalize_returns, cut_dones=cut_dones)
        logits = logits.transpose(0, 1)[:t_len]  # [T, n, L]
        values = values.transpose(0, 1)  # [T+1, n] ([1, n] for samples)
        behavior_log_probs = mb["log_probs"].t()
        dist = model.action_distribution(logits)
        log_probs = dist.log_prob(mb["actions"].transpose(0, 1))  # actions [T, n, A]
        entropy = dist.entropy()
        # KL(pi || mu) [T, n], the current policy's divergence from the behaviour policy (Sample Factory's direction):
        # the penalty's (with gradient when it has a coefficient), the statistic's and the KL-adaptive schedule's
        # (masked steps may hold anything: their behaviour logits are the policy's own there, KL 0, no NaN gradient)
        behaviour_logits = torch.where(valid.unsqueeze(-1), mb["action_logits"].transpose(0, 1), logits.detach())
        with torch.set_grad_enabled(torch.is_grad_enabled() and cfg.kl_loss_coeff != 0.0):
            kl = dist.kl_divergence(model.action_distribution(behaviour_logits))
        sym_kl = self._symmetric_kl(dist, logits) if cfg.exploration_loss == "symmetric_kl" else None
        LAPS.lap("forward")  # (and the minibatch's selection, the valid steps)
        if given:
            targets, advantages, behavior_values = (mb[k].t() for k in TARGET_KEYS)
        else:
            v = values.detach()
            v = model.returns_normalizer.denormalize(v) if normalize_returns else v
            targets, advantages, behavior_values = self._targets(mb, v, log_probs, behavior_log_probs, valid,
                                                                 normalize_returns)

        terms = appo_loss(log_probs, behavior_log_probs, advantages, values[:t_len], behavior_values, targets, entropy,
                          valid, clip_ratio=cfg.ppo_clip_ratio, clip_value=cfg.ppo_clip_value,
                          value_loss_coeff=cfg.value_loss_coeff, exploration_loss_coeff=self.exploration_loss_coeff,
                          normalize_advantage=cfg.normalize_advantage, symmetric_kl=sym_kl, kl=kl,
                          kl_loss_coeff=cfg.kl_loss_coeff)
        LAPS.lap("targets")  # (V-trace or GAE, and the loss)
        grad_norm, stepped, skipped = self._optimizer_step(terms["loss"], lag_stats[3])
        out = self._loss_stats(terms, kl, valid, grad_norm, lag_stats[3])
        out.update(zip(("lag_min", "lag_avg", "lag_max"), lag_stats))
        out = {**self._stats(out, num, lag_stats[3]), SKIPPED: skipped}
        return out, stepped, self._schedule_kl(out["kl_divergence"], lag_stats[3])

    def _symmetric_kl(self, dist, logits: torch.Tensor) -> torch.Tensor:
        """[T, n] symmetric KL of the policy's heads from the uniform distribution (logits [T, n, L]); with action
        masks, uniform over the actions the mask allows (the model gives masked ones the logit MASKED_LOGIT)."""
        allowed = None
        if getattr(self.model, "action_masked", False):
            allowed = [lg != MASKED_LOGIT for lg in torch.split(logits, dist.head_sizes, dim=-1)]
        return symmetric_kl_with_uniform(dist.log_probs_per_head, allowed)

    def _schedule_kl(self, kl: float, num_valid: float) -> Optional[float]:
        """The KL a KL-adaptive schedule adapts to (None: none measured). Data-parallel learners average every rank's
        (weighted by its valid steps, a collective on every step): each rank then adapts its rate alike."""
        if self.lr_schedule.kind not in KL_ADAPTIVE:
            return None
        # (device scalars: the one host read of a step these schedules need)
        kl, num_valid = float(kl), float(num_valid)
        if self.grad_hook is not None:
            from sf.learning.collectives import gather_rows  # (no process group: this rank's own row)
            rows = gather_rows(torch.tensor([kl * num_valid, num_valid], dtype=torch.float64, device=self.device),
                               what="the KL-adaptive learning rate's KL gather")
            kl, num_valid = float(rows[:, 0].sum()), float(rows[:, 1].sum())
            kl = kl / num_valid if num_valid > 0 else kl
        return kl if num_valid > 0 else None

    def _valid_steps(self, mb: dict, version: int) -> tuple[torch.Tensor, torch.Tensor]:
        """valid [T, n] bool: the steps to learn from (policy lag <= max_policy_lag and, in a population, acted by this
        policy); and [4] float32 on the device: lag min, mean, max (of this policy's steps; of all where it acted none)
        and the number of valid steps, for the stats (read on the host with the batch's others, see train)."""
        lag = version - mb["policy_versions"].t()  # [T, n]
        valid = lag <= self.max_policy_lag
        own = mb.get("own")  # [n, T] bool, populations: steps this policy acted (others are masked, lag unknown)
        lag_f = lag.to(torch.float32)
        if own is None:
            lo, mean, hi = lag_f.min(), lag_f.mean(), lag_f.max()
        else:  # masked reductions, not lag_f[own]: selecting by a mask reads its count on the host (a CUDA sync); the
            # lags are integers, so the sum is exact and the mean the same bits as lag_f[own].mean()
            own = own.t()
            valid = valid & own
            counted = own | ~own.any()
            inf = lag_f.new_full((), float("inf"))  # (a fill on the device: torch.tensor would copy from the host)
            lo, hi = torch.where(counted, lag_f, inf).min(), torch.where(counted, lag_f, -inf).max()
            mean = torch.where(counted, lag_f, 0.0).sum() / counted.sum().to(torch.float32)
        return valid, torch.stack([lo, mean, hi, valid.sum().float()])

    @torch.no_grad()
    def _targets(self, mb: dict, v: torch.Tensor, log_probs: Optional[torch.Tensor], behavior_log_probs: torch.Tensor,
                 valid: torch.Tensor, normalize_returns: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(value targets, advantages, behaviour values), [T, n] each, by V-trace or GAE: values v [T+1, n] (returns'
        units, not normalized) bootstrap from step T; a truncated step from the value of its final observation;
        log_probs [T, n] (V-trace's; GAE: unused, may be None). With `normalize_returns` the returns normalizer learns
        the valid targets, and the targets and the behaviour values are normalized."""
        cfg, model = self.cfg, self.model
        t_len = mb["rewards"].shape[1]
        behavior_values = mb["values"].t()
        rewards = mb["rewards"].t()
        discounts = cfg.gamma * (1.0 - mb["dones"].t())
        truncated = mb["truncated"].t()  # [T, n]
        boot = None  # --value_bootstrap False: a truncation is a termination (done: nothing after it)
        # (sync-free steps: no host test of it; where nothing is truncated the bootstrap adds zeros)
        if cfg.value_bootstrap and (self._sync_free_steps() or bool(truncated.any())):
            boot = truncation_bootstrap(truncated, self._final_values(mb, v[:t_len]), cfg.gamma)
        if cfg.with_vtrace:
            vt = vtrace(behavior_log_probs, log_probs.detach(), rewards, v[:t_len], v[t_len], discounts,
                        rho_bar=cfg.vtrace_rho, c_bar=cfg.vtrace_c, truncation_bootstrap=boot)
            targets, advantages = vt.vs, vt.advantages
        else:
            est = gae(rewards, v[:t_len], v[t_len], discounts, cfg.gae_lambda, truncation_bootstrap=boot)
            targets, advantages = est.returns, est.advantages
        if normalize_returns:
            model.returns_normalizer.update(targets, valid)
            targets = model.returns_normalizer.normalize(targets)
            behavior_values = model.returns_normalizer.normalize(behavior_values)
        return targets, advantages, behavior_values

    def _normalizes_returns(self) -> bool:
        """Whether the critic learns normalized returns (--normalize_returns, on a model that has the normalizer)."""
        return getattr(self.model, "returns_normalizer", None) is not None and self.cfg.normalize_returns

    @torch.no_grad()
    def _batch_targets(self, experience: dict, version: int) -> dict:
        """--sample_minibatches (GAE): the whole batch's targets before its first epoch, TARGET_KEYS -> [N, T] each,
        from the behaviour values (the policy workers', as CleanRL's and Sample Factory 2's GAE) and the learner's
        values of the states after the last steps (slot T) and of the final observations of truncated episodes."""
        model, t_len = self.model, experience["rewards"].shape[1]
        valid, _ = self._valid_steps(experience, version)
        last = model.forward_step({k: x[:, t_len] for k, x in experience["obs"].items()},
                                  experience["rnn_states"][:, t_len])  # (values in returns' units)
        v = torch.cat([experience["values"].t(), last.values.float().unsqueeze(0)])  # [T+1, N]
        normalize_returns = self._normalizes_returns()
        out = self._targets(experience, v, None, experience["log_probs"].t(), valid, normalize_returns)
        return {k: x.t() for k, x in zip(TARGET_KEYS, out)}

    # None: _sync_free_steps decides by the device; True/False force it (tests: the sync-free path on CPU)
    sync_free: Optional[bool] = None
    last_skipped = 0  # the optimizer steps the last `train` call skipped (a non-finite gradient, no valid step)

    def _sync_free_steps(self) -> bool:
        """Whether SGD steps run without reading a device value on the host: on CUDA, with Adam, on one rank. Then a
        step's statistics stay device tensors until `train` reads the batch's at once, and a step is skipped on the
        device (fused Adam's found_inf) rather than by the host; the host counts every step as stepped (the version
        advances; the weights it publishes are unchanged). Elsewhere the host decides, exactly as before: reading a
        CPU tensor costs nothing, LAMB's step count is a host integer, and data-parallel ranks must agree whether any
        of them had a gradient."""
        if self.sync_free is not None:
            return self.sync_free
        return self.device.type == "cuda" and self.grad_hook is None and self.optimizer_kind == "adam"

    def _optimizer_step(self, loss: torch.Tensor, num_valid: torch.Tensor) -> tuple[torch.Tensor, bool, object]:
        """Backward, gradient hook, clip, optimizer step; num_valid: the minibatch's valid steps (0-d tensor). Returns
        (gradient norm before clipping, whether the host counts it as stepped, 1.0 if the optimizer skipped it else 0.0:
        sync-free steps, a 0-d device tensor read with the batch's stats). A non-finite gradient would destroy the
        weights: the step is skipped (grad_norm shows it); sync-free steps also skip one without valid steps here (see
        _sgd_step)."""
        cfg = self.cfg
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        LAPS.lap("backward")
        if self.grad_hook is not None:  # before clipping: the clip and the step must see the averaged gradients
            self.grad_hook()
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm and cfg.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        sync_free = self._sync_free_steps()
        self._set_fused(sync_free)
        if sync_free:  # skipped on the device, the way torch.amp.GradScaler skips a step: no update, no step count
            # (found_inf: the attribute torch's fused Adam reads, as GradScaler sets it; not in its type)
            skipped = self.optimizer.found_inf = (  # type: ignore[attr-defined]
                ~torch.isfinite(grad_norm) | (num_valid == 0)).float()
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf  # type: ignore[attr-defined]
            stepped = True
        else:
            stepped = bool(torch.isfinite(grad_norm)) and (self.grad_hook is None or float(grad_norm) > 0)
            if stepped:
                self.optimizer.step()
            skipped = float(not stepped)
        LAPS.lap("optimizer")  # (the gradient hook, clipping, the step)
        return grad_norm, stepped, skipped

    def _set_fused(self, fused: bool) -> None:
        """Adam's fused implementation (sync-free steps: it takes found_inf) or torch's default (whose bits the host
        path keeps), set before each step: a loaded optimizer state brings the saving run's setting with it, and the
        step counts where the saving run kept them (a checkpoint is loaded onto this run's device, and may come from
        the other one). The fused implementation keeps each step count as a float32 tensor beside its parameter, the
        default one on the host (on a device, every step would read each count back)."""
        if self._placed_for == bool(fused):
            return
        self._placed_for = bool(fused)
        want = True if fused else None
        for group in self.optimizer.param_groups:
            if "fused" in group:
                group["fused"] = want
            for p in group["params"]:
                state = self.optimizer.state.get(p)
                if state and torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(p.device if fused else "cpu", torch.float32)

    def _permutation(self, n: int, device: torch.device) -> torch.Tensor:
        """[n] int64 on `device`: a random order of the batch's trajectories, drawn on the host (see __init__); on CUDA
        copied from pinned memory, so that the copy is queued without waiting for the device."""
        perm = torch.randperm(n, generator=self.generator)
        if device.type == "cuda":
            perm = perm.pin_memory().to(device, non_blocking=True)
        return perm

    def load_minibatch_rng(self, saved: torch.Tensor) -> bool:
        """Restore the minibatch order's generator from a checkpoint's state (uint8 [5056]). Returns False, having
        seeded it from that state instead, for the 16-byte state of a CUDA generator (seed and offset: what checkpoints
        of CUDA runs held before the generator moved to the host), which a host generator cannot take: the order then
        differs from the one the saving run would have drawn, deterministically."""
        saved = saved.detach().cpu().to(torch.uint8)
        if saved.numel() == self.generator.get_state().numel():
            self.generator.set_state(saved)
            return True
        self.generator.manual_seed(int.from_bytes(bytes(saved.tolist()), "little") % 2**63)
        return False

    @torch.no_grad()
    def _loss_stats(self, terms: dict, kl: torch.Tensor, valid: torch.Tensor, grad_norm: torch.Tensor,
                    num_valid: torch.Tensor) -> dict:
        """The loss terms, the KL divergence of the policy from the behaviour policy (kl [T, n]), the clipped fraction
        and the gradient norm (means over the valid steps): the LOSS_KEYS, 0-d tensors on the device (train reads them
        on the host). 0 without valid steps (sync-free steps: a step the optimizer skipped; num_valid 0-d)."""
        ratio = terms["ratio"]
        eps = self.cfg.ppo_clip_ratio
        clipped = (ratio > 1.0 + eps) | (ratio < 1.0 / (1.0 + eps))
        values = torch.stack([
            terms["loss"].detach(), terms["policy_loss"].detach(), terms["value_loss"].detach(),
            terms["exploration_loss"], terms["kl_loss"], terms["entropy"], masked_mean(kl.detach(), valid),
            masked_mean(clipped.float(), valid), grad_norm.float(),
        ])
        if self._sync_free_steps():
            values = torch.where(num_valid > 0, values, torch.zeros((), dtype=values.dtype, device=values.device))
        return dict(zip(LOSS_KEYS, values.unbind()))

    @torch.no_grad()
    def _final_values(self, mb: dict, values: torch.Tensor) -> torch.Tensor:
        """[T, n] values of the observations truncated episodes ended in: V(final_obs) (learner's weights, the policy
        worker's RNN state) at the step each trajectory's first truncation kept; V(x_t) at later ones in the same
        trajectory, which kept no final observation (episodes shorter than --rollout cut by a time limit)."""
        out = values.clone()  # values: [T, n] denormalized V(x_t)
        final_t = mb["final_t"]  # [n], -1 where the trajectory kept no final observation
        if self._sync_free_steps():  # every row through the model: which rows kept one is not read on the host
            cols = torch.arange(final_t.shape[0], device=final_t.device)
            at = final_t.clamp(min=0)
            step = self.model.forward_step(mb["final_obs"], mb["final_rnn"])  # (rows without one: anything, unused)
            out[at, cols] = torch.where(final_t >= 0, step.values.float(), out[at, cols])
            return out
        rows = (final_t >= 0).nonzero().squeeze(1)
        if rows.numel():
            obs = {k: v.index_select(0, rows) for k, v in mb["final_obs"].items()}
            step = self.model.forward_step(obs, mb["final_rnn"].index_select(0, rows))
            out[final_t.index_select(0, rows), rows] = step.values.float()
        return out

    def _stats(self, out: dict, num: float, num_valid) -> dict:
        """One step's stats: `out` (LOSS_KEYS and lag stats, 0-d tensors or floats), num samples, num_valid (0-d tensor
        or float); masked_fraction and num_masked follow from num_valid once _host_stats has read it."""
        for k in LOSS_KEYS:
            out.setdefault(k, 0.0)
        out["masked_fraction"] = num_valid  # (until _host_stats reads it: then 1 - num_valid / num)
        out["num_masked"] = None  # (_host_stats: num - num_valid)
        out["num_samples"] = num
        out["lr"] = float(self.optimizer.param_groups[0]["lr"])
        return out

    def _apply_lr(self) -> None:
        """The schedule's rate from the base rate, into every param group (from the next SGD step on)."""
        rate = self.lr_schedule.rate(self.base_lr)
        for group in self.optimizer.param_groups:
            group["lr"] = rate

    # --- checkpoints ---
    def training_state(self) -> dict:
        """What a checkpoint keeps beside the optimizer's state (weights_only-safe): which optimizer it is and the
        learning-rate schedule's state."""
        return {"optimizer_kind": self.optimizer_kind, "lr_schedule": self.lr_schedule.state_dict()}

    def load_training_state(self, state: dict) -> bool:
        """Restore the schedule's state from a checkpoint `state` (older checkpoints have none: the schedule starts
        afresh) and apply its rate. Returns whether the checkpoint's optimizer state fits this optimizer (older
        checkpoints are Adam's)."""
        self.lr_schedule.load_state_dict(state.get("lr_schedule"))
        self._apply_lr()
        self._placed_for = None  # the optimizer state about to be loaded is placed for this run's Adam at the next step
        return state.get("optimizer_kind", "adam") == self.optimizer_kind

    # --- one training batch ---
    def train(self, experience: dict, policy_version: int, on_sgd_step: Optional[Callable[[int], None]] = None,
              env_frames: Optional[float] = None) -> list[dict]:
        """Run cfg.num_epochs x cfg.num_batches_per_epoch SGD steps on `experience` (storage layout, see the
        module docstring); calls `on_sgd_step(new_version)` after each step. Returns one stats dict per step
        (keys STAT_KEYS, floats). A minibatch whose samples are all older than cfg.max_policy_lag (or whose
        gradient is not finite) does no optimizer step and does not advance the version (CUDA, _sync_free_steps: the
        step is skipped on the device and the version advances). env_frames: the env frames
        the run trained on before this batch (the learner's count: linear_decay's progress; None: the schedule's own
        count goes on)."""
        cfg, model = self.cfg, self.model
        model.train()
        n_traj, t_len = experience["rewards"].shape
        samples = cfg.sample_minibatches and self.num_minibatches > 1  # minibatches of samples, not of trajectories
        units = n_traj * t_len if samples else n_traj
        num_mb = max(1, min(self.num_minibatches, units))
        if hasattr(model, "update_normalizers"):  # (with "own": the steps this policy acted; an inactive agent's zero
            # observations, or another policy's, would pull its statistics)
            model.update_normalizers({k: v[:, :t_len] for k, v in experience["obs"].items()}, experience.get("own"))
        schedule = self.lr_schedule
        if env_frames is not None:
            schedule.frames = float(env_frames)
        self._apply_lr()
        LAPS.lap("prepare")  # (the input normalizers' update)

        version = int(policy_version)
        targets = self._batch_targets(experience, version) if samples else None
        all_stats = []
        for _ in range(cfg.num_epochs):
            if num_mb == 1:
                minibatches = [experience]
            else:
                device = experience["rewards"].device
                perm = (self._permutation(units, device) if cfg.shuffle_minibatches
                        else torch.arange(units, device=device))
                # lazy: one copy at a time
                minibatches = (sample_minibatch(experience, targets, idx) if samples else _index(experience, idx)
                               for idx in torch.tensor_split(perm, num_mb))
            epoch_kls = []
            for mb in minibatches:
                stats, stepped, kl = self._sgd_step(mb, version)
                LAPS.lap("stats")
                if stepped:
                    version += 1
                    if on_sgd_step is not None:
                        on_sgd_step(version)
                LAPS.lap("publish")  # (the new weights into shared memory)
                stats["policy_version"] = float(version)
                all_stats.append(stats)
                # each sample's frames count once over the epochs (the learner's frame count grows by the batch's)
                schedule.advance(stats["num_samples"] * self.frames_per_sample / cfg.num_epochs)
                schedule.after_minibatch(self.base_lr, kl)
                if kl is not None:
                    epoch_kls.append(kl)
                self._apply_lr()
            schedule.after_epoch(self.base_lr, epoch_kls)
            self._apply_lr()
        all_stats = _host_stats(all_stats)
        self.last_skipped = int(sum(s.pop(SKIPPED) for s in all_stats))
        return all_stats


def _host_stats(all_stats: list[dict]) -> list[dict]:
    """The steps' stats as floats: their device values read in one transfer (on CUDA the batch's one host
    synchronisation for them), and the masked fraction and count from each step's number of valid steps."""
    tensors = [v for s in all_stats for v in s.values() if torch.is_tensor(v)]
    values = iter(torch.stack(tensors).tolist() if tensors else ())
    for s in all_stats:
        for k, v in s.items():
            if torch.is_tensor(v):
                s[k] = next(values)
        num_valid, num = s["masked_fraction"], s["num_samples"]  # (_stats: the number of valid steps until here)
        s["masked_fraction"], s["num_masked"] = 1.0 - num_valid / num, num - num_valid
    return all_stats


def _index(experience: dict, idx: torch.Tensor) -> dict:
    """The trajectories `idx` of a batch; its host dones (DONES_HOST) stay whole: selecting them would read `idx` from
    the device, and the RNN may cut a minibatch where any trajectory of the batch ended (more segments, same result)."""
    out = {}
    for k, v in experience.items():
        if k == DONES_HOST:
            out[k] = v
        else:
            out[k] = _index(v, idx) if isinstance(v, dict) else v.index_select(0, idx)
    return out
