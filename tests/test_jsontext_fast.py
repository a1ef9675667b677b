"""``jsontext.loads_stored``: stored metadata read by orjson where it reads exactly as ``json``
does, else by ``json`` (so every value, and every error, is ``json``'s)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from filepulsar.storage import jsontext

pytestmark = pytest.mark.property

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too: orjson would read those as floats
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()  # lone surrogates included
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(), inner, max_size=6),
    max_leaves=40,
)


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types throughout (an int is not a float here; NaN is NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _reads_as_json(body: bytes) -> None:
    """``loads_stored(body)`` fails where ``json`` fails, else reads what ``json`` reads."""
    try:
        want = jsontext.loads(body)
    except ValueError:
        with pytest.raises(ValueError):
            jsontext.loads_stored(body)
        return
    assert _same(jsontext.loads_stored(body), want)


@settings(max_examples=400, deadline=None)
@given(_values, st.booleans())
def test_reads_what_json_reads(value: Any, ascii_only: bool) -> None:
    """Any value ``json`` writes (compact, as the stores write, or with every non-ASCII
    character escaped) reads back exactly as ``json.loads`` reads it: same values, same
    types (integers of any size stay integers; NaN and infinities as ``json`` reads them)."""
    body = json.dumps(value, separators=(",", ":"), ensure_ascii=ascii_only).encode(
        "utf-8", "surrogatepass"
    )
    _reads_as_json(body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_other_bytes_fail_or_read_as_json_reads_them(body: bytes) -> None:
    """Arbitrary bytes: where ``json`` refuses them, so does ``loads_stored`` (a ValueError);
    where it reads them, ``loads_stored`` reads the same."""
    _reads_as_json(body)


def test_long_integers_and_nesting_go_to_json() -> None:
    """The cases orjson reads otherwise: integers beyond 64 bits (a float to orjson) and
    nesting past its depth limit (json's own limit then decides, as a ValueError)."""
    big = b'{"seq":18446744073709551616,"neg":-9223372036854775809}'
    got = jsontext.loads_stored(big)
    assert got == {"seq": 2**64, "neg": -(2**63) - 1}
    assert all(type(v) is int for v in got.values())
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ValueError, match="nested too deeply"):
        jsontext.loads_stored(deep)


_stored_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too: orjson refuses those
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.text()  # lone surrogates (orjson refuses them), DEL and non-ASCII (json escapes)
    | st.text(alphabet=st.characters(max_codepoint=0x7F))
)
_stored_values = st.recursive(
    _stored_scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(), inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(_stored_values)
@example(["p\x7f", 1])  # DEL: json escapes it, orjson does not
@example({"caf\u00e9": "\u2028"})  # above U+007F: json escapes, orjson writes UTF-8
@example([2**64, -(2**63) - 1])  # outside 64 bits: orjson refuses
@example("\ud800")  # a lone surrogate: orjson refuses
def test_dumps_compact_writes_what_json_writes(value: Any) -> None:
    """Every value a stored state can hold (no floats) is written as ``json`` writes it."""
    assert jsontext.dumps_compact(value) == json.dumps(value, separators=(",", ":"))
