"""A probe of how far each SGD step moves the policy, for benchmarks/policy_lag.py --step_kl: on PYTHONPATH (with
STEP_KL_LOG set to a file) it wraps one learner step, ours (sf.learning.appo.APPO._sgd_step) or Sample Factory
2.1.1's (its Learner._calculate_losses and _after_optimizer_step), in every process of the run. Discrete action spaces.

Per SGD step it appends one JSON line to STEP_KL_LOG: the policy version before the step ("v"); "step_kl", the mean
over the minibatch of KL(pi_after || pi_before), the policy after the step against the one before, on the same
samples (one more forward pass); "beh_kl", the mean KL(pi_before || mu) from the behaviour policy (the learner's own
statistic); and "by_lag": lag -> [that mean over the samples of that lag, their number]. The modules are patched when
they are first imported (a meta path finder): importing them here would import this trainer's `sf` from wherever the
interpreter finds it before the run's own directory is on sys.path."""
import importlib.abc
import importlib.util
import json
import os
import sys

LOG = os.environ.get("STEP_KL_LOG")


def _record(version, pre, post, behaviour, lag):
    """pre, post, behaviour: logits [..., A]; lag [...] (the step's version minus the acting version)."""
    import torch
    lp_pre, lp_post = torch.log_softmax(pre.float(), -1), torch.log_softmax(post.float(), -1)
    lp_beh = torch.log_softmax(behaviour.float(), -1)
    step_kl = (lp_post.exp() * (lp_post - lp_pre)).sum(-1)
    beh_kl = (lp_pre.exp() * (lp_pre - lp_beh)).sum(-1)
    rec = {"v": int(version), "step_kl": step_kl.mean().item(), "beh_kl": beh_kl.mean().item(),
           "by_lag": {int(x): [beh_kl[lag == x].mean().item(), int((lag == x).sum())] for x in lag.unique().tolist()}}
    with open(LOG, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _patch_ours(module):
    import torch
    original = module.APPO._sgd_step

    def sgd_step(self, mb, version):
        model, calls = self.model, []
        forward = model.forward_sequence

        def capture(*args, **kwargs):  # the step's own forward pass: its inputs, its logits
            out = forward(*args, **kwargs)
            calls.append((args, kwargs, out[0].detach()))
            return out

        model.forward_sequence = capture
        try:
            result = original(self, mb, version)
        finally:
            del model.forward_sequence
        if calls and result[1]:  # (a skipped step moved nothing)
            args, kwargs, pre = calls[0]
            with torch.no_grad():
                post = forward(*args, **kwargs)[0]
            t_len = mb["rewards"].shape[1]
            _record(version, pre.transpose(0, 1)[:t_len], post.transpose(0, 1)[:t_len],
                    mb["action_logits"].transpose(0, 1), version - mb["policy_versions"].t())
        return result

    module.APPO._sgd_step = sgd_step


def _patch_sample_factory(module):
    import torch
    learner = module.Learner
    calculate, after = learner._calculate_losses, learner._after_optimizer_step

    def calculate_losses(self, mb, num_invalids):
        out = calculate(self, mb, num_invalids)
        if not getattr(self, "_probe_inner", False):
            self._probe_step = (mb, num_invalids, out[0].raw_logits.detach().clone())
        return out

    def after_optimizer_step(self):
        mb, num_invalids, pre = self._probe_step
        self._probe_inner = True
        try:
            with torch.no_grad():
                post = calculate(self, mb, num_invalids)[0].raw_logits
        finally:
            self._probe_inner = False
        _record(self.train_step, pre, post, mb.action_logits, self.train_step - mb.policy_version)
        after(self)

    learner._calculate_losses, learner._after_optimizer_step = calculate_losses, after_optimizer_step


PATCHES = {"sf.learning.appo": _patch_ours, "sample_factory.algo.learning.learner": _patch_sample_factory}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)  # the spec the other finders give
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_and_patch
        return spec


if LOG:
    sys.meta_path.insert(0, _PatchAfterImport())
