"""The package's layers (docs/architecture.md, "Package layout"): a module imports only its own layer or lower ones,
checked on the source of every module (imports inside functions included). The env integrations (sf_envs) are a
package of their own that never imports the training system."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# lowest first; a module may import modules of its own layer or of lower layers, never of higher ones
LAYERS = [
    {"sf.utils", "sf.ipc", "sf.seeding", "sf.processes"},
    {"sf.cfg"},
    {"sf.model"},
    {"sf.buffers"},
    {"sf.learning", "sf.sampling", "sf.distributed"},
    {"sf.runner", "sf.enjoy", "sf.train", "sf.plot", "sf.eval", "sf.export", "sf.card", "sf.import_sf",
     "sf.autolayout", "sf.launch"},
]
# and within a layer, these never import each other
SEPARATE = [{"sf.learning", "sf.sampling"}]
# where a module may import the env integrations: where envs are made, listed or configured
MAY_IMPORT_ENVS = {"sf.cfg", "sf.sampling", "sf.runner.runner", "sf.runner.preflight", "sf.runner.fork_server",
                   "sf.enjoy", "sf.eval", "sf.export", "sf.import_sf", "sf.autolayout"}


def unit(module: str) -> str:
    """The layer unit of a module: sf.learning.appo -> sf.learning, sf.cfg -> sf.cfg."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "sf" else parts[0]


def layer_of(module: str) -> int:
    u = unit(module)
    for i, layer in enumerate(LAYERS):
        if u in layer:
            return i
    raise AssertionError(f"{module}: no layer (add its package to LAYERS in tests/test_layers.py)")


def imports(path: Path, module: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement of the file (`from sf.x import y` also as sf.x.y when y is
    a module). Relative imports are not used in this code base: they are reported as such."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                raise AssertionError(f"{module} line {node.lineno}: relative import (write the absolute sf... path)")
            out.append((base, node.lineno))
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names if f"{base}.{a.name}".startswith("sf.")
                    and (ROOT / Path(*f"{base}.{a.name}".split("."))).with_suffix(".py").exists()]
    return out


def modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
        yield ".".join(parts), path


SF_MODULES = [m for m in modules("sf") if m[0] != "sf"]


@pytest.mark.parametrize("module,path", SF_MODULES, ids=[m for m, _ in SF_MODULES])
def test_sf_modules_import_only_their_layer_or_lower(module, path):
    mine = layer_of(module)
    problems = []
    for name, line in imports(path, module):
        if name.startswith("sf_envs"):
            if not any(module == m or module.startswith(m + ".") for m in MAY_IMPORT_ENVS):
                problems.append(f"line {line}: imports {name} (the env integrations)")
            continue
        if not name.startswith("sf.") or unit(name) == unit(module):
            continue
        if layer_of(name) > mine:
            problems.append(f"line {line}: imports {name} (layer {layer_of(name)} above {unit(module)}'s {mine})")
        for group in SEPARATE:
            if unit(module) in group and unit(name) in group:
                problems.append(f"line {line}: imports {name} ({' and '.join(sorted(group))} stay apart)")
    assert not problems, f"{module}:\n" + "\n".join(problems)


def test_env_integrations_never_import_the_training_system():
    problems = [f"{m} line {line}: imports {name}" for m, path in modules("sf_envs")
                for name, line in imports(path, m) if name == "sf" or name.startswith("sf.")]
    assert not problems, "\n".join(problems)


def test_the_checker_sees_violations(tmp_path):
    """The checker itself: a function-level import of a higher layer is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from sf.runner.runner import Runner\n")
    assert ("sf.runner.runner", 2) in imports(bad, "sf.learning.bad")
    assert layer_of("sf.runner.runner") > layer_of("sf.learning.bad")
