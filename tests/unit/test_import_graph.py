"""The import graph of the package: library code never imports a command (resfl_lightning.cli, the entry aliases),
and no module imports itself around a cycle. Every import counts, also one inside a function: a lazy import only
hides a cycle until the function runs."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# callbacks/ is installed as resfl_lightning.callbacks (pyproject.toml's package-dir)
ROOTS = {"resfl_lightning": REPO / "resfl_lightning", "resfl_lightning.callbacks": REPO / "callbacks"}
COMMANDS = ("resfl_lightning.cli", "resfl_lightning.train", "resfl_lightning.__main__")


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
