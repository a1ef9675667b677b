"""The producer's send queue: everything between ``send_async`` and its callback.

One :class:`SendQueue` per producer owns, behind its own lock:

1. a lane per partition: its open batches (one, or one per key with ``KeyBased`` batching),
   its sealed entries waiting to be written, its next sequence id and its highest stored one;
2. the tickets that tell ``flush`` and ``send`` when what they queued is stored, the bytes
   pending against ``max_pending_bytes``, and the error that stopped the queue;
3. sealing (compression, chunking, key batches in highest-sequence-id order) into
   :class:`~filepulsar.storage.commit.PendingEntry` values;
4. what the process's producer I/O thread (:mod:`filepulsar.storage.producer.io_thread`,
   one for every producer) does for it: seal a batch once it is
   ``batching_max_publish_delay_ms`` old (:meth:`SendQueue.seal_due`), write every sealed
   entry of a lane with one group commit
   (:meth:`filepulsar.storage.writer.LedgerWriter.append`, :meth:`SendQueue.take_ready`,
   :class:`ReadyWrite`; the thread runs the lanes' commits at once),
   answer the callbacks (from that thread, as pulsar-client does) and renew the producer's
   leases that no commit renewed (:meth:`SendQueue.renew_due`).

The facade (:class:`filepulsar.storage.producer.Producer`) checks arguments and routes; the
queue never sees a message it must refuse for its shape.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from filepulsar.dispatch.clock import SYSTEM
from filepulsar.storage import batcher
from filepulsar.storage.codec import Codec
from filepulsar.storage.commit import PendingEntry
from filepulsar.storage.entry import MESSAGE_SCHEMA
from filepulsar.storage.entry_encode import encode_entry_parts, encode_value_entry_parts
from filepulsar.storage.errors import (
    FilePulsarError,
    ProducerClosed,
    ProducerFenced,
    ProducerQueueIsFull,
)
from filepulsar.storage.ledger import Position
from filepulsar.storage.messageid import DUPLICATE_MESSAGE_ID, MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.producer.io_thread import ProducerIo, shared_io
from filepulsar.storage.producer.leases import Partition
from filepulsar.storage.producer.messages import (
    MessageRecord,
    Result,
    binary_array,
    int64_array,
)

log = logging.getLogger(__name__)

#: A ``send_async`` callback: ``callback(result, message_id)``.
Callback = Callable[[Result, MessageId | None], None]


@dataclass(frozen=True, kw_only=True)
class QueueConfig:
    """The producer's settings the send queue works by (checked by the facade)."""

    topic: TopicName
    producer_name: str
    codec: Codec
    #: One open batch per key (``KeyBased`` batching) instead of one per partition.
    key_based: bool
    max_messages: int
    max_bytes: int
    publish_delay_ms: float
    max_pending_bytes: int
    block_if_queue_full: bool
    dedup: bool
    #: Seconds after which the I/O thread renews a partition's lease that no commit renewed.
    renew_s: float
    #: The largest message (the cutter's rule, ``batcher.too_big``); chunks are cut to it.
    max_message_size: int


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
    #: ``(i, record)`` for each message that stores more than its value.
    extras: list[tuple[int, MessageRecord]] | None = None
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

    def append(self, content: bytes | None, callback: Any, record: MessageRecord | None) -> None:
        """Append one message (``record`` None or plain: its entry stores only the value)."""
        i = len(self.values)
        self.values.append(content)
        if callback is not None and self.callbacks is None:
            self.callbacks = [None] * i
        if self.callbacks is not None:
            self.callbacks.append(callback)
        if record is not None and not record.plain:
            if self.extras is None:
                self.extras = []
            self.extras.append((i, record))

    def highest(self) -> int:
        return max(self.seqs) if self.seqs else self.first_seq + len(self.values) - 1

    def byte_count(self) -> int:
        return self.nbytes or sum(len(v) for v in self.values if v is not None)


def message_row(record: MessageRecord) -> pa.RecordBatch:
    """The stored columns of ``record`` sent on its own, without a ``sequence_id`` column
    (what its entry stores; what ``batcher.too_big`` and ``batcher.chunks`` take)."""
    b = _Batch(0, 0)
    b.append(record.content, None, record)
    return SendQueue._columns(b)[0]


@dataclass(slots=True)
class _Queued:
    """A sealed entry waiting for the I/O thread, with its callbacks."""

    entry: PendingEntry
    batched: bool
    callbacks: list[Any] | None
    ticket: int
    follows_previous: bool = False
    nbytes: int = 0
    #: Sealed by a ``send()`` that will write it itself (or hand it over): the I/O thread
    #: leaves a queue whose first entry is claimed alone.
    claimed: bool = False


class _Lane:
    """One partition's share of the queue."""

    __slots__ = (
        "batch",
        "key_batches",
        "key_bytes",
        "key_count",
        "last_published",
        "next_seq",
        "part",
        "queue",
        "renewed_at",
    )

    def __init__(self, part: Partition) -> None:
        self.part = part
        #: When this partition's lease was last renewed (system monotonic seconds): by a
        #: commit that renewed it, or by :meth:`SendQueue._renew_due`.
        self.renewed_at = SYSTEM.monotonic()
        self.next_seq = part.next_seq
        #: Highest sequence id stored (or dropped as a duplicate) on this partition.
        self.last_published = part.next_seq - 1
        self.batch: _Batch | None = None
        self.key_batches: dict[Any, _Batch] = {}
        # Key-based batching limits apply to all key batches of the partition together.
        self.key_count = 0
        self.key_bytes = 0
        self.queue: list[_Queued] = []


class SendQueue:
    """A producer's open batches and sealed entries, written by the process's I/O thread.

    Parameters
    ----------
    parts
        The registered partitions, in partition order (one for a non-partitioned topic).
    config
        The producer's settings (:class:`QueueConfig`).
    clock
        Wall-clock ms for publish times. The publish delay and lease renewal keep the
        system's monotonic clock: they time a real thread.
    renew
        Renews the producer's lease on one partition; called by the I/O thread for each
        partition ``renew_s`` after its lease was last renewed (a commit there renews it
        too, once a quarter of it is gone), between writes as when idle.
    io
        The I/O thread that serves this queue (default: the process's,
        :func:`~filepulsar.storage.producer.io_thread.shared_io`).
    """

    def __init__(
        self,
        parts: list[Partition],
        config: QueueConfig,
        *,
        clock: Callable[[], int],
        renew: Callable[[Partition], None],
        io: ProducerIo | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._renew = renew
        self._lanes = [_Lane(p) for p in parts]
        #: The schema version stamped on every entry (8 bytes big-endian; empty: no schema).
        self.schema_version = b""
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # Held by whoever writes to the ledgers (the I/O thread, an inline send() or a bulk
        # write); taken before ``_lock`` when both are needed. Lanes are drained only while
        # holding it, so entries reach a partition in the order their sequence ids were given.
        self._write_lock = threading.Lock()
        self._pending_bytes = 0
        #: Threads waiting (``_wait``) for writes to finish: flush(), send(), a full queue.
        self._waiters = 0
        self._tickets_issued = 0
        self._done_upto = 0  # every ticket <= this is finished
        self._done_set: set[int] = set()
        self._error: BaseException | None = None
        self._closed = False
        # When the I/O thread is to seal this queue's oldest open batch (None: no timer set).
        # Set when a batch opens with none timed: a later batch is due later, so opening it
        # tells the I/O thread nothing (a wake-up per batch cost send_async a quarter of its
        # rate on two cores); seal_due sets the next.
        self._timed_at: float | None = None
        # Set (per thread) while send() seals its own message: the I/O thread is not woken
        # for it, as send() writes it itself when nothing else is queued (see inline()).
        self._inline = threading.local()
        # The thread holding ``_write_lock`` (None: nobody): a thread that would wait for the
        # ledgers it holds itself (a callback of this queue's own write: flush, send, a full
        # queue, a bulk write) raises instead (:meth:`_take_write`).
        self._writer: int | None = None
        # A write the I/O thread's pass stored and has not answered yet (its ledgers let go
        # once the pass's stores ended): whoever takes the ledgers next answers it first
        # (:meth:`_take_write`), so no thread waits on a pass that runs other callbacks.
        self._parked: ReadyWrite | None = None
        # Set by close() in a callback of this queue's own write: run by whoever holds the
        # ledgers once the write in hand ends (:meth:`_drop_write`).
        self._closing: Callable[[], None] | None = None
        # Set in a child forked from the process that opened the producer (inherited()).
        self._inherited = False
        self._io = shared_io() if io is None else io
        self._io.register(self)

    # ------------------------------------------------------------------ state
    @property
    def error(self) -> BaseException | None:
        """The error that failed a write (the queue takes no more messages), or None."""
        return self._error

    @property
    def connected(self) -> bool:
        return not self._closed and self._error is None

    @property
    def last_published(self) -> int:
        """The highest sequence id stored on any partition (-1 if none)."""
        return max(lane.last_published for lane in self._lanes)

    def _check_open(self) -> None:
        """Under the lock: wait for room if the queue is full, then raise the queue's error,
        or ``ProducerClosed`` (either may come while it waits)."""
        if (
            not self._closed
            and self._error is None
            and self._pending_bytes > self.config.max_pending_bytes
        ):
            self._wait_room()
        if self._closed or self._error is not None:
            if self._error is not None:
                raise self._error
            cfg = self.config
            raise ProducerClosed(f"producer {cfg.producer_name!r} on {cfg.topic} is closed")

    def _wait_room(self) -> None:
        cfg = self.config
        if not cfg.block_if_queue_full:
            raise ProducerQueueIsFull(
                f"producer {cfg.producer_name!r} has {self._pending_bytes} bytes pending "
                f"(limit {cfg.max_pending_bytes})"
            )
        self._cond.notify_all()
        if threading.get_ident() == self._io.ident:
            # A callback (on the I/O thread) sends on a full producer: nobody else drains it,
            # so write what it has here (raises if this thread is writing it already).
            self._seal_all()
            self._lock.release()
            try:
                self._write_here()
            finally:
                self._lock.acquire()
            return
        if self._writer == threading.get_ident():
            raise self._waits_for_itself()  # (a callback of this queue's write, on this thread)
        while self._pending_bytes > cfg.max_pending_bytes and self._error is None:
            self._wait(0.5)

    def _wait(self, timeout: float) -> None:
        """Under the lock: wait for a write to finish (or fail), counted in
        :attr:`_waiters` so that a write that finishes wakes someone only when someone
        waits (most writes of a live producer end with nobody waiting: their senders have
        callbacks)."""
        self._waiters += 1
        try:
            self._cond.wait(timeout)
        finally:
            self._waiters -= 1

    # ------------------------------------------------------------------ adding messages
    def add_plain(
        self, route: Callable[[], int], content: bytes, callback: Callback | None
    ) -> None:
        """Append a plain message (a value only, its sequence id the lane's next) to the open
        batch of the lane ``route()`` picks (called under the lock): ``send_async``'s fast
        path for ``Default`` batching."""
        size = len(content)
        cfg = self.config
        with self._lock:
            if (
                self._closed
                or self._error is not None
                or (self._pending_bytes > cfg.max_pending_bytes)
            ):
                self._check_open()
            lane = self._lanes[route()]
            b = lane.batch
            if b is None:
                b = lane.batch = _Batch(self._clock(), lane.next_seq)
                if self._timed_at is None:
                    self._batch_opened(b)
            elif b.seqs is not None:
                b.seqs.append(lane.next_seq)
            b.values.append(content)
            if callback is not None:
                if b.callbacks is None:
                    b.callbacks = [None] * (len(b.values) - 1)
                b.callbacks.append(callback)
            elif b.callbacks is not None:
                b.callbacks.append(None)
            lane.next_seq += 1
            b.nbytes += size
            self._pending_bytes += size
            if len(b.values) >= cfg.max_messages or b.nbytes >= cfg.max_bytes:
                self._seal(lane, b, None)

    def add(
        self,
        route: Callable[[], int],
        record: MessageRecord,
        callback: Callback | None,
        *,
        alone: bool,
        chunk_row: pa.RecordBatch | None = None,
    ) -> None:
        """Queue ``record`` on the lane ``route()`` picks (called under the lock).

        ``alone``: the message is its own entry (batching off, or a delivery time): an open
        batch of the lane is sealed first, as Pulsar flushes it, so entries stay in
        sequence-id order. ``chunk_row``: the message is too big for one entry
        (``batcher.too_big``) and is cut into chunk entries by ``batcher.chunks``; it is the
        message's stored row (:func:`message_row`).

        Raises ``MessageTooBig`` (nothing queued) when its key and properties leave no room
        for a chunk's value.
        """
        content = record.content
        size = 0 if content is None else len(content)
        cfg = self.config
        with self._lock:
            self._check_open()
            lane = self._lanes[route()]
            seq = record.sequence_id
            specs = None
            if chunk_row is not None:
                specs = batcher.chunks(
                    chunk_row,
                    0,
                    lane.next_seq if seq is None else seq,
                    implicit=True,
                    meta=int(batcher.meta_bytes(chunk_row)[0]),
                    max_message_size=cfg.max_message_size,
                    chunk_uuid=lambda s: f"{cfg.producer_name}-{s}",
                    what="the message",
                )
            self._pending_bytes += size
            if (alone or specs is not None) and lane.batch:
                self._seal(lane, lane.batch, None)
            if seq is None:
                seq = lane.next_seq
                lane.next_seq += 1
            if specs is not None:
                self._queue_chunks(lane, specs, callback, size)
                return
            if alone:
                single = _Batch(self._clock(), seq)
                single.append(content, callback, record)
                self._seal(lane, single, None, batched=False, deliver_at=record.deliver_at)
                return
            bkey: Any = None
            b: _Batch | None
            if cfg.key_based:
                bkey = (
                    record.ordering_key
                    if record.ordering_key is not None
                    else (record.partition_key)
                )
                b = lane.key_batches.get(bkey)
                if b is None:
                    b = lane.key_batches[bkey] = _Batch(self._clock(), seq)
                    if self._timed_at is None:
                        self._batch_opened(b)
            else:
                b = lane.batch
                if b is None:
                    b = lane.batch = _Batch(self._clock(), seq)
                    if self._timed_at is None:
                        self._batch_opened(b)
            b.add_seq(seq)
            b.append(content, callback, record)
            b.nbytes += size
            if cfg.key_based:
                lane.key_count += 1
                lane.key_bytes += size
                if lane.key_count >= cfg.max_messages or lane.key_bytes >= cfg.max_bytes:
                    self._seal_keys(lane)
            elif len(b.values) >= cfg.max_messages or b.nbytes >= cfg.max_bytes:
                self._seal(lane, b, None)

    # ------------------------------------------------------------------ sealing (lock held)
    @staticmethod
    def _columns(b: _Batch) -> tuple[pa.RecordBatch, int | None]:
        """The stored columns of a batch, and its first sequence id if they are contiguous
        (then no sequence_id column is stored)."""
        n = len(b.values)
        cols = [binary_array(b.values)]
        names = ["value"]
        first_seq = b.first_seq if b.seqs is None else None
        if not b.extras and first_seq is not None:
            return pa.RecordBatch.from_arrays(cols, names=names), first_seq
        props: list[Any] = [None] * n
        keys: list[Any] = [None] * n
        okeys: list[Any] = [None] * n
        evts: list[Any] = [None] * n
        for i, r in b.extras or ():
            props[i], keys[i], okeys[i], evts[i] = (
                r.properties,
                r.partition_key,
                r.ordering_key,
                r.event_timestamp,
            )
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
                cols.append(int64_array(vals))
            else:
                cols.append(binary_array(vals, typ))
            names.append(name)
        if b.seqs is not None:
            cols.append(int64_array(b.seqs))
            names.append("sequence_id")
        schema = pa.schema([MESSAGE_SCHEMA.field(nm) for nm in names])
        return pa.RecordBatch.from_arrays(cols, schema=schema), first_seq

    def _seal(
        self, lane: _Lane, b: _Batch, bkey: Any, *, batched: bool = True, deliver_at: int = 0
    ) -> None:
        key_based = False
        if lane.batch is b:
            lane.batch = None
        elif lane.key_batches.get(bkey) is b:
            lane.key_batches.pop(bkey)
            key_based = True
        if b.seqs is None:
            first, hi = b.first_seq, b.first_seq + len(b.values) - 1
        else:
            first, hi = b.seqs[0], max(b.seqs)
        if key_based:
            first = hi
        cfg = self.config
        try:
            value = b.values[0]
            data = None
            one = b.extras[0][1] if b.extras else None
            if (
                len(b.values) == 1
                and type(value) is bytes
                and (one is None or (one.properties is None and one.event_timestamp is None))
            ):
                # One message with a value and perhaps keys (every unbatched send, most key
                # batches of a live producer): no record batch to build (storage.ipc_value).
                data = encode_value_entry_parts(
                    value,
                    producer_name=cfg.producer_name,
                    publish_time=b.created_ms,
                    sequence_id=first,
                    codec=cfg.codec,
                    batched=batched,
                    schema_version=self.schema_version,
                    deliver_at=deliver_at,
                    key=None if one is None else one.partition_key,
                    ordering_key=None if one is None else one.ordering_key,
                )
            if data is None:
                rb, first_seq = self._columns(b)
                data = encode_entry_parts(
                    rb,
                    producer_name=cfg.producer_name,
                    publish_time=b.created_ms,
                    codec=cfg.codec,
                    batched=batched,
                    schema_version=self.schema_version,
                    deliver_at=deliver_at,
                    first_sequence_id=first_seq,
                    header_sequence_id=hi if key_based else None,
                )
        except Exception as e:  # the batch is out of every queue: answer its senders here
            err = FilePulsarError(f"cannot encode an entry for {cfg.topic}: {e}")
            _answer([b.callbacks], err)
            self._pending_bytes -= b.byte_count()
            raise err from e
        self._enqueue(
            lane,
            PendingEntry.of(data, len(b.values), b.created_ms, cfg.producer_name, first, hi),
            batched,
            b.callbacks,
            b.byte_count(),
        )

    def _queue_chunks(
        self, lane: _Lane, specs: list[batcher.EntrySpec], callback: Any, size: int
    ) -> None:
        """Encode and queue a chunked message's entries (``batcher.chunks``); the callback
        and the message's bytes go with the last, which carries its sequence id."""
        cfg = self.config
        now = self._clock()
        try:
            entries = [
                e
                for group in batcher.encode(
                    specs,
                    producer_name=cfg.producer_name,
                    publish_time=now,
                    codec=cfg.codec,
                    schema_version=self.schema_version,
                )
                for e in group
            ]
        except Exception as e:
            err = FilePulsarError(f"cannot encode a chunked message for {cfg.topic}: {e}")
            _answer([[callback]], err)
            self._pending_bytes -= size
            raise err from e
        last = len(entries) - 1
        for cid, entry in enumerate(entries):
            self._enqueue(
                lane,
                entry,
                False,
                [callback] if cid == last and callback is not None else None,
                size if cid == last else 0,
                follows_previous=cid > 0,
            )

    def _enqueue(
        self,
        lane: _Lane,
        entry: PendingEntry,
        batched: bool,
        callbacks: list[Any] | None,
        nbytes: int,
        *,
        follows_previous: bool = False,
    ) -> None:
        self._tickets_issued += 1
        q = _Queued(entry, batched, callbacks, self._tickets_issued, follows_previous, nbytes)
        if getattr(self._inline, "on", False):
            q.claimed = True  # send() writes it, or hands it to the I/O thread and wakes it
        else:
            self._io.work(self)  # (wakes the I/O thread only if it sleeps)
        lane.queue.append(q)

    def _batch_opened(self, b: _Batch) -> None:
        """Under the lock, when a batch opens and none is timed: time it, unless it is a
        ``send()``'s own batch, which that ``send()`` seals and writes itself."""
        if not getattr(self._inline, "on", False):
            self._timed_at = due = b.opened + self.config.publish_delay_ms / 1000
            self._io.timer(self, due)

    def _seal_all(self) -> None:
        for lane in self._lanes:
            if lane.batch is not None:
                self._seal(lane, lane.batch, None)
            if lane.key_batches:
                self._seal_keys(lane)

    def _seal_keys(self, lane: _Lane) -> None:
        """Seal every key batch of ``lane`` in order of their highest sequence id.

        With ``header_sequence_id`` = highest, that order lets Pulsar's dedup accept every
        key batch although their sequence ids interleave.
        """
        for k, kb in sorted(lane.key_batches.items(), key=lambda item: item[1].highest()):
            self._seal(lane, kb, k)
        lane.key_count = lane.key_bytes = 0

    # ------------------------------------------------------------------ waiting
    def flush(self) -> None:
        """Seal open batches and wait until everything queued so far is stored.

        Raises the error that failed a pending write, if any; ``FilePulsarError`` when called
        from a callback of this producer's own write (it would wait for itself).
        """
        with self._lock:
            self._seal_all()
            target = self._tickets_issued
        if self.writing_here():
            raise self._waits_for_itself()
        if threading.get_ident() == self._io.ident:
            self._write_here()  # (a callback: the I/O thread would wait for itself)
        else:
            self._answer_parked()
        with self._lock:
            while self._done_upto < target and self._error is None:
                self._wait(1.0)
            if self._error is not None:
                raise self._error

    def in_send(self) -> bool:
        """True inside :meth:`inline` on this thread (a ``send()``, not a ``send_async``)."""
        return bool(getattr(self._inline, "on", False))

    @contextlib.contextmanager
    def inline(self) -> Iterator[None]:
        """The scope of one ``send()``: what it seals is claimed for it (the I/O thread is
        not woken for it) until :meth:`wait_inline` writes it or hands it over. On an error,
        what was claimed goes to the I/O thread, as ``flush()`` would write it."""
        flag = self._inline
        flag.on = True
        try:
            yield
        except BaseException:
            self._release_claims()
            raise
        finally:
            flag.on = False

    def wait_inline(self, done: Callback) -> None:
        """``flush()`` for ``send()``: seal, then write the sealed entry in this thread if it
        is the only one outstanding and only ``done`` waits on it (no other sender's callback
        runs here); else wake the I/O thread and wait for it."""
        work: tuple[_Lane, list[_Queued]] | None = None
        with self._lock:
            self._seal_all()
            target = self._tickets_issued
            if (
                self._done_upto + 1 == target
                and self._error is None
                and self._take_write(blocking=False, answer=False)
            ):
                queued = [lane for lane in self._lanes if lane.queue]
                if len(queued) == 1 and len(queued[0].queue) == 1:
                    q = queued[0].queue[0]
                    if q.ticket == target and all(
                        cb is None or cb is done for cb in q.callbacks or ()
                    ):
                        work = (queued[0], queued[0].queue)
                        queued[0].queue = []
                if work is None:  # (nothing ran while held: no close to finish)
                    self._writer = None
                    self._write_lock.release()
            if work is None:  # the I/O thread writes it: release the claims and wake it
                self._release_claims_locked()
        if work is not None:
            # The inline flag is still set: an error path must not wake the I/O thread for
            # nothing; _write answers the callback and marks the ticket done.
            try:
                self._write(*work)
            finally:
                self._release_write()
        elif self.writing_here():
            raise self._waits_for_itself()  # (what it sealed is written after the write in hand)
        elif threading.get_ident() == self._io.ident:
            self._write_here()
        else:
            self._answer_parked()
        with self._lock:
            while self._done_upto < target and self._error is None:
                self._wait(1.0)
            if self._error is not None:
                raise self._error

    def _release_claims(self) -> None:
        with self._lock:
            self._release_claims_locked()

    def _release_claims_locked(self) -> None:
        for lane in self._lanes:
            for q in lane.queue:
                q.claimed = False
        self._cond.notify_all()
        if self._has_work():
            self._io.work(self)
        if self._timed_at is None:  # (a send() that failed may leave its batch open)
            due = self._next_due()
            if due is not None:
                self._timed_at = due
                self._io.timer(self, due)

    def _write_here(self) -> None:
        """On the I/O thread (a ``send()`` or ``flush()`` in a callback): write this queue's
        sealed entries here, as no other thread will while this one waits.

        Raises ``FilePulsarError`` if this thread is writing this queue already (the callback
        is one of this producer's own: waiting in it would never end).
        """
        self._take_write()  # (another thread's send() or bulk write ends)
        try:
            self._write_queued(lambda: True)
        finally:
            self._drop_write()

    def _answer_parked(self) -> None:
        """Not on the I/O thread, before waiting for a write: if the I/O thread's pass parked
        a write of this queue (stored, not yet answered), answer it here and write what is
        sealed, unless another thread holds the ledgers (it answers it). The pass's thread may
        be in a callback that waits for this thread: waiting for it to answer would never
        end."""
        if self._parked is None or not self._take_write(blocking=False):
            return
        try:
            self._write_queued(lambda: True)
        finally:
            self._release_write()

    def _write_queued(self, may: Callable[[], bool]) -> None:
        """With the ledgers held: take every lane's sealed entries under the lock (none
        unless ``may()`` there), then write them, one group commit a lane."""
        with self._lock:
            work = self._take_sealed(claimed=True) if may() else []
        for lane, queued in work:
            self._write(lane, queued)

    def _take_sealed(self, *, claimed: bool) -> list[tuple[_Lane, list[_Queued]]]:
        """Under the lock, with the ledgers held: take each lane's sealed entries (``claimed``
        False: not a lane whose head a ``send()`` has claimed, which writes it itself)."""
        work = [
            (lane, lane.queue)
            for lane in self._lanes
            if lane.queue and (claimed or not lane.queue[0].claimed)
        ]
        for lane, _ in work:
            lane.queue = []
        return work

    def _take_write(self, *, blocking: bool = True, answer: bool = True) -> bool:
        """Take the ledgers (``_write_lock``); False if ``blocking`` is False and another
        thread holds them. A write the I/O thread stored and has not answered yet is answered
        first, on this thread, in order (its callbacks run here); with ``answer`` False (the
        caller holds the queue's lock, which answering takes) such a write makes this return
        False instead.

        Raises ``FilePulsarError`` if this thread holds them already: it is in a callback of
        this producer's own write, and waiting would never end.
        """
        if self._inherited:
            assert self._error is not None
            raise self._error  # (the parent's ledgers: never written from a forked child)
        me = threading.get_ident()
        if self._writer == me:
            if not blocking:
                return False
            raise self._waits_for_itself()
        if not self._write_lock.acquire(blocking):
            return False
        self._writer = me
        parked = self._parked
        if parked is not None:
            try:
                if not answer:
                    self._writer = None
                    self._write_lock.release()
                    return False
                self._parked = None
                parked.answer_here()
            except BaseException:
                self._drop_write()
                raise
        return True

    def _waits_for_itself(self) -> FilePulsarError:
        """The error of a call that would wait for a write this thread is doing: it is in a
        callback of that write (on the I/O thread, or on a thread whose ``send()`` or bulk
        write runs the callbacks of earlier messages)."""
        cfg = self.config
        return FilePulsarError(
            f"producer {cfg.producer_name!r} on {cfg.topic}: send(), flush() or a bulk write "
            "in a callback of its own send_async would wait for itself (use send_async)"
        )

    def _drop_write(self) -> None:
        """Let go of the ledgers; first finish a close() made in a callback of the write
        that ends here."""
        try:
            closing, self._closing = self._closing, None
            if closing is not None:
                self._finish_close(closing)
        finally:
            self._writer = None
            self._write_lock.release()

    def _release_write(self) -> None:
        """Let go of the ledgers (held by a thread other than the I/O thread): what was
        queued meanwhile goes to the I/O thread, which skipped this queue while they were
        held."""
        self._drop_write()
        with self._lock:
            if self._has_work():
                self._io.work(self)

    # ------------------------------------------------------------------ bulk writes
    @contextlib.contextmanager
    def writing(self, reserve: list[tuple[int, int | None]]) -> Iterator[list[int | None]]:
        """Hold the ledgers for a bulk write: for each ``(lane, count)`` seal the lane's open
        batches and write what it has queued (earlier messages go first), reserve ``count``
        sequence ids (None: the caller's rows carry their own); yield the first reserved id of
        each. The I/O thread writes nothing until the block ends.

        Raises the queue's error, or ``ProducerClosed``, before anything is written;
        ``FilePulsarError`` in a callback of this producer's own write (it would wait for
        itself).
        """
        self._take_write()
        try:
            with self._lock:
                if self._closed or self._error is not None:
                    self._check_open()
                taken: list[tuple[_Lane, list[_Queued]]] = []
                bases: list[int | None] = []
                for idx, count in reserve:
                    lane = self._lanes[idx]
                    if lane.batch:
                        self._seal(lane, lane.batch, None)
                    if lane.key_batches:
                        self._seal_keys(lane)
                    taken.append((lane, lane.queue))
                    lane.queue = []
                    if count is None:
                        bases.append(None)
                    else:
                        bases.append(lane.next_seq)
                        lane.next_seq += count
            for lane, queued in taken:
                if queued:
                    self._write(lane, queued)
                if self._error is not None:
                    raise self._error
            yield bases
        finally:
            self._release_write()

    # ------------------------------------------------------------------ for the I/O thread
    def _next_due(self) -> float | None:
        """Monotonic time the oldest open batch reaches its publish delay (None: none open)."""
        due: float | None = None
        for lane in self._lanes:
            b = lane.batch
            if b is not None and (due is None or b.opened < due):
                due = b.opened
            for kb in lane.key_batches.values():
                if due is None or kb.opened < due:
                    due = kb.opened
        return None if due is None else due + self.config.publish_delay_ms / 1000

    def _has_work(self) -> bool:
        return any(lane.queue and not lane.queue[0].claimed for lane in self._lanes)

    def seal_due(self, now: float) -> None:
        """The I/O thread, at this queue's timer: seal the batches opened a publish delay
        before ``now`` (monotonic s) and time the oldest one left open."""
        with self._lock:
            self._timed_at = None
            if self._closed or self._error is not None:
                return
            self._seal_opened_before(now - self.config.publish_delay_ms / 1000)
            due = self._next_due()
            if due is not None:
                self._timed_at = due
                self._io.timer(self, due)

    def take_ready(self) -> ReadyWrite | None:
        """The I/O thread: take the ledgers and every lane's sealed entries for one pass
        (None: nothing to write, or another thread holds the ledgers and hands what is left
        back when it lets go). The pass runs the returned write's stores, overlapping them
        with other lanes' and queues', then lets go of the ledgers
        (:meth:`ReadyWrite.park`) and answers it (:meth:`ReadyWrite.answer`)."""
        if not self._take_write(blocking=False):
            return None
        try:
            with self._lock:
                work = [] if self._closed else self._take_sealed(claimed=False)
        except BaseException:
            self._drop_write()
            raise
        if not work:
            self._drop_write()
            return None
        return ReadyWrite(self, work)

    def next_renewal(self) -> float:
        """Monotonic time the lease renewed longest ago is due for renewal."""
        return _oldest_renewal(self._lanes) + self.config.renew_s

    def renew_due(self) -> None:
        """The I/O thread: renew the leases due (none once the queue is closed or failed)."""
        self._renew_due()

    def _seal_opened_before(self, when: float) -> None:
        for lane in self._lanes:
            b = lane.batch
            if b is not None and b.opened <= when:
                self._seal(lane, b, None)
            if lane.key_batches and min(kb.opened for kb in lane.key_batches.values()) <= when:
                self._seal_keys(lane)

    def _renew_due(self, limit: int | None = None) -> None:
        """Renew the lease of every partition whose last renewal is ``renew_s`` old (the
        ``limit`` most overdue)."""
        now = SYSTEM.monotonic()
        due = [lane for lane in self._lanes if now - lane.renewed_at >= self.config.renew_s]
        due.sort(key=lambda lane: lane.renewed_at)
        for lane in due[:limit]:
            lane.renewed_at = now
            if self._closed or self._error is not None:
                continue  # (its renewal moves on: a stopped queue holds no lease to keep)
            try:
                self._renew(lane.part)
            except FilePulsarError as e:
                self.fail(e)
                return

    def _write(self, lane: _Lane, queued: list[_Queued]) -> None:
        try:
            positions = self._store(lane, queued, sync_first=not self.in_send())
        except BaseException as e:  # reported to every waiting sender
            self.fail(e, queued)
            return
        self._stored(lane, queued, positions)

    def _store(
        self, lane: _Lane, queued: list[_Queued], *, sync_first: bool
    ) -> list[Position | None]:
        """Write and commit ``queued`` to ``lane``'s partition (durable when it returns).

        ``sync_first``: the I/O thread's messages already waited for the batching delay: its
        small writes trade one fsync of latency for less CPU. A send() asks for the overlap of
        its data fsync with the commit, which it gets only where the blob has no zeros written
        ahead (not on a local disk: LedgerWriter.append_stream)."""
        return lane.part.writer.append(
            [q.entry for q in queued],
            dedup=self.config.dedup,
            follows=[q.follows_previous for q in queued],
            sync_first=sync_first,
        )

    def _stored(
        self,
        lane: _Lane,
        queued: list[_Queued],
        positions: list[Position | None],
        stored_at: float | None = None,
    ) -> None:
        """``queued`` is durable at ``positions`` (committed at monotonic ``stored_at``,
        None: now): answer its callbacks, mark it done."""
        if lane.part.writer.lease_renewed:  # (else its renewal stays due as it was)
            # (from the commit that renewed it, not from when a pass answers it: a pass
            # answers after its slowest store)
            lane.renewed_at = SYSTEM.monotonic() if stored_at is None else stored_at
        pidx = lane.part.index
        lane.last_published = max(
            lane.last_published, max(q.entry.highest_sequence_id for q in queued)
        )
        for q, pos in zip(queued, positions):
            cbs = q.callbacks
            if cbs is None:
                continue
            for i, cb in enumerate(cbs):
                if cb is None:
                    continue
                mid = _message_id(pos, pidx, i if q.batched else -1)
                try:
                    cb(Result.Ok, mid)
                except BaseException:  # a user callback must not kill the I/O thread
                    log.exception("send_async callback raised")
        with self._lock:
            for q in queued:
                self._pending_bytes -= q.nbytes
                self._mark_done(q.ticket)
            if self._waiters:
                self._cond.notify_all()

    def _mark_done(self, ticket: int) -> None:
        self._done_set.add(ticket)
        while self._done_upto + 1 in self._done_set:
            self._done_upto += 1
            self._done_set.discard(self._done_upto)

    # ------------------------------------------------------------------ failing and closing
    def fail(self, e: BaseException, queued: list[_Queued] | None = None) -> None:
        """Stop the queue with ``e`` (a write failed): the senders of ``queued`` hear of it,
        every later call raises it."""
        if not isinstance(e, FilePulsarError):
            e = FilePulsarError(f"write to {self.config.topic} failed: {e!r}").with_traceback(
                e.__traceback__
            )
        _answer([q.callbacks for q in queued or ()], e)
        with self._lock:
            self._error = e
            for q in queued or []:
                self._pending_bytes -= q.nbytes
                self._mark_done(q.ticket)
            self._cond.notify_all()

    def fail_pending(self, e: BaseException) -> None:
        """Answer every message not yet stored with an error (queued and open batches)."""
        cfg = self.config
        err = (
            e
            if isinstance(e, FilePulsarError)
            else FilePulsarError(f"producer {cfg.producer_name!r} on {cfg.topic} failed: {e!r}")
        )
        with self._lock:
            if self._error is None and not isinstance(err, ProducerClosed):
                self._error = err
            queued: list[_Queued] = []
            batches: list[_Batch] = []
            for lane in self._lanes:
                queued.extend(lane.queue)
                lane.queue = []
                if lane.batch is not None:
                    batches.append(lane.batch)
                    lane.batch = None
                batches.extend(lane.key_batches.values())
                lane.key_batches.clear()
                lane.key_count = lane.key_bytes = 0
            for q in queued:
                self._pending_bytes -= q.nbytes
                self._mark_done(q.ticket)
            for b in batches:
                self._pending_bytes -= b.nbytes
            self._cond.notify_all()
        _answer([q.callbacks for q in queued] + [b.callbacks for b in batches], err)

    def writing_here(self) -> bool:
        """True on the thread that holds this queue's ledgers (in a callback of its own
        write, where ``flush()`` would wait for itself)."""
        return self._writer == threading.get_ident()

    def close(self, after: Callable[[], None] | None = None) -> None:
        """Leave the I/O thread, write what is sealed (unless a write failed), answer what is
        left open with ``ProducerClosed`` (a clean close flushes first), then run ``after``
        (the producer releases its leases). The other queues the thread serves go on.

        In a callback of this queue's own write (this thread holds its ledgers) the open
        batches are sealed and the rest of the close (writing them, then ``after``) runs
        when the write in hand ends: what was sent before ``close()`` is written, as a close
        flushes, and the leases are released only after the last write (released sooner,
        the rest of the write in hand failed as fenced).
        """
        if self._inherited:  # (the parent's ledgers, leases and thread are not ours)
            self._closed = True
            return
        with self._lock:
            self._closed = True
            self._cond.notify_all()
            own = self._writer == threading.get_ident()
            if own and self._error is None:
                self._seal_all()
        self._io.unregister(self)
        if own:
            self._closing = after if after is not None else _nothing
            return
        self._take_write()
        try:
            self._finish_close(after)
        finally:
            self._drop_write()

    def _finish_close(self, after: Callable[[], None] | None) -> None:
        """With the ledgers held: the rest of :meth:`close`."""
        try:
            self._write_queued(lambda: self._error is None)
            cfg = self.config
            self.fail_pending(
                ProducerClosed(f"producer {cfg.producer_name!r} on {cfg.topic} was closed")
            )
        finally:
            if after is not None:
                after()

    def inherited(self, pid: int) -> None:
        """In a child forked from process ``pid``, which opened this producer: the parent's
        I/O thread writes its queue, not the child's, so every call raises instead of
        waiting for ever. Its locks, which a parent's thread may have held at the fork, are
        replaced; closing it releases nothing (the leases are the parent's)."""
        self._inherited = True
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._write_lock = threading.Lock()
        self._writer = None
        self._parked = None
        self._closing = None
        cfg = self.config
        self._error = FilePulsarError(
            f"producer {cfg.producer_name!r} on {cfg.topic} was opened by process {pid}; "
            "a forked child cannot use it (open a new producer in the child)"
        )


class ReadyWrite:
    """A queue's sealed entries the I/O thread took for one pass, its ledgers held
    (:meth:`SendQueue.take_ready`): one store per lane (:meth:`stores`; the pass overlaps
    them with other lanes' and queues', whose syncs then run together); once every store of
    the pass ended, :meth:`park` lets go of the ledgers with the write left to answer, and
    :meth:`answer` (the I/O thread, queue after queue) answers it, unless a thread that took
    the ledgers meanwhile answered it first (:meth:`SendQueue._take_write`)."""

    __slots__ = ("_outcomes", "_work", "queue")

    def __init__(self, queue: SendQueue, work: list[tuple[_Lane, list[_Queued]]]) -> None:
        self.queue = queue
        self._work = work
        #: Per lane: its positions and when its commit returned, or the exception its store
        #: raised (None: not run).
        self._outcomes: list[Any] = [None] * len(work)

    def stores(self) -> list[Callable[[], None]]:
        """One job per lane: write, sync and commit its entries (each in its partition's
        order; none raises: an error is kept for the answer)."""
        return [functools.partial(self._store, i) for i in range(len(self._work))]

    def _store(self, i: int) -> None:
        lane, queued = self._work[i]
        try:
            positions = self.queue._store(lane, queued, sync_first=True)
            self._outcomes[i] = (positions, SYSTEM.monotonic())
        except BaseException as e:  # reported to the lane's senders by the answer
            self._outcomes[i] = e

    def park(self) -> None:
        """The stores ended: let go of the ledgers, this write left for whoever takes them
        next (so that no thread waits for a pass that runs other queues' callbacks)."""
        q = self.queue
        q._parked = self
        q._writer = None
        q._write_lock.release()

    def answer(self) -> None:
        """The I/O thread, after the pass: take the ledgers (which answers this write) and let
        go of them; nothing if another thread holds them (it answered this write when it
        took them)."""
        q = self.queue
        if q._parked is self and q._take_write(blocking=False):
            q._drop_write()

    def answer_here(self) -> None:
        """With the ledgers held: answer each lane's senders (stored, or the error that
        stopped the queue), in lane order."""
        q = self.queue
        for (lane, queued), out in zip(self._work, self._outcomes):
            if isinstance(out, BaseException):
                q.fail(out, queued)
            elif out is None:  # (never ran: the pass itself failed)
                q.fail(FilePulsarError("the producer I/O thread's pass failed"), queued)
            else:
                q._stored(lane, queued, *out)


def _nothing() -> None:
    pass


def _oldest_renewal(lanes: list[_Lane]) -> float:
    """When the lease renewed longest ago among ``lanes`` was renewed."""
    oldest = lanes[0].renewed_at
    for lane in lanes:
        if lane.renewed_at < oldest:
            oldest = lane.renewed_at
    return oldest


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


def _message_id(pos: Position | None, partition: int, batch_index: int) -> MessageId:
    if pos is None:
        return DUPLICATE_MESSAGE_ID
    return MessageId(partition, pos.ledger_id, pos.entry_id, batch_index)
