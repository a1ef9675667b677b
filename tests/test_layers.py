"""The floors of the house (issue #28): ``jobs -> connector -> storage -> dispatch``.

Read from the source with :mod:`ast` (``filepulsar.<floor>`` is the folder ``<floor>/``, and its
sub-packages the folders below it), every import counts, at module level or inside a function:
a floor imports only from itself and the floors below it; no module takes a ``_private`` name
from another module, neither by ``from m import _name`` nor as ``m._name`` of a module it
imported (a name another module uses is part of its module's interface: public and documented,
issue #28 point 2; there were 179 such imports, none is left); and no chain of module-level
imports (the ones that run when a module is imported) leads back to where it started.
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


def _private_names_from_other_modules(floor: str) -> list[str]:
    """``file:line`` of every ``_name`` a module of ``floor`` takes from another module: in a
    ``from m import _name`` (any ``m``; private modules included), or as ``m._name`` where ``m``
    names a filepulsar module it imported."""
    files = {m: f for fl in FLOORS for m, f in _module_files(fl).items()}
    out = []
    for f in _module_files(floor).values():
        where = f.relative_to(REPO).as_posix()
        tree = ast.parse(f.read_text(), str(f))
        modules: set[str] = set()  # local names bound to filepulsar modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        out.append(f"{where}:{node.lineno} imports {a.name} from {node.module}")
                    if f"{node.module}.{a.name}" in files:
                        modules.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                modules.update(a.asname for a in node.names if a.asname and a.name in files)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and (
                    (isinstance(node.value, ast.Name) and node.value.id in modules)
                    or ast.unparse(node.value) in files
                )
            ):
                out.append(f"{where}:{node.lineno} uses {ast.unparse(node)}")
    return out


@pytest.mark.parametrize("floor", FLOORS)
def test_no_private_name_from_another_module(floor: str) -> None:
    private = _private_names_from_other_modules(floor)
    assert not private, (
        "private names taken from another module (make the name public with a docstring in "
        "its module's interface, or move the code to where it is used):\n" + "\n".join(private)
    )


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
