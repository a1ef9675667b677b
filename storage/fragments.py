"""Fragments: the runs of entries a ledger's manifest record lists, and the memo that lets a
commit encode (and a reader decode) only the open ledger's new fragments.

A :class:`Fragment` names a byte range of one blob holding consecutive entries of a ledger
(``storage/FORMAT.md``, "Manifest"); :class:`FragmentMemo` is the per-store cache of the open
ledger's fragments as last encoded and decoded (:mod:`filepulsar.storage.manifest` owns the
ledgers and the state that hold them).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from filepulsar.storage.manifest import LedgerInfo

#: ``json.dumps(x, separators=(",", ":"))`` without building an encoder per call.
_dumps = json.JSONEncoder(separators=(",", ":")).encode


@dataclass(slots=True)
class Fragment:
    """A run of ``count`` entries stored back to back in one blob.

    Entries ``first_entry .. first_entry+count-1`` of the ledger occupy bytes
    ``[offset, offset+length)`` of ``blob``; ``messages`` counts the messages in them.
    """

    blob: str
    first_entry: int
    count: int
    offset: int
    length: int
    messages: int
    min_publish: int
    max_publish: int

    def to_json(self) -> list[Any]:
        return [
            self.blob,
            self.first_entry,
            self.count,
            self.offset,
            self.length,
            self.messages,
            self.min_publish,
            self.max_publish,
        ]

    @classmethod
    def from_json(cls, v: list[Any]) -> Fragment:
        return cls(*v)


def _common_prefix(a: Sequence[Any], b: Sequence[Any], same: Callable[[Any, Any], bool]) -> int:
    """How many leading items of ``a`` and ``b`` are ``same``.

    The usual case is checked first in one pass of C (``map`` over ``same``, an operator
    function): every item but the last of the shorter is the same, as when a ledger gained
    fragments or grew its last one since (a ledger written by several producers gains a
    fragment per commit, up to ``ledger_max_fragments``)."""
    k = min(len(a), len(b)) - 1
    if k > 0 and all(map(same, a[:k], b[:k])):
        return k + 1 if same(a[k], b[k]) else k
    n = 0
    for x, y in zip(a, b):
        if not same(x, y):
            break
        n += 1
    return n


class FragmentMemo:
    """The open ledger's fragments as last encoded and decoded by one manifest store, so a
    commit encodes (and a reader decodes) only the fragments added since, not all of them
    (up to ``ledger_max_fragments``) every time. A ledger only gains fragments, or grows its
    last one, until it is closed (a grown fragment is a new object), so the fragments up to
    the first one that is not the same object (encoding) or an equal JSON list (decoding)
    keep their text or objects; the bytes are exactly those of a full encoding
    (``tests/test_format_golden.py``). Thread-safe: each memo is one tuple, replaced whole;
    a race only costs a full encoding."""

    __slots__ = ("_dec", "_enc")

    def __init__(self) -> None:
        # (ledger id, the fragments encoded, the JSON text of each)
        self._enc: tuple[int, tuple[Fragment, ...], tuple[str, ...]] = (-1, (), ())
        # (ledger id, the JSON lists decoded, the fragments made of them)
        self._dec: tuple[int, list[list[Any]], list[Fragment]] = (-1, [], [])

    def encode(self, lg: LedgerInfo) -> str:
        """The JSON text of ``lg.fragments`` (a list)."""
        frags = lg.fragments or []
        lid, done, texts = self._enc
        n = _common_prefix(done, frags, operator.is_) if lid == lg.ledger_id else 0
        if n < len(frags) or n < len(done):
            texts = texts[:n] + tuple(_dumps(f.to_json()) for f in frags[n:])
            self._enc = (lg.ledger_id, tuple(frags), texts)
        return "[" + ",".join(texts) + "]"

    def decode(self, ledger_id: int, raw: list[list[Any]]) -> list[Fragment]:
        """The fragments of the JSON lists ``raw`` (a fresh list; the fragments are shared)."""
        lid, seen, frags = self._dec
        n = _common_prefix(seen, raw, operator.eq) if lid == ledger_id else 0
        out = frags[:n] + [Fragment(*v) for v in raw[n:]]
        if n < len(raw) or n < len(seen):
            self._dec = (ledger_id, raw, out[:])
        return out
