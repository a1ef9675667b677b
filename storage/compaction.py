"""Topic compaction: the latest message of every key, kept apart from the topic's ledgers.

Pulsar's compaction reads a topic up to a *horizon* (its last message when the run starts) and
keeps, for every key, only the newest message; a message with a null value removes its key
(a tombstone, itself not kept); messages without a key are not kept (Pulsar >= 3.2's default,
``topicCompactionRetainNullKey=false``). A consumer or reader with ``is_read_compacted=True``
that starts at or before the horizon reads this compacted view first, then the topic after the
horizon. Messages keep their ids. Compaction runs per managed ledger (each partition on its
own), on demand (``Admin.topics().trigger_compaction``, ``filepulsar topics compact``).

Stored form (FORMAT.md, "Compaction"), in the managed ledger's folder:

- ``compaction/data/<id>.entries``: the entries holding kept messages, copied byte for byte
  from the topic (same header, payload and CRC), back to back;
- ``compaction/data/<id>.index``: a framed JSON list ``[[ledger, entry, offset, length,
  [obscured batch indexes]], ...]`` in position order: where each entry lies in the data blob
  and which of its messages are not part of the view (older values, tombstones, keyless);
- ``compaction/state/<version>.json``: the current view (horizon, blob id, incarnation),
  committed with the same versioned protocol as the manifest.

A run also moves the durable subscription ``__compaction``'s cursor to the horizon (as Pulsar's
compactor cursor), so retention keeps the messages after the horizon until the next run sees
them; before the horizon the view holds what readers need. A view's blobs are deleted two runs
later (a reader still on them reloads the newest view and goes on from where it was).
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore import BlobNotFound
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.entry import EntryFormatError, iter_entries
from filepulsar.storage.entry_encode import reframe_entry
from filepulsar.storage.errors import (
    CorruptDataError,
    FilePulsarError,
    InvalidConfiguration,
)
from filepulsar.storage.fragments import BLOB_ID
from filepulsar.storage.ledger import EARLIEST, ManagedLedger, Position, ReadEntry
from filepulsar.storage.names import TopicName
from filepulsar.storage.versioned import Abort, VersionedStore, envelope

#: The durable subscription whose cursor marks the compaction horizon (Pulsar's name).
COMPACTION_SUBSCRIPTION = "__compaction"
STATE_FORMAT = 1


#: Kept for callers: the folder is :func:`filepulsar.storage.paths.compaction_dir`.
compaction_dir = paths.compaction_dir


@dataclass(slots=True)
class CompactionState:
    """The current compacted view of one managed ledger (``blob`` empty: none yet)."""

    topic: str
    version: int = 0
    updated_ms: int = 0
    commit_id: str = ""
    prev_commit_id: str = ""
    incarnation: str = ""
    horizon: Position = EARLIEST
    blob: str = ""
    entries: int = 0
    messages: int = 0
    #: Blob ids of earlier views, deleted once two newer views exist.
    retired: list[str] = field(default_factory=list)

    def encode(self) -> bytes:
        return envelope.encode(
            {
                "format": STATE_FORMAT,
                "topic": self.topic,
                "version": self.version,
                "updated": self.updated_ms,
                "commitId": self.commit_id,
                **envelope.prev_field(self),
                "incarnation": self.incarnation,
                "horizon": list(self.horizon),
                "blob": self.blob,
                "entries": self.entries,
                "messages": self.messages,
                "retired": self.retired,
            },
            sort_keys=True,
        )

    @classmethod
    @jsontext.malformed_is_corrupt("compaction state")
    def decode(cls, raw: bytes, where: str) -> CompactionState:
        d = envelope.open_framed(raw, "compaction state", where, (STATE_FORMAT,))
        envelope.check_stamp(d)
        blob, retired = d["blob"], d["retired"]
        if type(retired) is not list:
            raise ValueError(f"'retired' is not a list of blob ids: {retired!r:.80}")
        for b in [blob, *retired]:
            if type(b) is not str or (b and not BLOB_ID.fullmatch(b)):
                raise ValueError(f"blob id {b!r:.80} is not a valid name")
        return cls(
            topic=d["topic"],
            version=d["version"],
            updated_ms=d["updated"],
            commit_id=d["commitId"],
            prev_commit_id=d.get("prevCommitId", ""),
            incarnation=d["incarnation"],
            horizon=Position(int(d["horizon"][0]), int(d["horizon"][1])),
            blob=d["blob"],
            entries=int(d["entries"]),
            messages=int(d["messages"]),
            retired=list(d["retired"]),
        )


class _NeverCompacted(FilePulsarError):
    """The managed ledger has no compaction state yet."""


def _store(store: BlobStore, topic: TopicName) -> VersionedStore[CompactionState]:
    return VersionedStore(
        store,
        paths.compaction_state_dir(topic),
        CompactionState.decode,
        what=f"compaction of {topic}",
        not_found=_NeverCompacted,
    )


@dataclass(frozen=True, slots=True)
class ViewEntry:
    """One entry of a compacted view: where it was in the topic, where its copy is, and which
    of its messages (batch indexes) are not part of the view."""

    position: Position
    offset: int
    length: int
    obscured: frozenset[int]


class CompactedView:
    """A loaded compacted view of one managed ledger: the horizon and the kept entries.

    :meth:`entries_after` reads the copies (verified as any entry) lazily, in order.
    """

    def __init__(
        self, store: BlobStore, topic: TopicName, state: CompactionState, index: list[ViewEntry]
    ) -> None:
        self.store = store
        self.topic = topic
        self.state = state
        self.horizon = state.horizon
        self.index = index
        self.positions = [ve.position for ve in index]

    @property
    def data_key(self) -> str:
        return paths.compaction_blob(self.topic, self.state.blob, paths.DATA_SUFFIX)

    def entries_after(
        self, position: Position, *, inclusive: bool = False
    ) -> Iterator[tuple[ReadEntry, frozenset[int]]]:
        """The view's entries after ``position`` (or at it, ``inclusive``), with the batch
        indexes each hides.

        Raises
        ------
        BlobNotFound
            If the view was replaced and deleted meanwhile (load the newest view again).
        CorruptDataError
            Naming the blob and the entry's topic position, if a copy fails verification.
        """
        for ve in self.index:
            if ve.position < position or (ve.position == position and not inclusive):
                continue
            yield self.read(ve), ve.obscured

    def read(self, ve: ViewEntry) -> ReadEntry:
        data = self.store.get_range(self.data_key, ve.offset, ve.offset + ve.length)
        try:
            raw = next(iter_entries(data, 1, ve.offset))
        except EntryFormatError as e:
            raise CorruptDataError(
                f"corrupt compacted entry of {self.topic} (ledger {ve.position[0]}, entry "
                f"{ve.position[1]}) in {self.store.url(self.data_key)}: {e}",
                topic=str(self.topic),
                ledger_id=ve.position[0],
                entry_id=ve.position[1],
            ) from e
        return ReadEntry(ve.position[0], ve.position[1], raw, str(self.topic))

    def _find(self, position: Position) -> int:
        """The index of ``position`` in the view, or -1."""
        i = bisect.bisect_left(self.positions, position)
        return i if i < len(self.positions) and self.positions[i] == position else -1

    def entry_at(self, position: Position) -> tuple[ReadEntry, frozenset[int]] | None:
        i = self._find(position)
        if i < 0:
            return None
        ve = self.index[i]
        return self.read(ve), ve.obscured

    def gap_before(self, position: Position) -> Position | None:
        """The position of the view entry before ``position`` (EARLIEST's for the first);
        None if ``position`` is not in the view. Every topic entry strictly between the two is
        wholly obscured: acknowledging a view message may acknowledge them too."""
        i = self._find(position)
        if i < 0:
            return None
        return self.positions[i - 1] if i else EARLIEST


def load_view(store: BlobStore, topic: TopicName, incarnation: str) -> CompactedView | None:
    """The current compacted view of ``topic`` (a managed ledger), or None if it has none or
    it belongs to an earlier incarnation of the topic."""
    vs = _store(store, topic)
    try:
        state = vs.latest()
    except _NeverCompacted:
        return None
    if not state.blob or (incarnation and state.incarnation != incarnation):
        return None
    key = paths.compaction_blob(topic, state.blob, paths.INDEX_SUFFIX)
    raw = store.get(key)
    rows = jsontext.decode_framed(raw, f"compaction index {store.url(key)}")
    try:
        if type(rows) is not list:
            raise TypeError(f"a {type(rows).__name__}, not a list")
        for r in rows:
            if not (
                type(r) is list
                and len(r) == 5
                and all(type(x) is int and 0 <= x < 1 << 63 for x in r[:4])
                and type(r[4]) is list
                and all(type(x) is int and 0 <= x < 1 << 31 for x in r[4])
            ):
                raise ValueError(f"an entry is {r!r:.80}")
        index = [ViewEntry(Position(r[0], r[1]), r[2], r[3], frozenset(r[4])) for r in rows]
    except (TypeError, ValueError, IndexError) as e:
        raise CorruptDataError(f"compaction index {store.url(key)} is malformed: {e}") from e
    return CompactedView(store, topic, state, index)


@dataclass
class CompactionReport:
    """What one compaction run did on one managed ledger."""

    topic: str
    horizon: Position
    keys: int
    entries: int
    messages_read: int
    skipped: bool = False
    reason: str = ""


def _rows(e: ReadEntry) -> list[tuple[int, str | None, bool]]:
    """(batch index, key, value is null) of every message of an entry."""
    t = e.messages()
    keys = t.column("key").to_pylist()
    nulls = t.column("value").is_null().to_pylist()
    batched = e.header.batched
    return [(i if batched else -1, k, n) for i, (k, n) in enumerate(zip(keys, nulls))]


def compact(
    store: BlobStore,
    topic: TopicName | str,
    *,
    clock: Callable[[], int] | None = None,
) -> CompactionReport:
    """Compact one managed ledger (a non-partitioned topic or one partition) up to its last
    message now; see the module docstring. Safe to run concurrently: the later horizon wins,
    the other run's blobs become orphans that a later run or the orphan sweep deletes.

    Raises
    ------
    InvalidConfiguration
        For a non-persistent topic (Pulsar compacts persistent topics only).
    TopicNotFound, DataLossError, CorruptDataError
        From reading the topic.
    """
    t = TopicName.parse(str(topic))
    if not t.persistent:
        raise InvalidConfiguration(f"only persistent topics can be compacted, not {t}")
    ml = ManagedLedger(store, t, clock=clock)
    mstate = ml.state()
    horizon = mstate.last_position()
    prev = load_view(store, t, mstate.incarnation)
    if horizon == EARLIEST:
        return CompactionReport(str(t), horizon, 0, 0, 0, True, "the topic has no messages")
    if prev is not None and prev.horizon >= horizon:
        return CompactionReport(
            str(t), prev.horizon, 0, prev.state.entries, 0, True, "already compacted up to here"
        )
    hpos = horizon

    def sources() -> Iterator[tuple[ReadEntry, frozenset[int]]]:
        start = EARLIEST
        if prev is not None:
            yield from prev.entries_after(EARLIEST)
            start = prev.horizon
        first = ml.next_position(mstate, start)
        if first is None or first > hpos:
            return
        if first.ledger_id < mstate.trimmed_before:
            first = ml.next_position(mstate, Position(mstate.trimmed_before, -1)) or first
        for e in ml.iter_entries(mstate, first, end=hpos):
            yield e, frozenset()

    # Pass 1: the newest message of every key (a chunked message counts at its last chunk and
    # keeps all its chunks).
    latest: dict[str, list[tuple[Position, int]]] = {}
    chunks: dict[str, list[tuple[Position, int]]] = {}
    read = 0
    for e, obscured in sources():
        pos = e.position
        c = e.header.chunk
        for idx, key, is_null in _rows(e):
            if idx in obscured:
                continue
            read += 1
            if c is not None:
                pieces = chunks.setdefault(c.uuid, [])
                pieces.append((pos, idx))
                if c.chunk_id < c.num_chunks - 1:
                    continue
                kept = chunks.pop(c.uuid)
            else:
                kept = [(pos, idx)]
            if key is None:
                continue
            if is_null:
                latest.pop(key, None)
            else:
                latest[key] = kept
    keep: dict[Position, set[int]] = {}
    for kept in latest.values():
        for pos, idx in kept:
            keep.setdefault(pos, set()).add(idx)

    # Pass 2: copy the entries holding kept messages.
    parts: list[Any] = []
    index: list[list[Any]] = []
    offset = 0
    messages = 0
    for e, _ in sources():
        pos = e.position
        mine = keep.get(pos)
        if not mine:
            continue
        framed = reframe_entry(e.raw)
        length = sum(len(p) for p in framed)
        h = e.header
        every = set(range(h.num_messages)) if h.batched else {-1}
        index.append([pos[0], pos[1], offset, length, sorted(every - mine)])
        parts.extend(framed)
        offset += length
        messages += len(mine)
    blob = uuid.uuid4().hex
    if index:
        store.put_if_absent(
            paths.compaction_blob(t, blob, paths.DATA_SUFFIX), b"".join(bytes(p) for p in parts)
        )
    store.put_if_absent(
        paths.compaction_blob(t, blob, paths.INDEX_SUFFIX), jsontext.encode_framed(index)
    )

    vs = _store(store, t)
    now = (clock or ml.clock)()
    vs.create(CompactionState(topic=str(t), incarnation=mstate.incarnation, updated_ms=now))

    def change(s: CompactionState) -> list[str]:
        if s.incarnation == mstate.incarnation and s.horizon >= horizon:
            raise Abort([blob])  # someone compacted as far or further: ours is an orphan
        old = [b for b in s.retired if b]
        s.retired = [s.blob] if s.blob else []
        s.incarnation = mstate.incarnation
        s.horizon = horizon
        s.blob = blob
        s.entries = len(index)
        s.messages = messages
        return old

    _, to_delete = vs.commit(change)
    for b in to_delete:
        for suffix in (paths.DATA_SUFFIX, paths.INDEX_SUFFIX):
            try:
                store.delete(paths.compaction_blob(t, b, suffix))
            except BlobNotFound:
                pass
    if to_delete == [blob]:
        return CompactionReport(str(t), horizon, 0, 0, read, True, "a concurrent run won")
    _hold_horizon(store, t, ml, horizon, clock)
    return CompactionReport(str(t), horizon, len(latest), len(index), read)


def _hold_horizon(
    store: BlobStore,
    topic: TopicName,
    ml: ManagedLedger,
    horizon: Position,
    clock: Callable[[], int] | None,
) -> None:
    """Move the ``__compaction`` cursor to the horizon (created at the earliest position)."""
    from filepulsar.storage.subscriptions import (
        SubscriptionStore,
        ensure_subscription,
    )

    ensure_subscription(store, topic, COMPACTION_SUBSCRIPTION, sub_type="Exclusive", clock=clock)
    sub = SubscriptionStore(store, topic, COMPACTION_SUBSCRIPTION, clock=clock)
    mstate = ml.state()

    def nxt(p: Position) -> Position | None:
        return ml.next_position(mstate, p)

    sub.commit(lambda s: s.ack_cumulative(horizon, nxt))


def describe(store: BlobStore, topic: TopicName) -> dict[str, Any]:
    """The current view as pulsar-admin's compaction status shows it (for stats)."""
    ml = ManagedLedger(store, topic)
    view = load_view(store, topic, ml.state().incarnation)
    if view is None:
        return {"status": "NOT_RUN"}
    return {
        "status": "SUCCESS",
        "horizon": "{}:{}".format(*view.horizon),
        "entries": view.state.entries,
        "messages": view.state.messages,
        "lastRunMs": view.state.updated_ms,
    }


__all__ = [
    "COMPACTION_SUBSCRIPTION",
    "CompactedView",
    "CompactionReport",
    "CompactionState",
    "compact",
    "describe",
    "load_view",
]
