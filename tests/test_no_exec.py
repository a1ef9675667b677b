"""No code is built from text (issue #31): no ``exec``, ``eval`` or ``compile`` of source
anywhere in the package; record classes of the client schema module are built from closures.

Read with :mod:`ast` from every module of the package (its floors and the top-level shims).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
PACKAGE = ["dispatch", "storage", "connector", "jobs", "filepulsar"]


def _sources() -> list[Path]:
    files = [f for d in PACKAGE for f in sorted((REPO / d).rglob("*.py"))]
    return [*files, REPO / "pyspark_filepulsar.py"]


def test_the_package_has_sources_to_check() -> None:
    names = [f.name for f in _sources()]
    assert "record.py" in names and len(names) > 100


def test_no_exec_eval_or_compile_in_the_package() -> None:
    found = []
    for f in _sources():
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            name = (
                fn.id
                if isinstance(fn, ast.Name)
                else fn.attr
                if isinstance(fn, ast.Attribute)
                else ""
            )
            if name in ("exec", "eval") or (isinstance(fn, ast.Name) and name == "compile"):
                found.append(f"{f.relative_to(REPO)}:{node.lineno} calls {name}")
    assert not found, "code built from text:\n" + "\n".join(found)
