"""Closed sets and positions stay typed past the parser (issue #28 point 5).

Read with :mod:`ast` from every module of the package:

- no code compares a value with the string spelling of a closed set's member
  (``sub_type == "Key_Shared"``): the parsers of :mod:`filepulsar.dispatch.modes` turn what a
  user typed into the member, code compares members (``sub_type is ConsumerType.KeyShared``),
  and the spellings appear only where text is read or written (the parsers, the JSON codecs,
  messages);
- an entry's position has one type, :class:`filepulsar.storage.position.Position`: no alias of
  ``tuple[int, int]``, no position-named value typed ``tuple[int, int]``, and no map or set
  keyed by bare ``(int, int)`` pairs (the pairs of this code that key maps are positions);
- a Spark source offset has one type,
  :class:`filepulsar.connector.source.offsets.PartitionOffset`: no alias of a bare list
  (``Off = list[Any]``), no offset-named value typed as a list or a tuple, and no comparison
  of ``(x[0], x[1])`` pairs (offsets and positions compare through ``Position``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from filepulsar.connector.source.offsets import PartitionOffset, offsets_json, parse_offsets
from filepulsar.dispatch import modes
from filepulsar.storage import InvalidConfiguration
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


def _annotated(node: ast.AST) -> list[tuple[str, ast.AST]]:
    """``(name, annotation)`` of an annotated argument, variable or function's return."""
    if isinstance(node, ast.arg) and node.annotation is not None:
        return [(node.arg, node.annotation)]
    if isinstance(node, ast.AnnAssign):
        return [(ast.unparse(node.target), node.annotation)]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
        return [(node.name, node.returns)]
    return []


def _untyped_positions(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if _is_pair(node.value):
                names = ", ".join(ast.unparse(t) for t in targets)
                found.append((node.lineno, f"{names} is an alias of tuple[int, int]"))
        for name, ann in _annotated(node):
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


# ------------------------------------------------------------------------ offsets

#: Words that say a value is a Spark source offset (in its modules: elsewhere an offset is
#: often a byte offset).
OFFSET_WORDS = ("off",)
SOURCE = "connector/source/"
#: Where ``(x[0], x[1])`` pairs are not positions: the cursor's acknowledged ranges are
#: ``[ledger, entry, ledger, entry]`` lists merged by their ids (storage/FORMAT.md).
RANGE_MODULES = {"storage/cursor.py"}


def _is_bare_sequence(node: ast.AST) -> bool:
    """Whether ``node`` is a ``list[...]`` or ``tuple[...]`` annotation."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("list", "tuple")
    )


def _raw_pair(node: ast.AST) -> bool:
    """Whether ``node`` is ``(x[0], x[1])``: a position spelled from a raw offset or list."""
    if not (isinstance(node, ast.Tuple) and len(node.elts) == 2):
        return False
    a, b = node.elts
    return (
        isinstance(a, ast.Subscript)
        and isinstance(b, ast.Subscript)
        and ast.unparse(a.value) == ast.unparse(b.value)
        and [ast.unparse(a.slice), ast.unparse(b.slice)] == ["0", "1"]
    )


def _offset_named(name: str) -> bool:
    return any(w.startswith(OFFSET_WORDS) for w in name.lower().replace("_", " ").split())


def _untyped_offsets(
    tree: ast.AST, *, source: bool = True, ranges: bool = False
) -> list[tuple[int, str]]:
    """Untyped offsets in ``tree``: raw pairs compared (unless ``ranges``), and in a module of
    the Spark source (``source``) offsets typed as bare lists or tuples."""
    found = []
    for node in ast.walk(tree):
        if source and isinstance(node, ast.Assign) and _is_bare_sequence(node.value):
            names = ", ".join(ast.unparse(t) for t in node.targets)
            if _offset_named(names):
                found.append((node.lineno, f"{names} is an alias of {ast.unparse(node.value)}"))
        if isinstance(node, ast.Compare) and not ranges:
            for side in [node.left, *node.comparators]:
                if _raw_pair(side):
                    found.append((node.lineno, f"{ast.unparse(node)[:80]} (raw pair compared)"))
                    break
        for name, ann in _annotated(node) if source else []:
            if _offset_named(name) and _is_bare_sequence(ann):
                found.append((ann.lineno, f"{name}: {ast.unparse(ann)}"))
    return found


def test_the_offset_scan_finds_untyped_offsets() -> None:
    lines = [  # of the Spark source before its offsets were typed, and one not an offset
        "Off = list[Any]  # [ledger, entry, n] or [ledger, entry, n, incarnation]",
        "def _offset_of_message_id(mid: MessageId) -> list[int]: ...",
        "if not tail and (s == e or (e[0], e[1]) < (s[0], s[1])): pass",
        "def spans(self, s: Off, off: list[Any]) -> None: ...",
        "chunk_start: list[int] = list(s)",
    ]
    code = "\n".join(lines)
    hits = _untyped_offsets(ast.parse(code))
    assert sorted(line for line, _ in hits) == [1, 2, 3, 4], hits
    typed = "def f(off: PartitionOffset) -> PartitionOffset: ...\n"
    typed += "if not tail and (s == e or e.position < s.position): pass\n"
    assert not _untyped_offsets(ast.parse(typed))
    # Outside the Spark source "offset" is mostly a byte offset: only raw pairs count there.
    assert [n for n, _ in _untyped_offsets(ast.parse(code), source=False)] == [3]


def test_one_offset_type() -> None:
    found = []
    for f in _sources():
        where = f.relative_to(REPO).as_posix()
        tree = ast.parse(f.read_text(), where)
        checks = {"source": where.startswith(SOURCE), "ranges": where in RANGE_MODULES}
        for line, text in _untyped_offsets(tree, **checks):
            found.append(f"{where}:{line}: {text}")
    assert not found, "offsets untyped (use PartitionOffset, compare Position):\n" + "\n".join(
        found
    )


def test_offsets_keep_their_checkpoint_spelling() -> None:
    # As written in checkpoints by the list form: before incarnations (3 items), with one.
    written = {
        "persistent://public/default/t-partition-0": [-1, -1, -1],
        "persistent://public/default/t-partition-1": [7, 41, 3, "6b1f0c2e"],
        "persistent://public/default/u": [12, 0, -1, "a0"],
    }
    typed = parse_offsets(written)
    assert typed["persistent://public/default/t-partition-1"] == PartitionOffset(
        7, 41, 3, "6b1f0c2e"
    )
    assert typed["persistent://public/default/t-partition-0"].incarnation == ""
    assert offsets_json(typed) == written
    p = typed["persistent://public/default/u"]
    assert p.position == Position(12, 0) and p.task == (12, 0, -1)
    with pytest.raises(TypeError):
        p < p  # type: ignore[operator]  # noqa: B015  # offsets order by their position only
    for bad in ([1, 2], [1, "2", -1], "1:2", [1, 2, -1, "i", 5], [True, 2, -1]):
        with pytest.raises(InvalidConfiguration, match=r"offset of k is .*; an offset is"):
            PartitionOffset.from_json("k", bad)
