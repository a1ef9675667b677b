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
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from filepulsar.storage import jsontext

if TYPE_CHECKING:
    from filepulsar.storage.manifest import LedgerInfo

#: A stored file name (a blob id, an index name): ``filepulsar.storage.names`` segment rules, so
#: nothing a manifest, index or compaction state names leaves its folder.
BLOB_ID = re.compile(r"(?!\.\.?$)[A-Za-z0-9_\-=:.%]{1,200}")

#: Blob ids that passed :data:`BLOB_ID` (a topic's fragments name a few blobs many times:
#: each is checked once, not once per fragment parsed), forgotten past a bound.
_VALID_BLOBS: set[str] = set()
_VALID_BLOBS_MAX = 4096
_I64 = 1 << 63
#: The types of a stored fragment's items (``[blob, first_entry, count, offset, length,
#: messages, min_publish, max_publish]``).
_FRAGMENT_TYPES = (str, int, int, int, int, int, int, int)

#: ``json.dumps(x, separators=(",", ":"))``, fast (:func:`jsontext.dumps_compact`).
_dumps = jsontext.dumps_compact


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
        """The fragment of a stored ``[blob, first_entry, count, offset, length, messages,
        min_publish, max_publish]``, checked.

        Raises
        ------
        ValueError
            If it has another shape, a count or offset is not an integer >= 0, or the blob id
            is not a valid name (so no stored name reaches outside its folder); decoders turn
            it into :class:`~filepulsar.storage.errors.CorruptDataError` naming their file.
        """
        if type(v) is not list or len(v) != 8:
            raise ValueError(f"a fragment is a list of 8 items, got {v!r:.80}")
        # (The usual fragment checked in a few C loops: folding a delta record parses one or
        # two per commit of every writer; anything else takes the checks below, which say why.)
        if (
            tuple(map(type, v)) == _FRAGMENT_TYPES
            and v[0] in _VALID_BLOBS
            and min(v[1:6]) >= 0
            and min(v[6], v[7]) >= -_I64
            and max(v[1:]) < _I64
        ):
            return cls(*v)
        blob = v[0]
        if type(blob) is not str or blob not in _VALID_BLOBS:
            if type(blob) is not str or not BLOB_ID.fullmatch(blob):
                raise ValueError(f"fragment blob id {blob!r:.80} is not a valid name")
            if len(_VALID_BLOBS) >= _VALID_BLOBS_MAX:
                _VALID_BLOBS.clear()
            _VALID_BLOBS.add(blob)
        for x in v[1:6]:
            if type(x) is not int or not 0 <= x < _I64:
                raise ValueError(
                    f"fragment {v!r:.120} holds a count or offset that is not an int >= 0"
                )
        lo, hi = v[6], v[7]
        if (
            type(lo) is not int
            or type(hi) is not int
            or not (-_I64 <= lo < _I64 and -_I64 <= hi < _I64)
        ):
            raise ValueError(f"fragment {v!r:.120} holds publish times that are not integers")
        return cls(*v)


def common_prefix(a: Sequence[Any], b: Sequence[Any], same: Callable[[Any, Any], bool]) -> int:
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


#: What stands in for the open ledger's fragments while the rest of a head is parsed
#: (:meth:`FragmentMemo.parse`): a string holding a NUL, which a head holding no ``\u0000``
#: escape cannot hold anywhere else.
_HOLE = "\x00fp-fragments"
_HOLE_JSON = json.dumps(_HOLE)
_KEY = '"fragments":'
#: One JSON value from a position of a text: (value, the position after it).
_value_at = json.JSONDecoder().raw_decode
#: A :class:`FragmentMemo`'s state (see its ``__init__``).
_Memo = tuple[
    tuple[Fragment, ...], str | None, int, int, tuple[Fragment, ...], tuple[list[Any], ...]
]


class FragmentMemo:
    """The open ledger's fragments as last encoded or decoded by one manifest store, with the
    JSON text of their list, so a commit encodes (and a reader decodes) only the fragments added
    since, not all of them (up to ``ledger_max_fragments``) every time. A ledger only gains
    fragments, or grows its last one, until it is closed (a grown fragment is a new object).

    - Encoding (:meth:`encode`): the fragments up to the first one that is not the same
      object keep their text. Every text kept is ``json``'s compact text of its fragment, so
      the bytes are exactly those of a full encoding (``tests/test_format_golden.py``).
    - Decoding (:meth:`parse`): where a head's text holds the open ledger's fragments as
      known (all but the last, which may have grown) followed by others, only those others
      are parsed, and the rest of the head with the fragments cut out. The result is exactly
      that of parsing the whole text (``tests/test_fragment_parse.py``). The fragments
      parsed keep their text when it is the compact text (checked for them all at once), so
      a commit built on another writer's head encodes only its own fragments.
    - Folding (:meth:`folded`): a delta record that adds fragments to the ones the memo
      holds adds them to the memo too (their text written when next needed), so the next
      head a reader or writer decodes parses only what came after the last delta it folded.
      A writer's own delta records do the same
      (:meth:`~filepulsar.storage.manifest.ManifestState.delta_from`): without them, every
      fold after its first commit would find the memo behind.

    Thread-safe: the memo is one tuple, replaced whole; a race only costs a full parse or
    encoding."""

    __slots__ = ("_memo",)

    def __init__(self) -> None:
        # (the fragments; the compact JSON text of their list without its brackets (None:
        # none kept); where in that text the last one starts; where the text of all but
        # the last was last found in a head's text; the fragments folds added after those,
        # and their JSON lists, not in the text yet)
        self._memo: _Memo = ((), "", 0, -1, (), ())

    def _remember(self, frags: Sequence[Fragment], items: str, last: str, at: int) -> None:
        self._memo = (tuple(frags), items, len(items) - len(last), at, (), ())

    def _written(self) -> tuple[tuple[Fragment, ...], str | None, int, int]:
        """The memo, with the fragments folds added written into its text."""
        done, items, cut, at, more, raws = self._memo
        if not more:
            return done, items, cut, at
        assert items is not None  # (folds add only to a memo with a text)
        added = _dumps(list(raws))[1:-1]
        items = f"{items},{added}" if items else added
        cut = len(items) - len(_dumps(raws[-1]))
        done += more
        self._memo = (done, items, cut, at, (), ())
        return done, items, cut, at

    def folded(
        self,
        before: Sequence[Fragment],
        keep: int,
        added: Sequence[Fragment],
        raws: Sequence[list[Any]],
    ) -> None:
        """A fold made the open ledger's fragments ``before`` into its first ``keep`` and
        ``added`` (parsed from the JSON lists ``raws``): where the memo holds ``before`` (as
        many, the last the same object), it holds the new ones from now on."""
        done, items, cut, at, more, held = self._memo
        n = len(done) + len(more)
        if items is None or n != len(before):
            return
        if n and (more[-1] if more else done[-1]) is not before[-1]:
            return
        if keep == n:
            more, held = (*more, *added), (*held, *raws)
        elif keep == n - 1 and more:
            more, held = (*more[:-1], *added), (*held[:-1], *raws)
        elif keep == n - 1 and added:  # (the memo's last grew: its text goes)
            done, items, more, held = done[:-1], items[: max(cut - 1, 0)], (*added,), (*raws,)
        else:
            return
        self._memo = (done, items, cut, at, more, held)

    def encode(self, lg: LedgerInfo) -> str:
        """The JSON text of ``lg.fragments`` (a list)."""
        frags = lg.fragments or []
        done, items, cut, at = self._written()
        if items is None:  # (no text kept: encoded whole)
            done, items = (), ""
        n = common_prefix(done, frags, operator.is_)
        if n == len(frags) == len(done):
            return "[" + items + "]"
        if done and len(frags) > n >= len(done) - 1:  # (fragments added, or the last grown)
            kept = items if n == len(done) else items[: max(cut - 1, 0)]
            added = [_dumps(f.to_json()) for f in frags[n:]]
            text = ",".join([kept, *added] if kept else added)
        else:
            added = [_dumps(f.to_json()) for f in frags[-1:]]
            text = _dumps([f.to_json() for f in frags])[1:-1]
        self._remember(frags, text, added[-1] if added else "", at)
        return "[" + text + "]"

    def parse(self, body: bytes) -> tuple[Any, list[Fragment]] | None:
        """A head's JSON ``body`` parsed as :func:`jsontext.loads_stored` parses it, with the
        last ledger's ``"fragments"`` set to None, and that ledger's fragments (a fresh
        list): parsing only the fragments added since the memo's. None where that does not
        apply (then the caller parses the whole, and :meth:`decode` the fragments)."""
        done, items, cut, at = self._written()
        if len(done) < 2 or items is None:
            return None
        try:
            text = body.decode()
        except UnicodeDecodeError:
            return None
        needle = _KEY + "[" + items[:cut]  # all but the last, each followed by a comma
        if not text.startswith(needle, at):  # (where it was, as a rule: else look)
            # At the first fragments key, as a rule (a head's counts before it may have
            # grown a digit); else anywhere (a search as long as the needle).
            at = text.find(_KEY)
            if at < 0 or not text.startswith(needle, at):
                at = text.find(needle)
        if at < 0:
            return None
        start = at + len(_KEY)
        first = at + len(needle)
        try:
            # The fragments from the memo's last on, as one list: "[" and the text from there.
            rest, end = _value_at("[" + text[first:])
            pos = first + end - 2  # the "]" closing the fragments in ``text``
            if not rest:
                return None
            outside = (text[:start], text[pos + 1 :])  # (the head, its fragments cut out)
            if "\\u0000" in outside[0] or "\\u0000" in outside[1]:
                return None  # (the hole's text could be there)
            d = jsontext.loads_stored(f"{outside[0]}{_HOLE_JSON}{outside[1]}".encode())
            lgs = d.get("ledgers") if type(d) is dict else None
            last = lgs[-1] if type(lgs) is list and lgs else None
            if type(last) is not dict or last.get("fragments") != _HOLE:
                return None  # the text found was not the last ledger's fragments
            # The memo's last fragment as it was (not grown): the same object.
            was = items[cut:]
            after = first + len(was)
            if text.startswith(was, first) and text[after : after + 1] in (",", "]"):
                new = [done[-1], *(Fragment.from_json(v) for v in rest[1:])]
            else:
                new = [Fragment.from_json(v) for v in rest]
            last_text = _dumps(rest[-1])
            compact = _dumps(rest)
            if compact == "[" + text[first:pos] + "]":  # the head's text is compact: keep it
                now = text[start + 1 : pos]
            else:
                now = items[:cut] + compact[1:-1]
        except (ValueError, RecursionError, TypeError):
            return None
        last["fragments"] = None
        frags = [*done[:-1], *new]
        self._remember(frags, now, last_text, at)
        return d, frags

    def decode(self, raw: list[list[Any]]) -> list[Fragment]:
        """The fragments of the open ledger's JSON lists ``raw``, parsed whole (a fresh
        list); remembered, with their compact text, for :meth:`parse` and :meth:`encode`."""
        out = [Fragment.from_json(v) for v in raw]
        # (Fewer than two is a head :meth:`parse` cannot use, but the text of a new ledger's
        # first fragments is kept too: the folds after it add theirs, for the next head.)
        self._remember(out, _dumps(raw)[1:-1], _dumps(raw[-1]) if raw else "", -1)
        return out
