"""The producer's send queue: open batches, sealing them into entries (compression, chunking,
key batches) and the background I/O thread that writes the queued entries with one group commit
per partition and answers their callbacks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from filepulsar.dispatch.clock import SYSTEM
from filepulsar.storage.codec import Codec
from filepulsar.storage.commit import PendingEntry
from filepulsar.storage.entry import MESSAGE_SCHEMA, ChunkInfo
from filepulsar.storage.entry_encode import encode_entry_parts, encode_value_entry_parts
from filepulsar.storage.errors import (
    FilePulsarError,
    ProducerClosed,
    ProducerFenced,
)
from filepulsar.storage.ledger import Position
from filepulsar.storage.messageid import DUPLICATE_MESSAGE_ID, MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import Policies
from filepulsar.storage.producer_messages import Result, _binary_array, _int64_array

if TYPE_CHECKING:
    from filepulsar.storage.producer_leases import _Partition

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Batch:
    """Messages collected for one entry."""

    created_ms: int
    first_seq: int
    #: ``SYSTEM.monotonic()`` when the batch was opened: the publish delay counts from here
    #: (the injectable clock gives publish times only; it need not advance).
    opened: float = field(default_factory=SYSTEM.monotonic)
    values: list[Any] = field(default_factory=list)
    callbacks: list[Any] | None = None
    extras: list[tuple[int, Any, Any, Any, Any]] | None = None  # i, props, key, ordering key, evt
    nbytes: int = 0
    # None while message i has sequence id first_seq + i; the explicit list once not.
    seqs: list[int] | None = None

    def add_seq(self, seq: int) -> None:
        """Record the sequence id of the message about to be appended."""
        if self.seqs is None:
            if seq == self.first_seq + len(self.values):
                return
            self.seqs = list(range(self.first_seq, self.first_seq + len(self.values)))
        self.seqs.append(seq)


@dataclass(slots=True)
class _Queued:
    """A sealed entry waiting for the I/O thread, with its callbacks."""

    entry: PendingEntry
    batched: bool
    callbacks: list[Any] | None
    ticket: int
    follows_previous: bool = False
    want_position: bool = False
    nbytes: int = 0
    #: Sealed by a ``send()`` that will write it itself (or hand it over): the I/O thread
    #: leaves a queue whose first entry is claimed alone.
    claimed: bool = False


class _SendQueueMixin:
    """Sealing and the I/O thread (part of :class:`Producer`)."""

    # Set by Producer.__init__; declared here for mypy only.
    _clock: Callable[[], int]
    _closed: bool
    _cond: threading.Condition
    _done_set: set[int]
    _done_upto: int
    _error: BaseException | None
    _last_renew: float
    _io_untimed: bool
    _inline: threading.local
    _lock: threading.Lock
    _parts: list[_Partition]
    _pending_bytes: int
    _positions: dict[int, Position | None]
    _tickets_issued: int
    _write_lock: threading.Lock
    codec: Codec
    dedup: bool
    policies: Policies
    producer_name: str
    publish_delay_ms: int
    schema_version: bytes
    topic: TopicName

    if TYPE_CHECKING:  # methods of the other Producer parts

        @staticmethod
        def _append(
            b: _Batch, content: bytes | None, callback: Any, extras: tuple, i: int
        ) -> None: ...

    # ------------------------------------------------------------------ sealing (lock held)
    def _columns(self, b: _Batch) -> tuple[pa.RecordBatch, int | None]:
        """The stored columns of a batch, and its first sequence id if they are contiguous
        (then no sequence_id column is stored)."""
        n = len(b.values)
        cols = [_binary_array(b.values)]
        names = ["value"]
        first_seq = b.first_seq if b.seqs is None else None
        if not b.extras and first_seq is not None:
            return pa.RecordBatch.from_arrays(cols, names=names), first_seq
        props: list[Any] = [None] * n
        keys: list[Any] = [None] * n
        okeys: list[Any] = [None] * n
        evts: list[Any] = [None] * n
        for i, p, k, ok, evt in b.extras or ():
            props[i], keys[i], okeys[i], evts[i] = p, k, ok, evt
        for name, vals in (
            ("key", keys),
            ("ordering_key", okeys),
            ("properties", props),
            ("event_time", evts),
        ):
            if all(v is None for v in vals):
                continue
            typ = MESSAGE_SCHEMA.field(name).type
            if name == "properties":
                vals = [list(v.items()) if v is not None else None for v in vals]
                cols.append(pa.array(vals, typ))
            elif name == "event_time":
                cols.append(_int64_array(vals))
            else:
                cols.append(_binary_array(vals, typ))
            names.append(name)
        if b.seqs is not None:
            cols.append(_int64_array(b.seqs))
            names.append("sequence_id")
        schema = pa.schema([MESSAGE_SCHEMA.field(nm) for nm in names])
        return pa.RecordBatch.from_arrays(cols, schema=schema), first_seq

    def _seal(
        self, part: _Partition, b: _Batch, bkey: Any, *, batched: bool = True, deliver_at: int = 0
    ) -> None:
        key_based = False
        if part.batch is b:
            part.batch = None
        elif part.key_batches.get(bkey) is b:
            part.key_batches.pop(bkey)
            key_based = True
        if b.seqs is None:
            first, hi = b.first_seq, b.first_seq + len(b.values) - 1
        else:
            first, hi = b.seqs[0], max(b.seqs)
        if key_based:
            first = hi
        try:
            value = b.values[0]
            data = None
            if len(b.values) == 1 and type(value) is bytes and not b.extras and not key_based:
                # One plain message (every unbatched send): no record batch to build.
                data = encode_value_entry_parts(
                    value,
                    producer_name=self.producer_name,
                    publish_time=b.created_ms,
                    sequence_id=first,
                    codec=self.codec,
                    batched=batched,
                    schema_version=self.schema_version,
                    deliver_at=deliver_at,
                )
            if data is None:
                rb, first_seq = self._columns(b)
                data = encode_entry_parts(
                    rb,
                    producer_name=self.producer_name,
                    publish_time=b.created_ms,
                    codec=self.codec,
                    batched=batched,
                    schema_version=self.schema_version,
                    deliver_at=deliver_at,
                    first_sequence_id=first_seq,
                    header_sequence_id=hi if key_based else None,
                )
        except Exception as e:  # the batch is out of every queue: answer its senders here
            err = FilePulsarError(f"cannot encode an entry for {self.topic}: {e}")
            self._answer([b.callbacks], err)
            self._pending_bytes -= b.nbytes or sum(len(v) for v in b.values if v is not None)
            raise err from e
        self._enqueue(
            part,
            PendingEntry.of(data, len(b.values), b.created_ms, self.producer_name, first, hi),
            batched,
            b.callbacks,
            b.nbytes or sum(len(v) for v in b.values if v is not None),
        )

    def _queue_chunks(
        self,
        part: _Partition,
        content: bytes,
        extras: tuple,
        seq: int,
        callback: Any,
        step: int,
    ) -> None:
        size = len(content)
        num = (size + step - 1) // step
        uuid = f"{self.producer_name}-{seq}"
        now = self._clock()
        props, key, okey, evt = extras
        for cid in range(num):
            piece = content[cid * step : (cid + 1) * step]
            b = _Batch(now, seq)
            self._append(b, piece, callback if cid == num - 1 else None, (props, key, okey, evt), 0)
            try:
                rb, first_seq = self._columns(b)
                data = encode_entry_parts(
                    rb,
                    producer_name=self.producer_name,
                    publish_time=now,
                    codec=self.codec,
                    batched=False,
                    schema_version=self.schema_version,
                    chunk=ChunkInfo(uuid, cid, num, size),
                    first_sequence_id=first_seq,
                )
            except Exception as e:
                err = FilePulsarError(f"cannot encode chunk {cid} for {self.topic}: {e}")
                self._answer([[callback]], err)
                self._pending_bytes -= size
                raise err from e
            self._enqueue(
                part,
                PendingEntry.of(data, 1, now, self.producer_name, seq, seq),
                False,
                b.callbacks,
                len(piece) if cid == num - 1 else 0,
                follows_previous=cid > 0,
            )
        self._pending_bytes -= size - len(content[(num - 1) * step :])

    def _enqueue(
        self,
        part: _Partition,
        entry: PendingEntry,
        batched: bool,
        callbacks: list[Any] | None,
        nbytes: int,
        *,
        follows_previous: bool = False,
        want_position: bool = False,
    ) -> None:
        self._tickets_issued += 1
        q = _Queued(
            entry, batched, callbacks, self._tickets_issued, follows_previous, want_position, nbytes
        )
        if getattr(self._inline, "on", False):
            q.claimed = True  # send() writes it, or hands it to the I/O thread and wakes it
        else:
            self._cond.notify_all()
        part.queue.append(q)

    def _batch_opened(self) -> None:
        """Under ``_lock``, when a batch opens: wake the I/O thread only if it sleeps with no
        batch to time (otherwise it looks at every open batch before it sleeps again), and
        never for a ``send()``'s own batch, which that ``send()`` seals and writes itself."""
        if self._io_untimed and not getattr(self._inline, "on", False):
            self._cond.notify_all()

    def _seal_all(self, older_than_ms: int | None = None) -> None:
        for part in self._parts:
            b = part.batch
            if b is not None and (older_than_ms is None or b.created_ms <= older_than_ms):
                self._seal(part, b, None)
            if part.key_batches and (
                older_than_ms is None
                or min(kb.created_ms for kb in part.key_batches.values()) <= older_than_ms
            ):
                self._seal_keys(part)

    def _seal_keys(self, part: _Partition) -> None:
        """Seal every key batch of ``part`` in order of their highest sequence id.

        With ``header_sequence_id`` = highest, that order lets Pulsar's dedup accept every
        key batch although their sequence ids interleave.
        """

        def highest(item: tuple[Any, _Batch]) -> int:
            b = item[1]
            return max(b.seqs) if b.seqs else b.first_seq + len(b.values) - 1

        for k, kb in sorted(part.key_batches.items(), key=highest):
            self._seal(part, kb, k)
        part.key_count = part.key_bytes = 0

    # ------------------------------------------------------------------ I/O thread
    def _io_loop(self) -> None:
        try:
            self._io_run()
        except BaseException as e:  # the thread ends: no pending sender may wait forever
            log.exception("producer %s I/O thread failed", self.producer_name)
            self._fail_pending(e)

    def _next_due(self) -> float | None:
        """Monotonic time the oldest open batch reaches its publish delay (None: none open)."""
        due: float | None = None
        for p in self._parts:
            b = p.batch
            if b is not None and (due is None or b.opened < due):
                due = b.opened
            for kb in p.key_batches.values():
                if due is None or kb.opened < due:
                    due = kb.opened
        return None if due is None else due + self.publish_delay_ms / 1000

    def _io_run(self) -> None:
        renew_s = self.policies.producer_lease_ms / 3000
        delay_s = self.publish_delay_ms / 1000
        while True:
            with self._lock:
                # Woken by every sealed entry, and by a new batch when none was open; otherwise
                # sleeps until the oldest open batch is due or the leases need renewing.
                while not any(p.queue and not p.queue[0].claimed for p in self._parts):
                    if self._closed:
                        return
                    now = SYSTEM.monotonic()
                    due = self._next_due()
                    if due is not None and due <= now:
                        self._seal_opened_before(now - delay_s)
                        continue
                    renew_at = self._last_renew + renew_s
                    if renew_at <= now:
                        break
                    self._io_untimed = due is None
                    self._cond.wait((renew_at if due is None else min(due, renew_at)) - now)
                    self._io_untimed = False
                has_work = any(p.queue and not p.queue[0].claimed for p in self._parts)
            if not has_work:
                self._renew_if_due()
                continue
            with self._write_lock:
                with self._lock:
                    work = [(p, p.queue) for p in self._parts if p.queue and not p.queue[0].claimed]
                    for p, _ in work:
                        p.queue = []
                for part, queued in work:
                    self._write(part, queued)

    def _seal_opened_before(self, when: float) -> None:
        for part in self._parts:
            b = part.batch
            if b is not None and b.opened <= when:
                self._seal(part, b, None)
            if part.key_batches and min(kb.opened for kb in part.key_batches.values()) <= when:
                self._seal_keys(part)

    def _fail_pending(self, e: BaseException) -> None:
        """Answer every message not yet stored with an error (queued and open batches)."""
        err = (
            e
            if isinstance(e, FilePulsarError)
            else FilePulsarError(f"producer {self.producer_name!r} on {self.topic} failed: {e!r}")
        )
        with self._lock:
            if self._error is None and not isinstance(err, ProducerClosed):
                self._error = err
            queued: list[_Queued] = []
            batches: list[_Batch] = []
            for p in self._parts:
                queued.extend(p.queue)
                p.queue = []
                if p.batch is not None:
                    batches.append(p.batch)
                    p.batch = None
                batches.extend(p.key_batches.values())
                p.key_batches.clear()
                p.key_count = p.key_bytes = 0
            for q in queued:
                self._pending_bytes -= q.nbytes
                self._mark_done(q.ticket)
            for b in batches:
                self._pending_bytes -= b.nbytes
            self._cond.notify_all()
        self._answer([q.callbacks for q in queued] + [b.callbacks for b in batches], err)

    @staticmethod
    def _answer(callback_lists: list[list[Any] | None], e: BaseException) -> None:
        result = Result.ProducerFenced if isinstance(e, ProducerFenced) else Result.UnknownError
        if isinstance(e, ProducerClosed):
            result = Result.AlreadyClosed
        for cbs in callback_lists:
            for cb in cbs or ():
                if cb is not None:
                    try:
                        cb(result, None)
                    except BaseException:  # a user callback must not stop the others
                        log.exception("send_async callback raised")

    def _renew_if_due(self) -> None:
        if SYSTEM.monotonic() - self._last_renew < self.policies.producer_lease_ms / 3000:
            return
        self._last_renew = SYSTEM.monotonic()
        for p in self._parts:
            try:
                p.writer.renew_lease()
            except FilePulsarError as e:
                self._fail(e)
                return

    def _write(self, part: _Partition, queued: list[_Queued]) -> None:
        try:
            positions = part.writer.append(
                [q.entry for q in queued],
                dedup=self.dedup,
                follows=[q.follows_previous for q in queued],
            )
        except BaseException as e:  # reported to every waiting sender
            self._fail(e, queued)
            return
        self._last_renew = SYSTEM.monotonic()
        pidx = part.ml.partition
        part.last_published = max(
            part.last_published, max(q.entry.highest_sequence_id for q in queued)
        )
        for q, pos in zip(queued, positions):
            cbs = q.callbacks
            if cbs is None:
                continue
            for i, cb in enumerate(cbs):
                if cb is None:
                    continue
                mid = self._message_id(pos, pidx, i if q.batched else -1)
                try:
                    cb(Result.Ok, mid)
                except BaseException:  # a user callback must not kill the I/O thread
                    log.exception("send_async callback raised")
        with self._lock:
            for q, pos in zip(queued, positions):
                self._pending_bytes -= q.nbytes
                if q.want_position:
                    self._positions[q.ticket] = pos
                self._mark_done(q.ticket)
            self._cond.notify_all()

    @staticmethod
    def _message_id(pos: Position | None, partition: int, batch_index: int) -> MessageId:
        if pos is None:
            return DUPLICATE_MESSAGE_ID
        return MessageId(partition, pos.ledger_id, pos.entry_id, batch_index)

    def _mark_done(self, ticket: int) -> None:
        self._done_set.add(ticket)
        while self._done_upto + 1 in self._done_set:
            self._done_upto += 1
            self._done_set.discard(self._done_upto)

    def _fail(self, e: BaseException, queued: list[_Queued] | None = None) -> None:
        if not isinstance(e, FilePulsarError):
            e = FilePulsarError(f"write to {self.topic} failed: {e!r}").with_traceback(
                e.__traceback__
            )
        self._answer([q.callbacks for q in queued or ()], e)
        with self._lock:
            self._error = e
            for q in queued or []:
                self._pending_bytes -= q.nbytes
                self._mark_done(q.ticket)
            self._cond.notify_all()
