"""No silent no-ops: every flag of Sample Factory 2.1.1 (sf/cfg/sf_flag_list.py, read off its parsers) is ours under
the same name and used by the code, an alias of one of ours, a flag of which only the value we implement is accepted,
or accepted and ignored because it changes nothing that is trained (a reason from sf_compat.COSMETIC: logging,
checkpoints, Sample Factory's process internals, options of a refused feature, the Hub), listed under that reason in
docs/sf_flags.md. A flag that would change training is implemented or refused in one line."""
import re
from pathlib import Path

import pytest

from sf.cfg import SF_FLAGS, all_params
from sf.cfg.sf_compat import COSMETIC
from sf.cfg.sf_flag_list import SF_2_1_1_FLAGS

ROOT = Path(__file__).resolve().parents[2]
PARAMS = {p.name: p for p in all_params()}
BY_NAME = {f.name: f for f in SF_FLAGS}
# where parameters are declared, not used
TABLES = {"sf/cfg/params.py", "sf/cfg/sf_compat.py", "sf/cfg/sf_flag_list.py", "sf_envs/params.py"}
CODE = {str(p.relative_to(ROOT)): p.read_text() for d in ("sf", "sf_envs") for p in (ROOT / d).rglob("*.py")
        if str(p.relative_to(ROOT)) not in TABLES}
# the flags the training system once accepted and ignored although they change what is trained
ONCE_SILENT = ["value_bootstrap", "obs_scale", "obs_subtract_mean", "normalize_input_keys", "policy_init_gain",
               "initial_stddev", "shuffle_minibatches", "lr_schedule_kl_threshold", "lr_adaptive_min",
               "lr_adaptive_max"]


def used_by_the_code(name: str) -> list[str]:
    """Modules outside the parameter tables that read `name`: cfg.name / args.name, or the name quoted (getattr,
    hyperparameter tables keyed by name, env parameter lookups)."""
    pattern = re.compile(rf"\.{name}\b|[\"']{name}[\"']")
    return [path for path, text in CODE.items() if pattern.search(text)]


def documented_reasons() -> dict[str, str]:
    """docs/sf_flags.md, "Accepted and ignored": reason -> the text of its item (the flags listed under it)."""
    text = (ROOT / "docs" / "sf_flags.md").read_text()
    section = text[text.index("## Accepted and ignored"):].split("\n\n")[0]
    items = re.split(r"\n- ", section)[1:]
    return {item.split(":", 1)[0]: item for item in items}


@pytest.mark.parametrize("name", SF_2_1_1_FLAGS)
def test_every_sample_factory_flag_is_implemented_aliased_restricted_or_cosmetic(name):
    if name in PARAMS:
        assert name not in BY_NAME, f"--{name} is both a parameter and a Sample Factory flag entry"
        assert used_by_the_code(name), f"--{name} is a parameter that no module reads: a silent no-op"
        return
    assert name in BY_NAME, f"--{name} (Sample Factory 2.1.1) is neither a parameter nor in SF_FLAGS"
    f = BY_NAME[name]
    if f.kind == "alias":
        assert f.target in PARAMS and used_by_the_code(f.target), f
    elif f.kind == "only":
        assert f.ok, f  # anything but these values is refused in one line (tests/cfg/test_sf_flags.py)
    else:
        assert f.kind == "ignored", f
        assert f.category in COSMETIC, f"--{name} is ignored without a reason that makes it cosmetic"
        listed = "cpc_*" if name.startswith("cpc_") else name  # the docs name CPC|A's options together
        assert re.search(rf"(^|[ ,]){re.escape(listed)}[,( ]", documented_reasons().get(f.category, "")), \
            f"--{name}: not listed under '{f.category}' in docs/sf_flags.md"


@pytest.mark.parametrize("name", ONCE_SILENT)
def test_flags_that_change_training_are_never_ignored(name):
    assert name in PARAMS and used_by_the_code(name), name


def test_the_walk_can_fail():
    """The checks above would catch a parameter nobody reads and an ignored flag without a cosmetic reason."""
    assert not used_by_the_code("a_flag_nobody_reads")
    from sf.cfg import sf_compat
    with pytest.raises(AssertionError):
        sf_compat._ignored("value_bootstrap", "changes training", bool, "no reason")
