"""The subscription state and its cursor algebra: what a subscription stores and the pure
operations on it (acknowledge one position, a range, cumulatively, a batch index; normalise
the ack holes into ``mark_delete``; cap the ranges; membership of consumers and the sticky-key
selector). No I/O: :mod:`filepulsar.storage.subscriptions` and
:mod:`filepulsar.storage.subscription` commit these states, :mod:`filepulsar.storage.claims` decides
what each dispatch takes from them and :mod:`filepulsar.storage.delivery` dispatches with them.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from filepulsar.dispatch.modes import ConsumerType, KeySharedMode
from filepulsar.dispatch.selectors import selector_from_dict
from filepulsar.dispatch.selectors.base import StickyKeyConsumerSelector
from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
from filepulsar.storage import jsontext
from filepulsar.storage.errors import (
    CorruptDataError,
)
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.position import EARLIEST, Position
from filepulsar.storage.versioned import envelope

if TYPE_CHECKING:
    pass


STATE_FORMAT = 1
DEFAULT_LEASE_MS = 30_000

T = TypeVar("T")
_END = 2**62  # an entry id after every real one: (ledger, _END) is the end of that ledger


def pos_key(p: Position) -> str:
    """``p`` as the ``"ledger:entry"`` key of the state's position maps (:func:`key_pos`
    reads it back)."""
    return f"{p[0]}:{p[1]}"


def _adjacent(
    pl: int, pe: int, ql: int, qe: int, next_pos: Callable[[Position], Position | None]
) -> bool:
    """Whether entry ``(ql, qe)`` is the one right after ``(pl, pe)`` (which may be a
    mark-delete position such as ``(-1, -1)`` or ``(ledger, -1)``). Within one ledger the ids
    say it; across ledgers the ledger list does (empty or deleted ledgers lie between). Ids,
    not positions: the ack ranges are lists of ids, and this runs once per range."""
    if pl == ql and pe != _END:
        return qe == pe + 1
    if ql < pl:
        return False
    return next_pos(Position(pl, pe)) == (ql, qe)


_NESTED = (dict, list)


def _json_copy(v: Any) -> Any:
    """A deep copy of a JSON value (dicts, lists and immutable scalars). A scalar is taken
    where it stands, without a call (a commit copies the selector: mostly scalars)."""
    if isinstance(v, dict):
        return {k: _json_copy(x) if isinstance(x, _NESTED) else x for k, x in v.items()}
    if isinstance(v, list):
        return [_json_copy(x) if isinstance(x, _NESTED) else x for x in v]
    return v


def key_pos(k: str) -> Position:
    """The position a :func:`pos_key` key names."""
    a, b = k.split(":")
    return Position(int(a), int(b))


@dataclass(slots=True)
class ConsumerInfo:
    """A consumer registered on the subscription (``cid`` is unique per consumer instance).

    ``sel_id`` is the consumer in a Key_Shared selector: ``name + "\\0" + nameIndex`` with
    consistent hashing (Pulsar places ring points by consumer name, so a consumer that comes
    back under its name gets its hash ranges back), else ``cid``.

    The lease: ``renewals`` counts the consumer's renewals (every commit that extends its
    lease changes it) and ``lease_ms`` is how long it may go without one. Other processes
    time it on their own monotonic clocks from when they first saw the current renewal
    (:class:`~filepulsar.storage.consumer_leases.LeaseWatch`), so wall clocks never decide it;
    ``expires_ms`` (the consumer's own wall clock plus the lease) is only shown in stats.
    ``lease_ms`` 0: written before renewals were counted (the watch assumes the default).
    """

    cid: str
    name: str
    priority: int
    expires_ms: int
    joined: int
    sel_id: str
    lease_ms: int = 0
    renewals: int = 0
    #: Key_Shared consumers that record what they hand out only when membership changes
    #: (:func:`storage.claims.record_in_flight`): the ``selector_version`` at which they last
    #: recorded their deliveries in flight. None: a consumer that records every claim in a
    #: commit (never waited for).
    synced: int | None = None

    def to_json(self) -> list[Any]:
        out: list[Any] = [self.name, self.priority, self.expires_ms, self.joined]
        if self.synced is not None:
            return [*out, self.sel_id, self.lease_ms, self.renewals, self.synced]
        if self.lease_ms:
            return [*out, self.sel_id, self.lease_ms, self.renewals]
        return [*out, self.sel_id] if self.sel_id != self.cid else out

    @classmethod
    def from_json(cls, cid: str, v: list[Any]) -> ConsumerInfo:
        sel_id = v[4] if len(v) > 4 else cid
        lease_ms, renewals = (v[5], v[6]) if len(v) > 6 else (0, 0)
        synced = v[7] if len(v) > 7 else None
        return cls(cid, v[0], v[1], v[2], v[3], sel_id, lease_ms, renewals, synced)

    def extend(self, now: int, lease_ms: int) -> None:
        """Renew the lease at ``now`` (the consumer's wall clock, for ``expires_ms``)."""
        self.expires_ms = now + lease_ms
        self.lease_ms = lease_ms
        self.renewals += 1

    def renewal(self) -> tuple[int, int, int]:
        """What every renewal (and registration) changes: the join order, the renewal count
        (the expiry tells renewals apart in entries written before counts, and where older
        code rewrote the count). An observer that sees it unchanged for ``lease_ms`` on its
        own clock judges the lease lapsed."""
        return (self.joined, self.renewals, self.expires_ms)


#: What building a value from a stored one of the wrong shape raises.
MALFORMED = (ValueError, KeyError, TypeError, AttributeError, IndexError)


def _i64(x: Any) -> bool:
    return type(x) is int and -(1 << 63) <= x < 1 << 63


def _pos(x: Any) -> bool:
    return type(x) is list and len(x) == 2 and _i64(x[0]) and _i64(x[1])


#: The keys of a state's entry maps, joined by commas: ``<ledger>:<entry>`` each.
_ENTRY_KEYS = re.compile(r"-?[0-9]+:-?[0-9]+(?:,-?[0-9]+:-?[0-9]+)*")


def _rows_ok(rows: Any, shape: tuple[type, ...]) -> bool:
    """Whether ``rows`` is a list of lists of ``len(shape)`` items of those types, every
    integer 64-bit; column by column, so a state of 10,000 ack ranges is checked at C speed."""
    if type(rows) is not list:
        return False
    if not rows:
        return True
    if set(map(type, rows)) != {list} or set(map(len, rows)) != {len(shape)}:
        return False
    flat = list(itertools.chain.from_iterable(rows))
    if set(shape) == {int}:
        return set(map(type, flat)) == {int} and min(flat) >= -(1 << 63) and max(flat) < 1 << 63
    for i, want in enumerate(shape):
        col = flat[i :: len(shape)]
        if set(map(type, col)) != {want}:
            return False
        if want is int and not (min(col) >= -(1 << 63) and max(col) < 1 << 63):
            return False
    return True


def _ints_ok(lists: list[Any]) -> bool:
    """Whether every item of ``lists`` is a list of 64-bit integers."""
    if not lists:
        return True
    if set(map(type, lists)) != {list}:
        return False
    flat = list(itertools.chain.from_iterable(lists))
    return not flat or (
        set(map(type, flat)) == {int} and min(flat) >= -(1 << 63) and max(flat) < 1 << 63
    )


def _ints_fit(v: Any) -> bool:
    """Whether every integer in ``v`` (nested lists and objects) is 64-bit."""
    if type(v) is int:
        return _i64(v)
    if type(v) is list:
        return all(map(_ints_fit, v))
    if type(v) is dict:
        return all(map(_ints_fit, v.values()))
    return True


# The stored spellings of the closed sets, to the members (a state file stores wire names).
_TYPES = {m.wire: m for m in ConsumerType}
_KEY_SHARED_MODES = {m.wire: m for m in KeySharedMode}
#: Each member's ``wire`` (what every encoding writes; the property's lookups once).
_TYPE_WIRE = {m: w for w, m in _TYPES.items()}
_KEY_SHARED_MODE_WIRE = {m: w for w, m in _KEY_SHARED_MODES.items()}


def _check_state(d: dict[str, Any]) -> None:
    """Raise ValueError if a subscription state's fields have the wrong types (a checksum
    proves the bytes are as written, not that the writer was right), so every use of the
    state can trust them."""
    envelope.check_stamp(d)
    for k in ("created", "lastActive", "joinSeq", "selectorVersion"):
        if not _i64(d[k]):
            raise ValueError(f"{k!r} is not a 64-bit integer: {d[k]!r:.80}")
    for k in ("topic", "name", "type", "commitId", "keySharedMode"):
        if type(d[k]) is not str:
            raise ValueError(f"{k!r} is not a string: {d[k]!r:.80}")
    if d["type"] not in _TYPES or d["keySharedMode"] not in _KEY_SHARED_MODES:
        raise ValueError(
            f"unknown type or Key_Shared mode: {d['type']!r:.40}, {d['keySharedMode']!r:.40}"
        )
    if not _i64(d.get("seekEpoch", 0)):
        raise ValueError(f"'seekEpoch' is not a 64-bit integer: {d['seekEpoch']!r:.80}")
    if not _pos(d["markDelete"]) or not _pos(d["dispatched"]):
        raise ValueError("'markDelete' and 'dispatched' must be [ledger, entry]")
    if not _rows_ok(d["acked"], (int, int, int, int)):
        raise ValueError(f"'acked' is not a list of [l1, e1, l2, e2]: {d['acked']!r:.80}")
    shapes: list[tuple[str, tuple[type, ...] | None]] = [
        ("batchAcks", None),
        ("pending", (str, int, int)),
        ("redeliver", (int, int, int)),
    ]
    for k, shape in shapes:
        m = d[k]
        if type(m) is not dict or (m and not _ENTRY_KEYS.fullmatch(",".join(m))):
            raise ValueError(f"{k!r} is not a map of entries: {m!r:.80}")
        vals = list(m.values())
        ok = _rows_ok(vals, shape) if shape else _ints_ok(vals)
        if not ok:
            raise ValueError(f"{k!r} holds values of the wrong shape: {m!r:.80}")
    consumers = d["consumers"]
    if type(consumers) is not dict:
        raise ValueError("'consumers' is not an object")
    for v in consumers.values():
        if not (
            type(v) is list
            and 4 <= len(v) <= 8
            and type(v[0]) is str
            and all(map(_i64, v[1:4]))
            and (len(v) < 5 or type(v[4]) is str)
            and all(map(_i64, v[5:8]))
        ):
            raise ValueError(f"a consumer is {v!r:.80}")
    if d["selector"] is not None and (
        type(d["selector"]) is not dict or not _ints_fit(d["selector"])
    ):
        raise ValueError("'selector' is not an object of 64-bit numbers")
    props = d.get("properties", {})
    if type(props) is not dict or not all(type(v) is str for v in props.values()):
        raise ValueError("'properties' is not a map of strings")


_SEL_SEP = "\0"


def selector_add(
    sel: StickyKeyConsumerSelector,
    cid: str,
    name: str,
    ranges: list[tuple[int, int]] | None,
) -> str:
    """Add a consumer to a Key_Shared selector; return its ``sel_id``."""
    if isinstance(sel, ConsistentHashingSelector):
        return f"{name}{_SEL_SEP}{sel.add_consumer(name, ranges)}"
    sel.add_consumer(cid, ranges)
    return cid


def _selector_remove(sel: StickyKeyConsumerSelector, sel_id: str) -> None:
    if isinstance(sel, ConsistentHashingSelector):
        name, _, index = sel_id.rpartition(_SEL_SEP)
        if name:
            sel.remove_consumer(name, name_index=int(index))
            return
    sel.remove_consumer(sel_id)


def selector_owner(sel: StickyKeyConsumerSelector, slot: int) -> str | None:
    """The ``sel_id`` of the consumer owning ``slot``."""
    if isinstance(sel, ConsistentHashingSelector):
        inst = sel.select_slot_instance(slot)
        return None if inst is None else f"{inst[0]}{_SEL_SEP}{inst[1]}"
    return sel.select_slot(slot)


def selector_ids(sel: StickyKeyConsumerSelector) -> list[str]:
    """The ``sel_id`` of each of ``sel``'s consumers, in :meth:`consumers
    <filepulsar.dispatch.selectors.base.StickyKeyConsumerSelector.consumers>` order (what
    the indices of its :meth:`owner_table
    <filepulsar.dispatch.selectors.base.StickyKeyConsumerSelector.owner_table>` point at):
    what :func:`selector_owner` gives for the slots each owns."""
    if isinstance(sel, ConsistentHashingSelector):
        return [f"{name}{_SEL_SEP}{index}" for name, index in sel.instances()]
    return sel.consumers()


def slot_table(sel: StickyKeyConsumerSelector) -> tuple[npt.NDArray[np.int32], list[str | None]]:
    """:func:`selector_owner` of every slot as two indexes, ``ids[table.item(slot)]`` for a
    slot in ``[0, len(table))``: the selector's own table (built once per selector) and the
    ``sel_id`` of each of its consumers (:func:`selector_ids`), with None last (index -1:
    nobody). A new selector costs a list of its members, not one entry per slot."""
    return sel.owner_table(), [*selector_ids(sel), None]


@dataclass(slots=True)
class SubscriptionState:
    """Everything a subscription on one managed ledger keeps (see the module docstring).

    ``pending`` maps ``"ledger:entry"`` → ``[consumer id, redelivery count, slot]``;
    ``redeliver`` maps ``"ledger:entry"`` → ``[redelivery count, not before ms, slot]``
    (slot -1 when not Key_Shared); ``acked`` holds inclusive ``[l1, e1, l2, e2]`` ranges beyond
    ``mark_delete``; ``batch_acks`` maps a partly acknowledged batch entry to the acknowledged
    batch indexes; ``properties`` are the subscription properties fixed when it was created
    (tag filters use them). A state written before ``properties`` existed reads as ``{}``.
    ``seek_epoch`` counts the seeks and cursor resets (:meth:`seek`); written only when not
    0, and a state without it reads as 0.
    """

    topic: str
    name: str
    sub_type: ConsumerType
    version: int = 0
    updated_ms: int = 0
    commit_id: str = ""
    prev_commit_id: str = ""
    created_ms: int = 0
    last_active_ms: int = 0
    mark_delete: Position = EARLIEST
    acked: list[list[int]] = field(default_factory=list)
    batch_acks: dict[str, list[int]] = field(default_factory=dict)
    consumers: dict[str, ConsumerInfo] = field(default_factory=dict)
    join_seq: int = 0
    pending: dict[str, Sequence[Any]] = field(default_factory=dict)
    redeliver: dict[str, Sequence[Any]] = field(default_factory=dict)
    dispatched: Position = EARLIEST
    key_shared_mode: KeySharedMode = KeySharedMode.AutoSplit
    selector: dict[str, Any] | None = None
    selector_version: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    seek_epoch: int = 0

    def copy(self) -> SubscriptionState:
        """A private copy to change (what a commit builds on), equal to decoding this state's
        encoding without the JSON: every list and dict is new, the consumers are new objects,
        the immutable values are shared, and so are the values of ``pending`` and
        ``redeliver`` (read-only sequences: a change replaces one, never changes it; a Shared
        consumer's claim commit copied thousands of them at each fetch)."""
        return SubscriptionState(
            topic=self.topic,
            name=self.name,
            sub_type=self.sub_type,
            version=self.version,
            updated_ms=self.updated_ms,
            commit_id=self.commit_id,
            prev_commit_id=self.prev_commit_id,
            created_ms=self.created_ms,
            last_active_ms=self.last_active_ms,
            mark_delete=self.mark_delete,
            acked=[list(r) for r in self.acked],
            batch_acks={k: list(v) for k, v in self.batch_acks.items()},
            consumers={
                c: ConsumerInfo(
                    i.cid,
                    i.name,
                    i.priority,
                    i.expires_ms,
                    i.joined,
                    i.sel_id,
                    i.lease_ms,
                    i.renewals,
                    i.synced,
                )
                for c, i in self.consumers.items()
            },
            join_seq=self.join_seq,
            # (Their values are replaced, never changed in place: typed read-only.)
            pending=dict(self.pending),
            redeliver=dict(self.redeliver),
            dispatched=self.dispatched,
            key_shared_mode=self.key_shared_mode,
            selector=_json_copy(self.selector),
            selector_version=self.selector_version,
            properties=dict(self.properties),
            seek_epoch=self.seek_epoch,
        )

    def encode(self) -> bytes:
        return envelope.encode(
            {
                "format": STATE_FORMAT,
                "topic": self.topic,
                "name": self.name,
                "type": _TYPE_WIRE[self.sub_type],
                "version": self.version,
                "updated": self.updated_ms,
                "commitId": self.commit_id,
                "created": self.created_ms,
                "lastActive": self.last_active_ms,
                "markDelete": list(self.mark_delete),
                "acked": self.acked,
                "batchAcks": self.batch_acks,
                "consumers": {c: i.to_json() for c, i in self.consumers.items()},
                "joinSeq": self.join_seq,
                "pending": self.pending,
                "redeliver": self.redeliver,
                "dispatched": list(self.dispatched),
                "keySharedMode": _KEY_SHARED_MODE_WIRE[self.key_shared_mode],
                "selector": self.selector,
                "selectorVersion": self.selector_version,
                "properties": self.properties,
                **({"seekEpoch": self.seek_epoch} if self.seek_epoch else {}),
                **envelope.prev_field(self),
            }
        )

    @classmethod
    @jsontext.malformed_is_corrupt("subscription state")
    def decode(cls, raw: bytes, where: str) -> SubscriptionState:
        """Parse and verify a subscription state file.

        Raises
        ------
        CorruptDataError, IncompatibleFormat
        """
        d = envelope.open_framed(raw, "subscription state", where, (STATE_FORMAT,))
        _check_state(d)
        return cls(
            topic=d["topic"],
            name=d["name"],
            sub_type=_TYPES[d["type"]],
            version=d["version"],
            updated_ms=d["updated"],
            commit_id=d["commitId"],
            prev_commit_id=d.get("prevCommitId", ""),
            created_ms=d["created"],
            last_active_ms=d["lastActive"],
            mark_delete=Position(*d["markDelete"]),
            acked=d["acked"],
            batch_acks=d["batchAcks"],
            consumers={c: ConsumerInfo.from_json(c, v) for c, v in d["consumers"].items()},
            join_seq=d["joinSeq"],
            pending=d["pending"],
            redeliver=d["redeliver"],
            dispatched=Position(*d["dispatched"]),
            key_shared_mode=_KEY_SHARED_MODES[d["keySharedMode"]],
            selector=d["selector"],
            selector_version=d["selectorVersion"],
            properties=d.get("properties", {}),
            seek_epoch=d.get("seekEpoch", 0),
        )

    def selector_state(self) -> StickyKeyConsumerSelector:
        """The Key_Shared selector this state holds.

        Raises
        ------
        CorruptDataError
            If the stored selector does not describe one (naming the subscription, topic and
            version).
        """
        assert self.selector is not None
        try:
            return selector_from_dict(self.selector)
        except MALFORMED as e:
            raise self.malformed_selector(e) from e

    def malformed_selector(self, e: Exception) -> CorruptDataError:
        """The error for a stored selector that does not describe one (``e``, what building
        it raised), naming the subscription, topic and version."""
        return CorruptDataError(
            f"subscription state of {self.name!r} on {self.topic}, version {self.version}: "
            f"its Key_Shared selector is malformed: {type(e).__name__} {e}"
        )

    # ------------------------------------------------------------------ cursor
    def is_acked(self, p: Position) -> bool:
        """Whether entry ``p`` is acknowledged (at or before ``mark_delete``, or in a range):
        a binary search of the sorted, disjoint ranges."""
        if p <= self.mark_delete:
            return True
        i = bisect.bisect_right(self.acked, [p[0], p[1], _END, _END]) - 1
        if i < 0:
            return False
        r = self.acked[i]
        return p <= (r[2], r[3])

    def ack(self, p: Position, next_pos: Callable[[Position], Position | None]) -> bool:
        """Acknowledge entry ``p`` and fold ranges into ``mark_delete`` where contiguous.
        Returns whether anything changed (False: already acknowledged)."""
        return self.ack_all((p,), next_pos)

    def ack_all(
        self, ps: Iterable[Position], next_pos: Callable[[Position], Position | None]
    ) -> bool:
        """Acknowledge every entry of ``ps`` (a group of individual acknowledgements), in
        order: each run of consecutive entries not yet acknowledged joins the ranges where it
        falls as one (a binary search; merged with the range before and the one after when
        adjacent), then the ranges that now follow ``mark_delete`` fold into it. The cost of
        a group does not grow with the ranges held (a pass over every range per group did: a
        consumer far behind holds thousands), and a group of consecutive acknowledgements
        (one per message of live traffic) is one insertion, not one per entry. Returns
        whether anything changed."""
        acked = self.acked
        maps = [m for m in (self.batch_acks, self.pending, self.redeliver) if m]
        todo = sorted(ps)
        n = len(todo)
        added = False
        i = 0
        while i < n:
            p = todo[i]
            i += 1
            if self.is_acked(p):
                continue
            pl, pe = p[0], p[1]
            # The run of consecutive entries of ledger pl from pe (duplicates skipped): none of
            # them is acknowledged, since a range cannot start within it (the ranges are
            # disjoint, never adjacent and all after mark_delete; p is in none).
            i0 = bisect.bisect_right(acked, [pl, pe, _END, _END])
            limit = acked[i0][1] if i0 < len(acked) and acked[i0][0] == pl else _END
            qe = pe
            while i < n:
                q = todo[i]
                if q[0] != pl or q[1] > qe + 1 or q[1] >= limit:
                    break
                qe = q[1]
                i += 1
            if maps:
                for e in range(pe, qe + 1):
                    k = f"{pl}:{e}"
                    for m in maps:
                        m.pop(k, None)
            before = acked[i0 - 1] if i0 > 0 else None
            after = acked[i0] if i0 < len(acked) else None
            joins_before = before is not None and _adjacent(before[2], before[3], pl, pe, next_pos)
            joins_after = after is not None and _adjacent(pl, qe, after[0], after[1], next_pos)
            if joins_before and joins_after:
                assert before is not None and after is not None
                acked[i0 - 1] = [before[0], before[1], after[2], after[3]]
                del acked[i0]
            elif joins_before:
                assert before is not None
                acked[i0 - 1] = [before[0], before[1], pl, qe]
            elif joins_after:
                assert after is not None
                acked[i0] = [pl, pe, after[2], after[3]]
            else:
                acked.insert(i0, [pl, pe, pl, qe])
            added = True
        if added:
            self._fold_head(next_pos)
        return added

    def _fold_head(self, next_pos: Callable[[Position], Position | None]) -> None:
        """Fold the first ranges into ``mark_delete`` while they follow it."""
        acked = self.acked
        md = self.mark_delete
        n = 0
        while n < len(acked):
            r = acked[n]
            if (r[0], r[1]) <= md or _adjacent(md[0], md[1], r[0], r[1], next_pos):
                if (r[2], r[3]) > md:
                    md = Position(r[2], r[3])
                n += 1
            else:
                break
        if n:
            self.mark_delete = md
            del acked[:n]

    def ack_range(
        self, a: Position, b: Position, next_pos: Callable[[Position], Position | None]
    ) -> bool:
        """Acknowledge every entry from ``a`` to ``b`` (both existing positions, inclusive);
        returns whether anything changed."""
        if a > b or b <= self.mark_delete:
            return False
        self.acked.append([a[0], a[1], b[0], b[1]])
        self.acked.sort()
        for m in (self.pending, self.redeliver, self.batch_acks):
            for k in [k for k in m if a <= key_pos(k) <= b]:
                del m[k]
        self._normalize(next_pos)
        return True

    def cap_ack_ranges(self, cap: int) -> bool:
        """Keep at most ``cap`` individually acknowledged ranges (Pulsar's
        ``managedLedgerMaxUnackedRangesToPersist``); returns whether any were dropped.

        The ranges farthest from ``mark_delete`` go: their entries count as unacknowledged
        again and are delivered again, as Pulsar redelivers what its persisted cursor lacks.
        Shared dispatch moves back to before the first dropped range (entries pending or due
        for redelivery there are skipped, not claimed twice); ``selector_version`` is bumped so
        Exclusive/Failover consumers restart at the cursor and Key_Shared ones scan again.
        """
        if len(self.acked) <= cap:
            return False
        first = (self.acked[cap][0], self.acked[cap][1])
        del self.acked[cap:]
        if self.dispatched >= first:
            self.dispatched = (
                Position(first[0], first[1] - 1) if first[1] > 0 else Position(first[0] - 1, _END)
            )
        self.selector_version += 1
        return True

    def ack_cumulative(self, p: Position, next_pos: Callable[[Position], Position | None]) -> bool:
        """Acknowledge everything up to ``p``; returns whether anything changed."""
        if p <= self.mark_delete:
            return False
        self.mark_delete = p
        self.acked = [r for r in self.acked if (r[2], r[3]) > p]
        for m in (self.pending, self.redeliver, self.batch_acks):
            for k in [k for k in m if key_pos(k) <= p]:
                del m[k]
        self._normalize(next_pos)
        return True

    def _normalize(self, next_pos: Callable[[Position], Position | None]) -> None:
        """Merge adjacent ranges and fold those that follow ``mark_delete`` into it.

        Entry ids within a ledger are contiguous, so two positions of one ledger are adjacent
        exactly when their ids are; ``next_pos`` (a look into the ledger list) is asked only
        across a ledger boundary."""
        merged: list[list[int]] = []
        md = self.mark_delete
        for r in self.acked:
            if (r[2], r[3]) <= md:
                continue
            if merged:
                last = merged[-1]
                if (r[0], r[1]) <= (last[2], last[3]) or _adjacent(
                    last[2], last[3], r[0], r[1], next_pos
                ):
                    if (r[2], r[3]) > (last[2], last[3]):
                        last[2], last[3] = r[2], r[3]
                    continue
            merged.append(list(r))
        self.acked = merged
        self._fold_head(next_pos)

    def ack_batch_index(
        self, p: Position, index: int, size: int, next_pos: Callable[[Position], Position | None]
    ) -> bool:
        """Acknowledge message ``index`` of batch entry ``p`` holding ``size`` messages;
        returns whether anything changed."""
        if self.is_acked(p):
            return False
        acked = set(self.batch_acks.get(pos_key(p), ()))
        if index in acked:
            return False
        acked.add(index)
        if len(acked) >= size:
            return self.ack(p, next_pos)
        self.batch_acks[pos_key(p)] = sorted(acked)
        return True

    # ------------------------------------------------------------------ consumers
    def live_consumers(self, now: int) -> list[ConsumerInfo]:
        """The consumers whose ``expires_ms`` is after ``now``, in join order: an estimate for
        stats and housekeeping (it trusts the consumers' wall clocks); dispatch decides with
        :meth:`connected` and a :class:`~filepulsar.storage.consumer_leases.LeaseWatch` instead."""
        return sorted(
            (c for c in self.consumers.values() if c.expires_ms > now), key=lambda c: c.joined
        )

    def connected(self, lapsed: Collection[str] = ()) -> list[ConsumerInfo]:
        """The registered consumers but those in ``lapsed`` (ids), in join order."""
        return sorted(
            (c for c in self.consumers.values() if c.cid not in lapsed), key=lambda c: c.joined
        )

    def purge(self, lapsed: Collection[str], now: int, keep: str | None = None) -> None:
        """Drop the consumers in ``lapsed`` (ids whose lease an observer judged lapsed) but
        ``keep`` (the committing consumer itself, which renews instead); their pending
        entries are redelivered from ``now``."""
        for cid in [c for c in self.consumers if c in lapsed and c != keep]:
            self.remove_consumer(cid, now)

    def seek(self, md: Position) -> None:
        """Move the cursor to ``md`` and forget acknowledgement holes and deliveries in flight,
        as Pulsar's seek and reset-cursor do. ``selector_version`` grows, so that connected
        consumers (Key_Shared ones rescan; Exclusive and Failover ones re-read from the cursor)
        follow the reset; ``seek_epoch`` grows too, so that every consumer of the
        subscription, in any process, drops what it holds and was handed out before (Pulsar
        disconnects them all: they clear their receiver queues and get everything after
        ``md`` again)."""
        self.mark_delete = md
        self.dispatched = md
        self.acked = []
        self.batch_acks = {}
        self.pending = {}
        self.redeliver = {}
        self.selector_version += 1
        self.seek_epoch += 1

    def remove_consumer(self, cid: str, now: int) -> None:
        info = self.consumers.pop(cid, None)
        if info is None:
            return
        for k in [k for k, v in self.pending.items() if v[0] == cid]:
            _, count, slot = self.pending.pop(k)
            self.redeliver[k] = [count + 1, now, slot]
        if self.sub_type is ConsumerType.KeyShared and self.selector is not None:
            sel = self.selector_state()
            _selector_remove(sel, info.sel_id)
            self.selector = sel.to_dict()
            self.selector_version += 1
        self.last_active_ms = now


def prev_position(mstate: ManifestState, p: Position) -> Position | None:
    """The entry before ``p`` in the managed ledger (None if ``p`` is the first)."""
    if p[1] > 0:
        return Position(p[0], p[1] - 1)
    prev: Position | None = None
    for lg in mstate.ledgers:
        if lg.ledger_id >= p[0]:
            break
        if lg.entries:
            prev = Position(lg.ledger_id, lg.entries - 1)
    return prev
