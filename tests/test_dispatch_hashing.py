"""Tests of dispatch.hashing and dispatch.hash_arrays: the two key hashes, slots, sticky keys."""

from __future__ import annotations

import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filepulsar.dispatch.hash_arrays import (
    java_string_hash_array,
    murmur3_32_array,
    slot_array,
    sticky_key_array,
)
from filepulsar.dispatch.hashing import (
    NONE_KEY,
    hash_slot,
    java_string_hash,
    murmur3_32,
    sign_safe_mod,
    sticky_key,
    sticky_key_hash,
)

pytestmark = pytest.mark.property

# Text without lone surrogates (Arrow text cannot hold them), but with every plane.
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
key_bytes = st.binary(max_size=40)


# -- worked examples ------------------------------------------------------------------------


def test_seed_order_key_murmur_and_slot() -> None:
    raw = mmh3.hash(b"Order-3459134", 0, False)
    assert raw == 3112179635  # the seed prints the unmasked value
    assert murmur3_32("Order-3459134") == 3112179635 & 0x7FFFFFFF
    assert 3112179635 % 65536 == murmur3_32("Order-3459134") % 65536 == 6067
    assert hash_slot(murmur3_32("Order-3459134"), 0, 65535) == 6067


def test_murmur_known_values() -> None:
    assert murmur3_32(b"") == 0
    assert murmur3_32("hello") == 613153351
    assert murmur3_32("hello") == murmur3_32(b"hello") == murmur3_32(bytearray(b"hello"))


def test_murmur_str_is_utf8() -> None:
    assert murmur3_32("é😀") == murmur3_32("é😀".encode())


def test_murmur_surrogates_follow_java_getbytes() -> None:
    # Java encodes an unpaired surrogate as '?' and joins a valid pair into one character.
    assert murmur3_32("a\ud800b") == murmur3_32("a?b")
    assert murmur3_32("\ud83d\ude00") == murmur3_32("\U0001f600")


def test_murmur_rejects_other_types() -> None:
    with pytest.raises(TypeError):
        murmur3_32(5)  # type: ignore[arg-type]


def test_java_string_hash_known_values() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    # Wraps past 2**31 several times.
    assert java_string_hash("hello world") == 1794106052
    # Java gives -862545276; the mask keeps the low 31 bits.
    assert java_string_hash("Hello World") == -862545276 & 0x7FFFFFFF == 1284938372
    # hashCode() == Integer.MIN_VALUE, masked to 0.
    assert java_string_hash("polygenelubricants") == 0


def test_java_string_hash_counts_surrogate_pairs() -> None:
    # U+1F600 is the UTF-16 pair D83D DE00: 0xD83D * 31 + 0xDE00.
    assert java_string_hash("😀") == 0xD83D * 31 + 0xDE00 == 1772899
    assert java_string_hash("a😀") == (97 * 31 + 0xD83D) * 31 + 0xDE00 == 1866116


def test_sign_safe_mod() -> None:
    assert sign_safe_mod(7, 3) == 1
    assert sign_safe_mod(-7, 3) == 2
    assert sign_safe_mod(-6, 3) == 0
    assert sign_safe_mod(2**40 + 5, 7) == (2**40 + 5) % 7
    with pytest.raises(ValueError):
        sign_safe_mod(1, 0)


def test_hash_slot_rule() -> None:
    assert hash_slot(65536, 0, 65535) == 1  # 0 becomes 1
    assert hash_slot(65535, 0, 65535) == 65535
    assert hash_slot(0, 1, 65535) == 1
    assert hash_slot(65534, 1, 65535) == 65535
    assert hash_slot(65535, 1, 65535) == 1
    with pytest.raises(ValueError):
        hash_slot(1, 5, 4)
    with pytest.raises(ValueError):
        hash_slot(-1, 0, 10)


def test_sticky_key() -> None:
    assert sticky_key(b"order", "key") == b"order"
    assert sticky_key(b"", "key") == b""  # an empty ordering key is still set
    assert sticky_key(None, "këy") == "këy".encode()
    assert sticky_key(None, b"\x00\x01") == b"\x00\x01"
    assert sticky_key(None, None) == NONE_KEY == b"NONE_KEY"


@given(st.none() | st.binary(max_size=20), st.none() | text | st.binary(max_size=20))
def test_sticky_key_hash_is_murmur3_of_the_sticky_key(
    ordering_key: bytes | None, partition_key: str | bytes | None
) -> None:
    assert sticky_key_hash(ordering_key, partition_key) == murmur3_32(
        sticky_key(ordering_key, partition_key)
    )
    assert sticky_key_hash(None, "\ud800x") == murmur3_32(sticky_key(None, "\ud800x"))


def test_sticky_key_array() -> None:
    out = sticky_key_array(pa.array([b"o", None, None, b""]), pa.array(["p", "q", None, "r"]))
    assert out.to_pylist() == [b"o", b"q", b"NONE_KEY", b""]
    assert sticky_key_array(None, None, length=2).to_pylist() == [NONE_KEY, NONE_KEY]
    assert sticky_key_array(None, ["a", None]).to_pylist() == [b"a", NONE_KEY]
    with pytest.raises(ValueError):
        sticky_key_array(None, None)
    with pytest.raises(ValueError):
        sticky_key_array(["a"], ["a", "b"])


# -- vectorised equals scalar -----------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(key_bytes, max_size=60))
def test_murmur_array_matches_scalar_on_bytes(keys: list[bytes]) -> None:
    expected = np.array([murmur3_32(k) for k in keys], dtype=np.uint32)
    for container in (keys, np.array(keys, dtype=object), pa.array(keys, pa.binary())):
        got = murmur3_32_array(container)
        assert got.dtype == np.uint32
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(murmur3_32_array(pa.array(keys, pa.large_binary())), expected)


@settings(max_examples=60, deadline=None)
@given(st.lists(text, max_size=40), st.integers(0, 10), st.integers(0, 10))
def test_murmur_array_matches_scalar_on_text(keys: list[str], cut_lo: int, cut_hi: int) -> None:
    expected = np.array([murmur3_32(k) for k in keys], dtype=np.uint32)
    arr = pa.array(keys, pa.string())
    np.testing.assert_array_equal(murmur3_32_array(arr), expected)
    np.testing.assert_array_equal(murmur3_32_array(keys), expected)
    # Sliced and chunked arrays read the right part of the shared buffers.
    hi = max(cut_lo, len(keys) - cut_hi)
    np.testing.assert_array_equal(murmur3_32_array(arr[cut_lo:hi]), expected[cut_lo:hi])
    chunked = pa.chunked_array([arr[:cut_lo], arr[cut_lo:]], type=pa.string())
    np.testing.assert_array_equal(murmur3_32_array(chunked), expected)


@settings(max_examples=60, deadline=None)
@given(st.lists(text, max_size=40), st.integers(0, 10))
def test_java_hash_array_matches_scalar(keys: list[str], cut: int) -> None:
    expected = np.array([java_string_hash(k) for k in keys], dtype=np.uint32)
    arr = pa.array(keys, pa.string())
    np.testing.assert_array_equal(java_string_hash_array(arr), expected)
    np.testing.assert_array_equal(java_string_hash_array(keys), expected)
    np.testing.assert_array_equal(java_string_hash_array(arr.cast(pa.large_string())), expected)
    np.testing.assert_array_equal(java_string_hash_array(arr[cut:]), expected[cut:])
    np.testing.assert_array_equal(
        java_string_hash_array(pa.chunked_array([arr[:cut], arr[cut:]], type=pa.string())),
        expected,
    )


def test_java_hash_array_ascii_and_lone_surrogates() -> None:
    keys = ["", "a", "hello", "polygenelubricants", "Hello World"]
    np.testing.assert_array_equal(java_string_hash_array(keys), [java_string_hash(k) for k in keys])
    with_surrogate = ["x\ud800", "ok"]
    np.testing.assert_array_equal(
        java_string_hash_array(with_surrogate), [java_string_hash(k) for k in with_surrogate]
    )


def test_java_hash_array_rejects_bytes_and_invalid_utf8() -> None:
    with pytest.raises(TypeError):
        java_string_hash_array([b"abc"])
    with pytest.raises(TypeError):
        java_string_hash_array(pa.array([b"\xff"], pa.binary()))
    # Valid UTF-8 in a binary array is accepted.
    np.testing.assert_array_equal(
        java_string_hash_array(pa.array([b"hello"], pa.binary())), [99162322]
    )


def test_array_nulls_are_refused_unless_null_key_given() -> None:
    arr = pa.array([b"a", None, b"b"])
    with pytest.raises(ValueError, match="null"):
        murmur3_32_array(arr)
    with pytest.raises(ValueError, match="null"):
        murmur3_32_array([b"a", None])
    got = murmur3_32_array(arr, null_key=NONE_KEY)
    np.testing.assert_array_equal(got, [murmur3_32(b"a"), murmur3_32(NONE_KEY), murmur3_32(b"b")])
    np.testing.assert_array_equal(
        murmur3_32_array([None], null_key="NONE_KEY"), [murmur3_32(NONE_KEY)]
    )
    with pytest.raises(ValueError, match="null"):
        java_string_hash_array(pa.array(["a", None]))
    np.testing.assert_array_equal(
        java_string_hash_array(pa.array(["a", None]), null_key="x"),
        [java_string_hash("a"), java_string_hash("x")],
    )


def test_array_edge_inputs() -> None:
    assert murmur3_32_array([]).shape == (0,)
    assert murmur3_32_array(pa.chunked_array([], type=pa.binary())).shape == (0,)
    assert java_string_hash_array([]).shape == (0,)
    np.testing.assert_array_equal(murmur3_32_array(pa.array(["", ""])), [0, 0])
    dictionary = pa.array(["a", "b", "a"]).dictionary_encode()
    np.testing.assert_array_equal(
        murmur3_32_array(dictionary), [murmur3_32(k) for k in ["a", "b", "a"]]
    )
    with pytest.raises(TypeError):
        murmur3_32_array([1, 2])
    with pytest.raises(TypeError):
        murmur3_32_array(pa.array([1, 2]))


def test_long_keys() -> None:
    keys = [b"x" * n for n in (0, 1, 3, 4, 5, 255, 1000, 4099)]
    np.testing.assert_array_equal(murmur3_32_array(pa.array(keys)), [murmur3_32(k) for k in keys])
    texts = ["ü" * 700, "a" * 5000, "😀" * 300]
    np.testing.assert_array_equal(
        java_string_hash_array(texts), [java_string_hash(t) for t in texts]
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 2**31 - 1), max_size=50),
    st.integers(0, 3),
    st.integers(1, 70000),
)
def test_slot_array_matches_scalar(hashes: list[int], start: int, size: int) -> None:
    end = start + size - 1
    expected = [hash_slot(h, start, end) for h in hashes]
    for dtype in (np.uint32, np.int64):
        got = slot_array(np.array(hashes, dtype=dtype), start, end)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.array(expected, dtype=np.int64))


def test_slot_array_validation() -> None:
    with pytest.raises(ValueError):
        slot_array(np.array([-1]), 0, 10)
    with pytest.raises(TypeError):
        slot_array(np.array([1.5]), 0, 10)
    with pytest.raises(ValueError):
        slot_array(np.array([1]), 3, 2)
    assert slot_array(np.array([], dtype=np.uint32), 0, 10).shape == (0,)
