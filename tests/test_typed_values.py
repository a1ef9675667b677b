"""Closed sets and positions stay typed past the parser (issue #28 point 5).

Read with :mod:`ast` from every module of the package:

- no code compares a value with the string spelling of a closed set's member
  (``sub_type == "Key_Shared"``): the parsers of :mod:`filepulsar.dispatch.modes` turn what a
  user typed into the member, code compares members (``sub_type is ConsumerType.KeyShared``),
  and the spellings appear only where text is read or written (the parsers, the JSON codecs,
  messages);
- an entry's position has one type, :class:`filepulsar.storage.position.Position`: no alias of
  ``tuple[int, int]``, no position-named value typed ``tuple[int, int]``, and no map or set
  keyed by bare ``(int, int)`` pairs (the pairs of this code that key maps are positions).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from filepulsar.dispatch import modes
from filepulsar.storage.position import EARLIEST, Position

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
PACKAGE = ["dispatch", "storage", "connector", "jobs", "filepulsar"]
#: Where the spellings are the subject: the parser of every closed set.
PARSERS = {"dispatch/modes.py"}


def _sources() -> list[Path]:
    files = [f for d in PACKAGE for f in sorted((REPO / d).rglob("*.py"))]
    return [*files, REPO / "pyspark_filepulsar.py"]


def _spellings() -> dict[str, str]:
    """Every spelling of every closed set's member (its name and its wire name) -> the set."""
    out: dict[str, str] = {}
    for name in modes.__all__:
        cls = getattr(modes, name)
        if isinstance(cls, type) and issubclass(cls, modes.Mode) and cls is not modes.Mode:
            for m in cls:
                out[m.name] = out[m.wire] = cls.__name__
    return out


def _strings(node: ast.AST) -> list[str]:
    """The string constants of ``node``: itself, or the items of a tuple, list or set."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _literal_comparisons(tree: ast.AST, spellings: dict[str, str]) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            sides = [node.value]
        else:
            continue
        hit = [s for side in sides for s in _strings(side) if s in spellings]
        if hit:
            found.append((node.lineno, f"{ast.unparse(node)[:90]} ({spellings[hit[0]]})"))
    return found


def test_the_scan_finds_a_literal_comparison() -> None:
    code = 'if s.sub_type == "Key_Shared" or mode in ("Shared", "Failover"): pass\n'
    code += 'match routing:\n    case "RoundRobinPartition": pass\n'
    hits = _literal_comparisons(ast.parse(code), _spellings())
    assert [line for line, _ in hits] == [1, 1, 3], hits
    assert not _literal_comparisons(ast.parse('x == "Keyshared-ish"'), _spellings())


def test_no_closed_set_member_is_compared_as_a_string() -> None:
    spellings = _spellings()
    assert {"Key_Shared", "KeyShared", "AUTO_SPLIT", "RoundRobinPartition"} <= set(spellings)
    found = []
    for f in _sources():
        where = f.relative_to(REPO).as_posix()
        if where in PARSERS:
            continue
        for line, text in _literal_comparisons(ast.parse(f.read_text(), where), spellings):
            found.append(f"{where}:{line}: {text}")
    assert not found, "closed sets compared as strings (compare the members):\n" + "\n".join(found)


# ------------------------------------------------------------------------ positions

#: Words that say a value is an entry position.
POSITION_WORDS = ("pos", "position", "mark_delete", "dispatched", "horizon", "trimmed_last")


def _is_pair(node: ast.AST) -> bool:
    """Whether ``node`` is the annotation ``tuple[int, int]``."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "tuple"
        and ast.unparse(node.slice).strip("()") == "int, int"
    )


def _keyed_by_pair(node: ast.AST) -> bool:
    """Whether ``node`` is a map or set type keyed by ``tuple[int, int]``."""
    if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name | ast.Attribute)):
        return False
    name = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
    if name not in ("dict", "Mapping", "MutableMapping", "set", "frozenset", "AbstractSet"):
        return False
    key = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
    return _is_pair(key)


def _untyped_positions(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if _is_pair(node.value):
                names = ", ".join(ast.unparse(t) for t in targets)
                found.append((node.lineno, f"{names} is an alias of tuple[int, int]"))
        named: list[tuple[str, ast.AST]] = []
        if isinstance(node, ast.arg) and node.annotation is not None:
            named.append((node.arg, node.annotation))
        elif isinstance(node, ast.AnnAssign):
            named.append((ast.unparse(node.target), node.annotation))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            named.append((node.name, node.returns))
        for name, ann in named:
            parts = list(ast.walk(ann))
            if any(map(_keyed_by_pair, parts)):
                found.append((ann.lineno, f"{name}: {ast.unparse(ann)} (keyed by positions)"))
            elif any(w in name.lower() for w in POSITION_WORDS) and any(map(_is_pair, parts)):
                found.append((ann.lineno, f"{name}: {ast.unparse(ann)}"))
    return found


def test_the_position_scan_finds_untyped_positions() -> None:
    code = "Pos = tuple[int, int]\n"
    code += "def f(mark_delete: tuple[int, int], ranges: list[tuple[int, int]]) -> None: ...\n"
    code += "hidden: dict[tuple[int, int], frozenset[int]] = {}\n"
    code += "def last_position() -> tuple[int, int] | None: ...\n"
    hits = _untyped_positions(ast.parse(code))
    assert sorted(line for line, _ in hits) == [1, 2, 3, 4], hits


def test_one_position_type() -> None:
    assert issubclass(Position, tuple) and Position._fields == ("ledger_id", "entry_id")
    assert Position(3, 4) == (3, 4) and hash(Position(3, 4)) == hash((3, 4))
    assert EARLIEST < Position(0, 0) < Position(0, 1) < Position(1, -1)
    found = []
    classes = []
    for f in _sources():
        where = f.relative_to(REPO).as_posix()
        tree = ast.parse(f.read_text(), where)
        classes += [
            where for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Position"
        ]
        for line, text in _untyped_positions(tree):
            found.append(f"{where}:{line}: {text}")
    assert not found, "positions typed as bare pairs (use Position):\n" + "\n".join(found)
    assert classes == ["storage/position.py"]
