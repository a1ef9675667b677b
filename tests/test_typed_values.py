"""Closed sets and positions stay typed past the parser (issue #28 point 5).

Read with :mod:`ast` from every module of the package: no code compares a value with the
string spelling of a closed set's member (``sub_type == "Key_Shared"``): the parsers of
:mod:`filepulsar.dispatch.modes` turn what a user typed into the member, code compares members
(``sub_type is ConsumerType.KeyShared``), and the spellings appear only where text is read or
written (the parsers, the JSON codecs, messages).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from filepulsar.dispatch import modes

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
