"""The README is a front door a newcomer reads in minutes, and the pages it links to exist: every relative link of
README.md, benchmarks/README.md and docs/*.md resolves to a file (and its #anchor to a heading of that file, GitHub's
way), the README keeps its Quick start with the two commands, stays short and has no line a terminal must wrap; and
benchmarks/README.md indexes every script of benchmarks/."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading):
    """GitHub's anchor of a heading: lowercase, punctuation dropped (not '-' or '_'), spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path):
    anchors, seen, fenced = set(), {}, False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            slug = _slug(m.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _links(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # no links inside code blocks
    return [m.group(1) for m in LINK.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    bad = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):
            continue  # http(s), mailto: not checked here
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            bad.append(f"{link}: no file {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            bad.append(f"{link}: no heading with anchor #{anchor} in {path.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert "## Quick start" in lines
    assert "make train      # set up, then: python train.py --env doom_basic --experiment quickstart " \
           "--train_for_env_steps 400000" in lines
    assert "make test       # set up, then the suite, 4 tests at once (pytest-xdist), then the few that run alone " \
           "(CI: .ci/run)" in lines
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: details belong in docs/"
    long = [f"{i}: {len(line)} characters" for i, line in enumerate(lines, 1) if len(line) > 120]
    assert not long, "README.md lines over 120 characters:\n" + "\n".join(long)


def test_benchmarks_readme_has_a_row_per_script():
    """One row per script of benchmarks/ (its shared module common.py aside), none for a script that is gone."""
    scripts = {p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh")} - {"common.py"}
    rows = re.findall(r"^\| `([^`]+)` \|", (ROOT / "benchmarks" / "README.md").read_text(), flags=re.M)
    assert len(rows) == len(set(rows)), f"benchmarks/README.md: a script with two rows: {rows}"
    assert set(rows) == scripts, (f"benchmarks/README.md: no row for {sorted(scripts - set(rows))}; "
                                  f"a row for no script: {sorted(set(rows) - scripts)}")
