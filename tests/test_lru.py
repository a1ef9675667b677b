"""The one least-recently-used dict (``dispatch/lru.py``): what ``get`` and ``peek`` do to the
order, what ``put`` does to a key kept already, which values go past a count or a weight bound
and in what order, the newest kept however heavy with ``keep_newest``; and, against a plain
list as the model, any sequence of operations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from filepulsar.dispatch.lru import LruCache

pytestmark = pytest.mark.unit


def _keys(c: LruCache[str, int]) -> list[str]:
    return [k for k, _ in c.items()]


def test_get_makes_a_key_the_newest_and_peek_leaves_the_order() -> None:
    c: LruCache[str, int] = LruCache(3)
    for i, k in enumerate("abc"):
        c.put(k, i)
    assert c.get("a") == 0 and _keys(c) == ["b", "c", "a"]
    assert c.peek("b") == 1 and c["b"] == 1 and _keys(c) == ["b", "c", "a"]
    assert c.get("zz") is None and c.peek("zz") is None
    c.put("d", 3)  # ``b`` goes: the least recently used, not the first put
    assert _keys(c) == ["c", "a", "d"] and "b" not in c and len(c) == 3
    with pytest.raises(KeyError):
        c["b"]


def test_eviction_is_oldest_first() -> None:
    c: LruCache[int, str] = LruCache(4)
    for i in range(4):
        c.put(i, str(i))
    c.get(1)
    c.put(4, "4")
    assert list(c.items()) == [(2, "2"), (3, "3"), (1, "1"), (4, "4")]
    c.put(5, "5")
    assert list(c.items()) == [(3, "3"), (1, "1"), (4, "4"), (5, "5")]
    assert next(iter(c.items())) == (3, "3")  # the least recently used


def _w(value: tuple[str, int]) -> int:
    return value[1]


def test_a_key_put_again_moves_to_the_end_with_its_new_value_and_weight() -> None:
    c: LruCache[str, tuple[str, int]] = LruCache(max_weight=10, weigh=_w)
    c.put("a", ("a1", 4))
    c.put("b", ("b1", 3))
    assert c.weight == 7
    c.put("a", ("a2", 2))
    assert _keys(c) == ["b", "a"] and c.peek("a") == ("a2", 2) and c.weight == 5  # type: ignore[arg-type]
    assert len(c) == 2
    c.put("a", ("a3", 8))  # 11 > 10: the oldest goes, not ``a``
    assert _keys(c) == ["a"] and c.weight == 8  # type: ignore[arg-type]


def test_a_weight_bound_forgets_as_many_as_it_takes() -> None:
    c: LruCache[str, tuple[str, int]] = LruCache(max_weight=10, weigh=_w)
    for k, w in zip("abcd", [3, 3, 3, 1], strict=True):
        c.put(k, (k, w))
    assert c.weight == 10
    c.put("e", ("e", 7))  # a, b and c go (17, 14, 11 > 10)
    assert _keys(c) == ["d", "e"] and c.weight == 8  # type: ignore[arg-type]


def test_both_bounds_hold_together() -> None:
    c: LruCache[int, tuple[str, int]] = LruCache(3, max_weight=100, weigh=_w)
    for i in range(3):
        c.put(i, ("", 10))
    c.put(3, ("", 10))  # 0 goes: the count
    assert _keys(c) == [1, 2, 3] and c.weight == 30  # type: ignore[arg-type]
    c.put(4, ("", 85))  # 1 and 2 go: the weight (10 + 10 + 85 > 100)
    assert _keys(c) == [3, 4] and c.weight == 95  # type: ignore[arg-type]


def test_an_item_heavier_than_the_bound_goes_at_once_unless_the_newest_is_kept() -> None:
    c: LruCache[str, tuple[str, int]] = LruCache(max_weight=10, weigh=_w)
    c.put("a", ("a", 5))
    c.put("big", ("big", 11))
    assert len(c) == 0 and c.weight == 0
    kept: LruCache[str, tuple[str, int]] = LruCache(max_weight=10, weigh=_w, keep_newest=True)
    kept.put("a", ("a", 5))
    kept.put("big", ("big", 11))
    assert _keys(kept) == ["big"] and kept.weight == 11  # type: ignore[arg-type]
    kept.put("small", ("small", 1))  # ``big`` goes: no longer the newest
    assert _keys(kept) == ["small"] and kept.weight == 1  # type: ignore[arg-type]


def test_pop_and_clear_keep_the_weight_true() -> None:
    c: LruCache[str, tuple[str, int]] = LruCache(max_weight=100, weigh=_w)
    c.put("a", ("a", 5))
    c.put("b", ("b", 9))
    assert c.pop("a") == ("a", 5) and c.pop("a") is None
    assert c.weight == 9 and _keys(c) == ["b"]  # type: ignore[arg-type]
    c.clear()
    assert len(c) == 0 and c.weight == 0 and not c.items()
    c.put("c", ("c", 100))
    assert c.weight == 100 and len(c) == 1
    plain: LruCache[str, None] = LruCache(2)
    plain.put("none", None)  # (a None value: popped like any other)
    assert "none" in plain and plain.pop("none") is None and "none" not in plain


def test_unbounded_and_zero_bounds() -> None:
    c: LruCache[int, int] = LruCache()
    for i in range(1000):
        c.put(i, i)
    assert len(c) == 1000 and c.weight == 0
    nothing: LruCache[int, int] = LruCache(0)
    nothing.put(1, 1)
    assert len(nothing) == 0
    one: LruCache[int, int] = LruCache(0, keep_newest=True)
    one.put(1, 1)
    one.put(2, 2)
    assert list(one.items()) == [(2, 2)]
    with pytest.raises(ValueError, match="max_items=-1"):
        LruCache(-1)
    with pytest.raises(ValueError, match="max_weight=-1"):
        LruCache(max_weight=-1, weigh=_w)
    with pytest.raises(ValueError, match="go together"):
        LruCache(max_weight=1)


def _wi(value: tuple[int, int]) -> int:
    return value[1]


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["get", "peek", "put", "pop"]),
        st.integers(0, 7),
        st.integers(0, 6),
    ),
    max_size=60,
)


@given(
    ops=_OPS,
    max_items=st.none() | st.integers(0, 5),
    max_weight=st.none() | st.integers(0, 12),
    keep_newest=st.booleans(),
)
def test_agrees_with_a_list_model(
    ops: list[tuple[str, int, int]],
    max_items: int | None,
    max_weight: int | None,
    keep_newest: bool,
) -> None:
    c: LruCache[int, tuple[int, int]] = LruCache(
        max_items,
        max_weight=max_weight,
        weigh=None if max_weight is None else _wi,
        keep_newest=keep_newest,
    )
    model: list[tuple[int, int, int]] = []  # (key, value, weight), oldest first
    for n, (op, key, w) in enumerate(ops):
        at = next((i for i, (k, _, _) in enumerate(model) if k == key), None)
        if op == "get":
            want = None if at is None else model[at][1:]
            if at is not None:
                model.append(model.pop(at))
            assert c.get(key) == want
        elif op == "peek":
            assert c.peek(key) == (None if at is None else model[at][1:])
        elif op == "pop":
            want = None if at is None else model.pop(at)[1:]
            assert c.pop(key) == want
        else:
            if at is not None:
                model.pop(at)
            model.append((key, n, w))
            c.put(key, (n, w))
            floor = 1 if keep_newest else 0
            while len(model) > floor and (
                (max_items is not None and len(model) > max_items)
                or (max_weight is not None and sum(x[2] for x in model) > max_weight)
            ):
                model.pop(0)
        assert [(k, (v, w)) for k, v, w in model] == list(c.items())
        assert c.weight == (0 if max_weight is None else sum(x[2] for x in model))
        assert len(c) == len(model)


def test_a_copy_is_a_cache_of_its_own_and_iteration_gives_the_keys_oldest_first() -> None:
    """A copy (shallow or deep) keeps the bounds, values and order, and its reads and puts
    leave the original alone (the cache's bound dict methods are its own); iterating gives
    the keys, oldest first."""
    import copy

    c: LruCache[int, list[int]] = LruCache(3, max_weight=10, weigh=len)
    for k in (1, 2, 3):
        c.put(k, [k] * k)
    assert list(c) == [1, 2, 3]
    for d in (copy.copy(c), copy.deepcopy(c)):
        assert d.get(1) == [1] and list(d) == [2, 3, 1] and list(c) == [1, 2, 3]
        assert d.peek(3) == [3, 3, 3] and d.weight == c.weight == 6
        d.put(4, [4] * 4)  # past the weight: 2 goes (the oldest of the copy)
        assert list(d) == [3, 1, 4] and d.weight == 8
        assert list(c) == [1, 2, 3] and c.weight == 6
    assert copy.deepcopy(c).peek(2) is not c.peek(2)
    assert copy.copy(c).peek(2) is c.peek(2)
