"""The floors of the house (issue #28): ``jobs -> connector -> storage -> dispatch``.

Read from the source with :mod:`ast` (``filepulsar.<floor>`` is the folder ``<floor>/``, and its
sub-packages the folders below it), every import counts, at module level or inside a function:
a floor imports only from itself and the floors below it; a ``_private`` name is imported only
from a module of the same package (``connector/source/batch.py`` may take ``_resolve`` from
``connector/source/offsets.py``, ``connector/datasource.py`` may not); and no chain of
module-level imports (the ones that run when a module is imported) leads back to where it
started.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
FLOORS = ["dispatch", "storage", "connector", "jobs"]  # bottom first


def _module_files(floor: str) -> dict[str, Path]:
    """``filepulsar.<dotted name>`` -> file, for every module of ``floor`` and its sub-packages
    (a package is named by its ``__init__.py``)."""
    out = {}
    for f in sorted((REPO / floor).rglob("*.py")):
        parts = f.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(("filepulsar", *parts))] = f
    return out


def _package_of(module: str, is_package: bool) -> str:
    """The package a module belongs to: itself for a package's ``__init__``, else its parent."""
    return module if is_package else module.rpartition(".")[0]


def _imports(floor: str) -> list[tuple[str, int, str, list[str]]]:
    """(file, line, module, names) of every ``filepulsar.*`` import in ``floor``."""
    out = []
    for f in _module_files(floor).values():
        where = f.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [a.name for a in node.names]
                mod = node.module
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("filepulsar."):
                        out.append((where, node.lineno, a.name, []))
                continue
            else:
                continue
            if mod.startswith("filepulsar."):
                out.append((where, node.lineno, mod, names))
    return out


def _floor_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else None


@pytest.mark.parametrize("floor", FLOORS)
def test_a_floor_imports_only_from_itself_and_below(floor: str) -> None:
    up = [
        f"{where}:{line} imports {mod}"
        for where, line, mod, _ in _imports(floor)
        if (t := _floor_of(mod)) is not None and FLOORS.index(t) > FLOORS.index(floor)
    ]
    assert not up, "imports against jobs -> connector -> storage -> dispatch:\n" + "\n".join(up)


@pytest.mark.parametrize("floor", FLOORS)
def test_no_private_name_from_another_floor(floor: str) -> None:
    private = [
        f"{where}:{line} imports {name} from {mod}"
        for where, line, mod, names in _imports(floor)
        if (t := _floor_of(mod)) is not None and t != floor
        for name in names
        if name.startswith("_")
    ]
    assert not private, "private names imported from another floor:\n" + "\n".join(private)


def _private_imports_across_packages(floor: str) -> list[str]:
    files = {m: f for fl in FLOORS for m, f in _module_files(fl).items()}
    packages = {m for m, f in files.items() if f.name == "__init__.py"}
    out = []
    for where, line, mod, names in _imports(floor):
        if _floor_of(mod) != floor or mod not in files:
            continue  # another floor: the test above
        importer = ".".join(("filepulsar", *Path(where).with_suffix("").parts))
        home = _package_of(importer.removesuffix(".__init__"), where.endswith("__init__.py"))
        for name in names:
            if name.startswith("_") and not name.startswith("__"):
                if f"{mod}.{name}" in files:
                    continue  # ``from filepulsar.x import _module`` names a module, not a name
                if _package_of(mod, mod in packages) != home:
                    out.append(f"{where}:{line} imports {name} from {mod}")
    return out


@pytest.mark.parametrize("floor", FLOORS)
def test_no_private_name_from_another_package(floor: str) -> None:
    private = _private_imports_across_packages(floor)
    assert not private, "private names imported from another package:\n" + "\n".join(private)


def _module_level_graph() -> dict[str, set[str]]:
    """Module -> the filepulsar modules it imports when it is imported (top-level statements,
    ``if``/``try`` blocks included, ``if TYPE_CHECKING:`` blocks and function bodies not)."""
    files = {m: f for floor in FLOORS for m, f in _module_files(floor).items()}

    def resolve(mod: str, name: str | None) -> str | None:
        if name is not None and f"{mod}.{name}" in files:
            return f"{mod}.{name}"  # ``from filepulsar.storage import claims``
        return mod if mod in files else None

    def top(body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for st in body:
            if isinstance(st, ast.If):
                test = ast.unparse(st.test)
                if "TYPE_CHECKING" not in test:
                    out += top(st.body) + top(st.orelse)
            elif isinstance(st, ast.Try):
                out += top(st.body) + top(st.orelse) + top(st.finalbody)
                for h in st.handlers:
                    out += top(h.body)
            else:
                out.append(st)
        return out

    graph: dict[str, set[str]] = {m: set() for m in files}
    for m, f in files.items():
        for st in top(ast.parse(f.read_text(), str(f)).body):
            targets: list[str | None] = []
            if isinstance(st, ast.ImportFrom) and st.module and st.module.startswith("filepulsar."):
                targets = [resolve(st.module, a.name) for a in st.names]
            elif isinstance(st, ast.Import):
                targets = [resolve(a.name, None) for a in st.names]
            graph[m].update(t for t in targets if t is not None and t != m)
    return graph


def test_no_import_time_cycle() -> None:
    """No chain of module-level imports leads from a module back to itself (Tarjan's
    strongly connected components of the import graph, drawn from the source)."""
    graph = _module_level_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import-time cycles: {cycles}"
