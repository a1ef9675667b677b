"""``FragmentMemo.parse``: a manifest head decoded through its store's memo (only the open
ledger's fragments added since the last decoding parsed) equals the head decoded whole, for
any history of heads: fragments added, the last one grown or dropped, ledgers rolled over
(ids reused too), producer and dedup names that spell the memo's own text, blob names
holding quotes, brackets, NULs or lone surrogates, integers beyond 64 bits, heads written by
another JSON encoder, heads whose open ledger names its fragments twice, and malformed
heads. A state decoded through the memo also encodes to the bytes of a full encoding."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from filepulsar.dispatch.modes import ProducerAccessMode
from filepulsar.storage import jsontext
from filepulsar.storage.errors import CorruptDataError
from filepulsar.storage.fragments import Fragment, FragmentMemo
from filepulsar.storage.manifest import LedgerInfo, ManifestState, ProducerLease

pytestmark = pytest.mark.property

_ints = st.integers(0, 10**6) | st.integers(-(2**70), 2**70)
_names = st.sampled_from(["fragments", '"fragments":[', "],[", "p"]) | st.text(max_size=8)
# Fragments as a manifest may hold them (a decoder refuses other blob ids and numbers outside
# 64 bits: tests/test_fuzz_decoders.py); the tricky texts are in producer and dedup names.
_blob_ids = st.from_regex(r"[A-Za-z0-9_\-=:.%]{1,12}", fullmatch=True).filter(
    lambda b: b not in (".", "..")
)
_counts = st.integers(0, 10**6) | st.integers(0, 2**63 - 1)
_times = st.integers(0, 10**6) | st.integers(-(2**63), 2**63 - 1)
_fragments = st.builds(
    Fragment, _blob_ids, _counts, _counts, _counts, _counts, _counts, _times, _times
)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), _fragments),
        st.tuples(st.just("grow"), _fragments),
        st.tuples(st.just("roll"), st.integers(0, 3)),
        st.tuples(st.just("producer"), _names),
        st.tuples(st.just("dedup"), _names, _ints),
        st.tuples(st.just("foreign")),
        st.tuples(st.just("twice"), st.booleans(), _fragments),
        st.tuples(st.just("elsewhere"), _fragments),
        st.tuples(st.just("loose")),
        st.tuples(st.just("drop")),
        st.tuples(st.just("comma")),
    ),
    max_size=30,
)


def _apply(state: ManifestState, step: tuple[Any, ...]) -> None:
    kind = step[0]
    lg = state.ledgers[-1]
    assert lg.fragments is not None
    if kind == "add":
        lg.fragments.append(step[1])
    elif kind == "grow" and lg.fragments:
        lg.fragments[-1] = step[1]
    elif kind == "drop" and lg.fragments:
        lg.fragments.pop()
    elif kind == "roll":
        lg.closed_ms, lg.index, lg.fragments = (
            5,
            f"ledgers/{lg.ledger_id:020d}-{lg.ledger_id:020d}-ab.index",
            None,
        )
        state.ledgers.append(LedgerInfo(step[1], fragments=[]))
    elif kind == "producer":
        state.producers[step[1]] = ProducerLease(step[1], "s", ProducerAccessMode.Shared, 0, 1)
    elif kind == "dedup":
        state.dedup[step[1]] = step[2]
        state.dedup_used[step[1]] = 1
    state.version += 1


def _variant(raw: bytes, state: ManifestState, step: tuple[Any, ...]) -> bytes:
    """The head as another writer might have written it: by ``json`` with its default
    separators; with the open ledger's ``"fragments"`` twice (one with an extra fragment,
    before or after the real one: ``json`` keeps the last); with its last fragment not in
    the compact text. Or malformed: its last fragment cut out and the comma before it left;
    its fragments a string, and their text in another object."""
    if step[0] == "foreign":
        return jsontext.frame(json.dumps(json.loads(jsontext.unframe(raw, "t"))).encode())
    frags = state.ledgers[-1].fragments or []
    if step[0] == "elsewhere" and frags:
        # The memo's text found in another object, and the open ledger's fragments are the
        # very string the memo parses the rest with (so only the NUL check tells them apart).
        text = jsontext.unframe(raw, "t").decode()
        real = json.dumps([f.to_json() for f in [*frags, step[1]]], separators=(",", ":"))
        key = '"fragments":' + json.dumps([f.to_json() for f in frags], separators=(",", ":"))
        text = text.replace(key + "}", '"fragments":"\\u0000fp-fragments"}', 1)
        return jsontext.frame((text[:-1] + ',"z":{"fragments":' + real + "}}").encode())
    if step[0] == "loose" and frags:
        # Its last fragment written with a space (as JSON allows): not the compact text.
        text = jsontext.unframe(raw, "t").decode()
        last = json.dumps(frags[-1].to_json(), separators=(",", ":"))
        key = last + "]}"
        if text.count(key) == 1:
            return jsontext.frame(text.replace(key, "[ " + last[1:] + "]}").encode())
    if step[0] == "comma" and frags:
        # Not JSON: the last fragment cut out, and the comma before it left.
        text = jsontext.unframe(raw, "t").decode()
        key = "," + json.dumps(frags[-1].to_json(), separators=(",", ":")) + "]}"
        if text.count(key) == 1:
            return jsontext.frame(text.replace(key, ",]}").encode())
    if step[0] != "twice":
        return raw
    real = json.dumps([f.to_json() for f in frags], separators=(",", ":"))
    extra = json.dumps([f.to_json() for f in [*frags, step[2]]], separators=(",", ":"))
    text = jsontext.unframe(raw, "t").decode()
    key = '"fragments":' + real + "}"  # (the open ledger's: its last key)
    if not frags or text.count(key) != 1:
        return raw
    pair = (extra, real) if step[1] else (real, extra)
    twice = '"fragments":' + pair[0] + ',"fragments":' + pair[1] + "}"
    return jsontext.frame(text.replace(key, twice).encode())


def _decoded(raw: bytes, memo: FragmentMemo | None) -> ManifestState | str:
    try:
        return ManifestState.decode(raw, "t", None, memo)
    except CorruptDataError as e:
        return f"CorruptDataError: {e}"


def _f(i: int) -> Fragment:
    return Fragment(f"b{i}", i, 1, 0, 10, 1, 1, 1)


@settings(max_examples=300, deadline=None)
@given(_steps)
@example([("add", _f(1)), ("add", _f(2)), ("add", _f(3)), ("comma",)])
@example([("add", _f(1)), ("add", _f(2)), ("add", _f(3)), ("drop",), ("grow", _f(4))])
@example([("add", _f(1)), ("add", _f(2)), ("loose",), ("add", _f(3)), ("add", _f(4))])
def test_a_memo_decoding_equals_a_whole_decoding(steps: list[tuple[Any, ...]]) -> None:
    """As one store does: each head is encoded and decoded through the same memo, and the
    next head is built on the state decoded (a writer on another writer's head)."""
    memo = FragmentMemo()  # one store's, across the whole history
    state = ManifestState(topic="t", partition=-1, ledgers=[LedgerInfo(0, fragments=[])], memo=memo)
    for step in steps:
        _apply(state, step)
        raw = state.encode()
        whole = _decoded(raw, None)
        assert isinstance(whole, ManifestState) and whole.encode() == raw  # (memo-less)
        raw = _variant(raw, state, step)
        whole = _decoded(raw, None)
        got = _decoded(raw, memo)
        assert got == whole
        assert _decoded(raw, FragmentMemo()) == whole
        if isinstance(got, ManifestState):
            assert isinstance(whole, ManifestState) and got.encode() == whole.encode()
            state = got  # (its memo is the store's)


def test_the_memo_parses_only_what_was_added() -> None:
    """The memo's own case: after one decoding, the next head (one fragment more, the last
    one grown) is parsed through the memo, and the fragments it knew are the same objects."""
    frags = [Fragment(f"b{i}", i, 1, 0, 10, 1, 1, 1) for i in range(5)]
    state = ManifestState(topic="t", partition=-1, ledgers=[LedgerInfo(3, fragments=frags)])
    memo = FragmentMemo()
    first = ManifestState.decode(state.encode(), "t", None, memo)
    state.ledgers[-1].fragments = [*frags[:4], Fragment("b4", 4, 2, 0, 20, 2, 1, 2)]
    state.ledgers[-1].fragments.append(Fragment("c", 6, 1, 0, 10, 1, 2, 2))
    state.version += 1
    body = jsontext.unframe(state.encode(), "t")
    parsed = memo.parse(body)
    assert parsed is not None
    d, got = parsed
    assert got == state.ledgers[-1].fragments
    kept = first.ledgers[-1].fragments
    assert kept is not None and all(a is b for a, b in zip(got[:4], kept[:4]))
    assert d["ledgers"][-1]["fragments"] is None and d["version"] == state.version


def test_a_writers_own_record_is_in_the_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer's own delta record (``delta_from``, what its commit writes) adds its fragment
    to the memo, as the fold of another writer's record does: the next full head it decodes
    parses only the fragments committed after its own. Before, the memo stayed at the
    writer's last full decoding, and every fragment since was parsed again at each full head
    (``bench_gateway --gateways 10 --topics 30``: about 6,500 fragments parsed a gateway in
    10 s, against 1,000 with the memo following)."""
    frags = [Fragment(f"b{i}", i, 1, 0, 10, 1, 1, 1) for i in range(5)]
    head = ManifestState(topic="t", partition=-1, ledgers=[LedgerInfo(3, fragments=frags)])
    memo = FragmentMemo()
    base = ManifestState.decode(head.encode(), "t", None, memo)
    # The writer's commit: a private copy of the state it read, its entry's fragment added.
    mine = base.copy()
    lg = mine.ledgers[-1]
    assert lg.fragments is not None
    own = Fragment("mine", 5, 1, 0, 10, 1, 2, 2)
    lg.fragments.append(own)
    lg.entries += 1
    mine.version, mine.prev_commit_id = base.version + 1, base.commit_id
    assert mine.delta_from(base) is not None
    # Another writer's commit after it, then a full head (written by a third).
    after = mine.copy()
    theirs = Fragment("theirs", 6, 1, 0, 10, 1, 3, 3)
    assert after.ledgers[-1].fragments is not None
    after.ledgers[-1].fragments.append(theirs)
    after.version += 1
    after.memo = None  # (encoded by another process: through a memo of its own)
    parsed_whole: list[Any] = []
    real = Fragment.from_json

    def counted(v: list[Any]) -> Fragment:
        parsed_whole.append(v)
        return real(v)

    monkeypatch.setattr(Fragment, "from_json", staticmethod(counted))
    got = memo.parse(jsontext.unframe(after.encode(), "t"))
    assert got is not None
    assert got[1] == [*frags, own, theirs]
    assert got[1][5] is own  # (the writer's own fragment, not parsed again)
    assert [v[0] for v in parsed_whole] == ["theirs"]
