"""The import graph of the package: every module sits in one layer (LAYERS, lowest first) and imports only its own
layer and the ones below, so library code never imports a command (resfl_lightning.cli, the entry aliases); and no
module imports itself around a cycle. Every import counts, also one inside a function: a lazy import only hides an
upward edge or a cycle until the function runs."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# callbacks/ is installed as resfl_lightning.callbacks (pyproject.toml's package-dir)
ROOTS = {"resfl_lightning": REPO / "resfl_lightning", "resfl_lightning.callbacks": REPO / "callbacks"}
COMMANDS = ("resfl_lightning.cli", "resfl_lightning.train", "resfl_lightning.__main__")
PACKAGE = "resfl_lightning"
# The layers, lowest first; each names subpackages and modules of the package ("__init__": the package itself). A
# module imports its own layer and the ones below, never one above; docs/design.md says what each layer is for.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "env", "env_lock", "resources", "memo", "digest", "values", "types", "config"),  # the kernel
    ("metrics", "losses", "models"),
    ("data",),
    ("clients", "aggregation", "privacy", "baselines", "algorithms"),  # the plug-ins around a client and the server
    ("federation",),
    ("evaluation",),
    ("attacks",),
    ("callbacks",),
    ("run_config", "builders", "trained"),
    ("analysis", "benchmarks"),
    ("cli", "train", "__main__"),  # the commands
)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: Path
    line: int
    statement: str

    def where(self, root: Path) -> str:
        path = self.path.relative_to(root) if self.path.is_relative_to(root) else self.path
        return f"{path}:{self.line}: {self.statement}"


def module_files(roots: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name -> file for every .py under each root; a package's __init__.py is the package itself."""
    out = {}
    for prefix, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((prefix, *parts))] = path
    return out


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is one of our modules (None: an outside library)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    # `from package import name`: an edge to the submodule when `name` is one, else to the package (its __init__)
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def import_edges(modules: dict[str, Path]) -> list[Edge]:
    """Every import between our modules, wherever it stands in the file (module level, function, class)."""
    edges = []
    for module, path in modules.items():
        source = path.read_text()
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _targets(node, module, path.name == "__init__.py", modules):
                target = _known(name, modules)
                if target is not None and target != module:
                    edges.append(Edge(module, target, path, node.lineno, ast.get_source_segment(source, node)))
    return edges


def is_command(module: str, commands: tuple[str, ...] = COMMANDS) -> bool:
    return any(module == c or module.startswith(c + ".") for c in commands)


def command_imports(edges: list[Edge], commands: tuple[str, ...] = COMMANDS) -> list[Edge]:
    """Edges from a library module to a command module."""
    return [e for e in edges if not is_command(e.source, commands) and is_command(e.target, commands)]


def layer_name(module: str, package: str = PACKAGE) -> str:
    """The module's name inside the package ("__init__" for the package itself)."""
    return "__init__" if module == package else module.removeprefix(package + ".")


def placement(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS,
              package: str = PACKAGE) -> tuple[int, str] | None:
    """(layer index, listed name) of the longest listed name that is the module or one of its enclosing packages
    (None: listed nowhere)."""
    name = layer_name(module, package)
    found = [(index, listed) for index, names in enumerate(layers) for listed in names
             if name == listed or name.startswith(listed + ".")]
    return max(found, key=lambda f: len(f[1]), default=None)


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS, package: str = PACKAGE) -> int | None:
    place = placement(module, layers, package)
    return None if place is None else place[0]


def unplaced(modules: dict[str, Path], layers: tuple[tuple[str, ...], ...] = LAYERS,
             package: str = PACKAGE) -> list[str]:
    """Modules no layer lists: a new top-level package or module must be placed before it can be checked."""
    return sorted(m for m in modules if placement(m, layers, package) is None)


def upward_imports(edges: list[Edge], layers: tuple[tuple[str, ...], ...] = LAYERS,
                   package: str = PACKAGE) -> list[Edge]:
    """Edges from a module to a module of a higher layer."""
    def above(e: Edge) -> bool:
        source, target = layer_of(e.source, layers, package), layer_of(e.target, layers, package)
        return source is not None and target is not None and target > source

    return [e for e in edges if above(e)]


def describe_upward(edge: Edge, root: Path, layers: tuple[tuple[str, ...], ...] = LAYERS,
                    package: str = PACKAGE) -> str:
    (low, source), (high, target) = placement(edge.source, layers, package), placement(edge.target, layers, package)
    return f"{edge.where(root)}  ({source}, layer {low + 1}, imports {target}, layer {high + 1})"


def _graph(edges: list[Edge]) -> dict[str, dict[str, Edge]]:
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        graph.setdefault(e.source, {}).setdefault(e.target, e)
    return graph


def tangles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each module in one can reach itself."""
    graph = _graph(edges)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return components


def find_cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One cycle (its edges, in order) through the first module of every tangle."""
    graph = _graph(edges)
    return [_cycle_in(c[0], set(c), graph) for c in tangles(edges)]


def _cycle_in(start: str, component: set[str], graph: dict[str, dict[str, Edge]]) -> list[Edge]:
    """The shortest path start -> ... -> start inside the component (breadth first)."""
    parent: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w, edge in sorted(graph.get(v, {}).items()):
                if w == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, parent[path[0].source])
                    return path
                if w in component and w not in parent:
                    parent[w] = edge
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def describe_cycle(cycle: list[Edge], root: Path) -> str:
    names = " -> ".join([cycle[0].source, *(e.target for e in cycle)])
    return names + "".join(f"\n    {e.where(root)}" for e in cycle)


# --- the package ---------------------------------------------------------------------------------------------------
def test_library_code_never_imports_a_command():
    edges = import_edges(module_files(ROOTS))
    assert any(is_command(e.target) for e in edges), "no import of a command found: is the graph being read?"
    bad = command_imports(edges)
    assert not bad, "library modules import commands (move the code they need into the library):\n" + "\n".join(
        e.where(REPO) for e in bad)


def test_every_module_has_a_layer():
    missing = unplaced(module_files(ROOTS))
    assert not missing, "modules in no layer (add their package to LAYERS in tests/unit/test_import_graph.py and " \
        "to docs/design.md):\n" + "\n".join(missing)


def test_no_module_imports_a_higher_layer():
    bad = upward_imports(import_edges(module_files(ROOTS)))
    assert not bad, f"{len(bad)} imports from a lower layer to a higher one (LAYERS):\n" + "\n".join(
        describe_upward(e, REPO) for e in bad)


def test_no_import_cycles():
    edges = import_edges(module_files(ROOTS))
    report = [f"{describe_cycle(cycle, REPO)}\n  (modules on cycles with these: {', '.join(tangle)})"
              for cycle, tangle in zip(find_cycles(edges), tangles(edges))]
    assert not report, f"{len(report)} groups of modules import each other, e.g.:\n" + "\n".join(report)


# --- the helpers, on a tiny tree whose answer is known -------------------------------------------------------------
def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return module_files({"pkg": root / "pkg"})


def test_helpers_find_lazy_relative_and_submodule_cycles_and_command_imports(tmp_path: Path):
    modules = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\nimport os\n",  # `from package import submodule`: an edge to pkg.b
        "pkg/b.py": "def f():\n    from . import c\n",  # inside a function, relative
        "pkg/c.py": "import pkg.a as again\n",  # closes a -> b -> c -> a
        "pkg/sub/__init__.py": "from pkg.sub.leaf import X\n",
        "pkg/sub/leaf.py": "X = 1\n",
        "pkg/d.py": "from pkg.sub import X\nfrom pkg.cli.tool import run\n",  # edge to the package's __init__
        "pkg/cli/__init__.py": "",
        "pkg/cli/tool.py": "from pkg import d\ndef run():\n    pass\n",  # a command may import the library
    })
    edges = import_edges(modules)
    pairs = {(e.source, e.target) for e in edges}
    assert {("pkg.a", "pkg.b"), ("pkg.b", "pkg.c"), ("pkg.c", "pkg.a"), ("pkg.d", "pkg.sub"),
            ("pkg.sub", "pkg.sub.leaf"), ("pkg.d", "pkg.cli.tool"), ("pkg.cli.tool", "pkg.d")} == pairs
    (cycle,) = [c for c in find_cycles(edges) if c[0].source.startswith("pkg.a")]
    assert [e.source for e in cycle] == ["pkg.a", "pkg.b", "pkg.c"] and cycle[-1].target == "pkg.a"
    assert "pkg.a -> pkg.b -> pkg.c -> pkg.a" in describe_cycle(cycle, tmp_path)
    assert "pkg/b.py:2: from . import c" in describe_cycle(cycle, tmp_path)
    # pkg.d <-> pkg.cli.tool is a cycle too, and the library side of it is the forbidden edge
    assert len(find_cycles(edges)) == 2
    (bad,) = command_imports(edges, commands=("pkg.cli",))
    assert bad.where(tmp_path) == "pkg/d.py:2: from pkg.cli.tool import run"


def test_helpers_pass_an_acyclic_tree(tmp_path: Path):
    modules = _tree(tmp_path, {"pkg/__init__.py": "from pkg import a\n", "pkg/a.py": "from . import b\n",
                               "pkg/b.py": "import json\n"})
    edges = import_edges(modules)
    assert {(e.source, e.target) for e in edges} == {("pkg", "pkg.a"), ("pkg.a", "pkg.b")}
    assert find_cycles(edges) == [] and command_imports(edges, commands=("pkg.cli",)) == []


def test_helpers_find_upward_imports_wherever_they_stand(tmp_path: Path):
    modules = _tree(tmp_path, {
        "pkg/__init__.py": "from pkg import low\n",  # the package itself, in the lowest layer
        "pkg/low.py": "import json\n",
        "pkg/mid/__init__.py": "",
        "pkg/mid/a.py": "from pkg import low\nfrom pkg.mid import b\n",  # down, and inside its own layer
        "pkg/mid/b.py": "def f():\n    from pkg.top import run\n",  # up, inside a function
        "pkg/mid/special.py": "from pkg.top import run\n",  # listed in the top layer by its own name: allowed
        "pkg/top.py": "from pkg.mid.a import low\ndef run():\n    pass\n",
        "pkg/stray.py": "",  # in no layer
    })
    layers = (("__init__", "low"), ("mid",), ("top", "mid.special"))
    edges = import_edges(modules)
    (bad,) = upward_imports(edges, layers, "pkg")
    assert describe_upward(bad, tmp_path, layers, "pkg") == \
        "pkg/mid/b.py:2: from pkg.top import run  (mid, layer 2, imports top, layer 3)"
    assert unplaced(modules, layers, "pkg") == ["pkg.stray"]
    assert [layer_of(m, layers, "pkg") for m in ("pkg", "pkg.mid", "pkg.mid.a", "pkg.mid.special")] == [0, 1, 1, 2]


def test_an_upward_import_planted_in_a_copy_of_a_module_is_caught(tmp_path: Path):
    """The contract on the real package, with metrics/ufm.py replaced by a copy that imports the federation inside a
    function: exactly that import fails, named by file and line."""
    modules = module_files(ROOTS)
    assert upward_imports(import_edges(modules)) == []
    planted = tmp_path / "resfl_lightning" / "metrics" / "ufm.py"
    planted.parent.mkdir(parents=True)
    source = modules["resfl_lightning.metrics.ufm"].read_text()
    upward = "from resfl_lightning.federation.orchestrator import Federation"
    planted.write_text(f"{source}\n\ndef _planted():\n    {upward}\n")
    modules["resfl_lightning.metrics.ufm"] = planted
    (bad,) = upward_imports(import_edges(modules))
    line = len(source.splitlines()) + 4
    assert describe_upward(bad, tmp_path) == \
        f"resfl_lightning/metrics/ufm.py:{line}: {upward}  (metrics, layer 2, imports federation, layer 5)"
