"""No import cycle in pg2sink, between modules or between packages (issue #12).

The imports of every module of the package are read from its source (an AST walk, no
import is executed): `import a.b`, `from a.b import c` (an edge to the module `a.b.c`
when it exists, else to `a.b`) and relative imports, resolved against the module's
package. Only edges into pg2sink count.

Rule: every import statement is an edge, wherever it stands — at module level, inside
a function (a lazy import still makes the two modules depend on each other), and inside
an `if TYPE_CHECKING:` block (a type named in a signature is part of the module's
interface: a cycle there is a cycle of the design, which the issue forbids, even though
the interpreter would not trip on it).

Two graphs are checked: modules, and units, where a unit is a subpackage of pg2sink
(`pg2sink.changelog`, `pg2sink.imports`, ...) or a top-level module (`pg2sink.cli`).
Each test fails listing every cycle it finds, one path per strongly connected component.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.conftest import REPO

PACKAGE = "pg2sink"
ROOT = REPO / PACKAGE


def _module_name(path: Path) -> str:
    """pg2sink/changelog/builder.py -> pg2sink.changelog.builder (a package: its __init__)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The longest prefix of `name` that is a pg2sink module (None outside pg2sink)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _imported(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The pg2sink modules `module` imports anywhere in its source (see the rule above)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            # `from a import b`: b may be a submodule of a, or a name defined in a
            names.extend(f"{base}.{alias.name}" for alias in node.names)
    found = {_resolve(n, modules) for n in names}
    return {m for m in found if m is not None and m != module}


def _unit(module: str) -> str:
    """The package a module belongs to for the package graph (see the module docstring)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _cycle_in(component: list[str], graph: Mapping[str, Iterable[str]]) -> list[str]:
    """One cycle through the component's first node, as a path that returns to it."""
    members = set(component)
    start = component[0]
    # breadth-first from start's successors back to start, inside the component
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph.get(node, ())):
                if succ not in members or succ in parents:
                    continue
                parents[succ] = node
                if succ == start:
                    path = [start]
                    while path[-1] != start or len(path) == 1:
                        path.append(parents[path[-1]])
                    return path[::-1]
                following.append(succ)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")


def _report(graph: Mapping[str, Iterable[str]]) -> list[str]:
    return [" -> ".join(_cycle_in(c, graph)) for c in _strongly_connected(graph)]


def module_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def unit_graph(modules: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for module, imported in modules.items():
        edges = units.setdefault(_unit(module), set())
        edges.update(_unit(m) for m in imported if _unit(m) != _unit(module))
    return units


def test_the_walk_sees_the_package() -> None:
    """The walk is not vacuous: it finds the modules and their known imports."""
    graph = module_graph()
    assert len(graph) > 50
    assert "pg2sink.logical.lsn" in graph["pg2sink.subscription.loop"]
    assert "pg2sink.changelog" in unit_graph(graph)["pg2sink.subscription"]


def test_cycles_are_found() -> None:
    """The cycle finder itself, on a graph with two cycles and a tail."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert _report(graph) == ["a -> b -> c -> a", "e -> f -> e"]


def test_no_import_cycle_between_modules() -> None:
    cycles = _report(module_graph())
    assert not cycles, "import cycles between modules:\n" + "\n".join(cycles)


def test_no_import_cycle_between_packages() -> None:
    cycles = _report(unit_graph(module_graph()))
    assert not cycles, "import cycles between packages:\n" + "\n".join(cycles)


def test_the_builder_and_the_loop_know_nothing_of_imports() -> None:
    """The import gate is a stage in front of the builder (issue #12 item 3): neither the
    changelog nor the replication loop reaches pg2sink.imports, even indirectly."""
    graph = module_graph()
    for start in ("pg2sink.changelog.builder", "pg2sink.subscription.loop"):
        reached: set[str] = set()
        todo = [start]
        while todo:
            for succ in graph[todo.pop()] - reached:
                reached.add(succ)
                todo.append(succ)
        assert not {m for m in reached if m.startswith("pg2sink.imports")}, start
