"""The package's modules import one another without circles: no module of ``src/podsrl``
imports, directly or through others, a module that imports it. Imports inside functions count."""

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "src" / "podsrl"


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module's podsrl imports: ``from a import b`` counts as importing ``a.b`` where that is
    a module, else ``a``. A package importing its own submodules (``podsrl.rollout`` making its
    engines) is one unit, not a circle: those edges are left out."""
    paths = {module_name(p, package): p for p in package.rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in paths.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {known(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*here.split(".")[: len(here.split(".")) - node.level + 1], *filter(None, [base])])
                imported |= {f"{base}.{a.name}" if f"{base}.{a.name}" in paths else known(base) for a in node.names}
        package_of = name if path.name == "__init__.py" else None
        graph[name] = {m for m in imported if m and m != name
                       and not (package_of and m.startswith(package_of + "."))}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that reach themselves through their imports, grouped by circle."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for m in graph.get(todo.pop(), ()):
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
        return seen

    reached = {m: reach(m) for m in graph}
    groups = {frozenset(n for n in graph if n in reached[m] and m in reached[n]) for m in graph if m in reached[m]}
    return sorted(sorted(g) for g in groups)


def test_the_graph_sees_imports_inside_functions(tmp_path):
    package = tmp_path / "podsrl"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from podsrl import b\n")
    (package / "b.py").write_text("def f():\n    from podsrl.c import g\n")
    (package / "c.py").write_text("import podsrl.a\n")
    (package / "d.py").write_text("from podsrl.a import x\n")
    assert circles(import_graph(package)) == [["podsrl.a", "podsrl.b", "podsrl.c"]]


def test_no_module_imports_a_module_that_imports_it():
    assert circles(import_graph()) == []
