"""The package's layers (docs/architecture.md, "Package layout"): a module imports only its own layer or lower ones,
checked on the source of every module (imports inside functions included). The env integrations (sf_envs) are a
package of their own that never imports the training system. And no import circle, among sf's and sf_envs' modules,
module-level and function-level imports alike."""
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
    {"sf.learning", "sf.sampling"},
    {"sf.policy_loading"},
    {"sf.runner", "sf.enjoy", "sf.train", "sf.plot", "sf.eval", "sf.export", "sf.card", "sf.import_sf",
     "sf.autolayout", "sf.launch"},
]
# and within a layer, these never import each other
SEPARATE = [{"sf.learning", "sf.sampling"}]
# where a module may import the env integrations: where envs are made, listed or configured
MAY_IMPORT_ENVS = {"sf.cfg", "sf.sampling", "sf.runner.runner", "sf.runner.startup.preflight",
                   "sf.runner.startup.fork_server", "sf.policy_loading", "sf.enjoy", "sf.eval", "sf.export",
                   "sf.import_sf", "sf.autolayout.measure"}


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


def modules(package: str, root: Path = ROOT):
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
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


# --- import circles ---

def _is_submodule(name: str, root: Path) -> bool:
    """Whether the dotted `name` is a module file or package under root (an extension module included)."""
    path = root / Path(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file() or any(path.parent.glob(path.name + ".*.so"))


def import_graph(packages=("sf", "sf_envs"), root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> {module of the packages it imports: the line of the first such import}, every import statement of
    its source (inside functions too). `import a.b` and `from a import b` (b a module) name a.b, `from a.b import
    name` names a.b; importing a module runs the packages above it first, so they count too, except the importer's
    own (already running when it runs)."""
    known = {m: path for package in packages for m, path in modules(package, root)}
    graph: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1 + is_package)}
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{a.name}" if _is_submodule(f"{node.module}.{a.name}", root)
                         else node.module for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    target = ".".join(parts[:i])
                    if target in known and target not in own and target != module:
                        edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def import_circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle [m0, m1, ..., m0] per group of modules that import each other (a strongly connected component,
    Tarjan's algorithm): the shortest one through the group's first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                groups.append(set(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_shortest_circle(graph, group) for group in groups]


def _shortest_circle(graph: dict[str, dict[str, int]], group: set[str]) -> list[str]:
    start = min(group)
    parent: dict[str, str] = {}  # w -> v: v imports w, on a shortest way from start (breadth first, within the group)
    frontier = [start]
    while start not in parent:
        next_frontier = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w in group and w not in parent:
                    parent[w] = v
                    next_frontier.append(w)
        frontier = next_frontier
    path, v = [start], parent[start]
    while v != start:
        path.append(v)
        v = parent[v]
    return [start] + path[::-1]


def test_no_import_circle():
    graph = import_graph()
    circles = [" -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(c, c[1:])) + f" -> {c[-1]}"
               for c in import_circles(graph)]
    assert not circles, "import circles (move the shared code into a module both can import):\n" + "\n".join(circles)


def test_the_circle_checker_sees_function_level_circles(tmp_path):
    """The checker itself: a circle closed by an import inside a function is found; a package importing its own
    module, and a module importing a sibling through the package, are not circles."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.c import C\n")
    (pkg / "a.py").write_text("import pkg.b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import g\n")
    (pkg / "c.py").write_text("from pkg import d\nC = 1\n")
    (pkg / "d.py").write_text("")
    graph = import_graph(("pkg",), tmp_path)
    assert graph["pkg.b"] == {"pkg.a": 2} and graph["pkg.c"] == {"pkg.d": 1}
    assert import_circles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]
