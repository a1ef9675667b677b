"""The asyncio client's receiving side: :class:`Consumer` and :class:`Reader`, which wait for a
message without holding a worker (:class:`Receiving`), hand what a cancelled receive took
to the next one and wake their waiters on close (:class:`_Waiting`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from filepulsar.connector.client.asyncio.errors import PulsarException, to_pulsar_exception
from filepulsar.connector.client.consumer import Consumer as SyncConsumer
from filepulsar.connector.client.message import Message
from filepulsar.connector.client.reader import Reader as SyncReader
from filepulsar.connector.client.types import (
    Timeout,
)
from filepulsar.storage.errors import FilePulsarError
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.producer import Result
from filepulsar.storage.versioned.watch import CommitWaiter, poll_interval_s, recheck_interval_s

if TYPE_CHECKING:
    from filepulsar.connector.client.asyncio import Client

log = logging.getLogger(
    "filepulsar.connector.client.asyncio"
)  # the asyncio client's logger, as before

_POLL_MIN_S = 0.001  # receive/read_next: pause after an empty look, doubling to the poll interval


class _Waiting:
    """The waits of one consumer or reader: sleeping receives, looks in flight whose caller
    went away, and the messages those looks took (handed to the next receive)."""

    def __init__(self) -> None:
        self.handoff: deque[Message] = deque()
        self.closing = False
        self._sleepers: set[asyncio.Future[None]] = set()
        self._orphans: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()

    def adopt(self, cf: concurrent.futures.Future[Message | None]) -> None:
        """``cf`` is a look whose receive was cancelled: keep what it takes."""
        with self._lock:
            self._orphans.add(cf)
        cf.add_done_callback(self._keep)

    def _keep(self, cf: concurrent.futures.Future[Message | None]) -> None:
        # Runs on the worker thread that finished the look (or at once if it had).
        if not cf.cancelled() and cf.exception() is None:
            msg = cf.result()
            if msg is not None:
                self.handoff.append(msg)
        with self._lock:
            self._orphans.discard(cf)

    async def settle(self) -> None:
        """Wait until every orphaned look has finished (and handed over what it took)."""
        while True:
            with self._lock:
                pending = list(self._orphans)
            if not pending:
                return
            await asyncio.wait([asyncio.wrap_future(cf) for cf in pending])

    def wait_orphans(self) -> None:
        """:meth:`settle` for a worker thread."""
        with self._lock:
            pending = list(self._orphans)
        concurrent.futures.wait(pending)

    async def pause(
        self, seconds: float, *, waiter: CommitWaiter | None = None, seen: int = 0
    ) -> None:
        """Sleep ``seconds`` on the loop unless :meth:`wake` comes first, or (with ``waiter``)
        a commit lands in its folders, or already landed since ``waiter.changes()`` was
        ``seen``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, _resolve, fut)
        self._sleepers.add(fut)

        def woken() -> None:  # on whichever thread read the commit's event
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, fut)

        if waiter is not None:
            waiter.add_callback(woken)
            if waiter.changes() != seen:
                _resolve(fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._sleepers.discard(fut)
            if waiter is not None:
                waiter.remove_callback(woken)

    def wake(self) -> None:
        """Mark closing and end every pause at once (callable from any thread)."""
        self.closing = True
        for fut in list(self._sleepers):
            fut.get_loop().call_soon_threadsafe(_resolve, fut)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Receiving:
    """What Consumer and Reader share: receive without holding a worker, hand over what a
    cancelled receive took, wake on close."""

    _client: Client
    _waiting: _Waiting
    _what: str

    def _look(self) -> Message | None:
        raise NotImplementedError

    def _look_here(self) -> Message | None:
        raise NotImplementedError

    def _commit_waiter(self) -> CommitWaiter | None:
        """The synchronous consumer's or reader's commit waiter (None before its first look)."""
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._waiting.closing:
            raise PulsarException(Result.AlreadyClosed, f"{self._what} is closed")

    async def _next(self) -> Message:
        w = self._waiting
        delay = _POLL_MIN_S
        while True:
            self._check_open()
            await w.settle()
            if w.handoff:
                return w.handoff.popleft()
            msg = self._look_here()  # one already fetched: no thread needed
            if msg is not None:
                return msg
            waiter = self._commit_waiter()
            seen = None if waiter is None else waiter.changes()
            cf = self._client._submit(self._look)
            try:
                msg = await asyncio.wrap_future(cf)
            except asyncio.CancelledError:
                w.adopt(cf)
                raise
            except FilePulsarError as e:
                raise to_pulsar_exception(e) from e
            if msg is not None:
                if w.closing:
                    # Closed meanwhile: the message stays unacknowledged and goes back to the
                    # subscription with the consumer's close.
                    self._check_open()
                return msg
            if waiter is not None and seen is not None and waiter.watched:
                # Woken by a commit (storage.versioned.watch), re-checking now and then as the
                # synchronous consumer does; a commit during the look ends the pause at once.
                await w.pause(recheck_interval_s(), waiter=waiter, seen=seen)
                continue
            await w.pause(delay)
            delay = min(delay * 2, poll_interval_s())


class Consumer(Receiving):
    """Receives messages of a subscription (pulsar-client's asyncio ``Consumer``).

    Created by :meth:`Client.subscribe`.
    """

    def __init__(self, consumer: SyncConsumer, client: Client) -> None:
        self._consumer = consumer
        self._client = client
        self._waiting = _Waiting()
        self._what = f"consumer {consumer.consumer_name()!r}"
        self._redelivering: concurrent.futures.Future[None] | None = None

    def _look(self) -> Message | None:
        try:
            return self._consumer.receive(timeout_millis=0)
        except Timeout:
            return None

    def _look_here(self) -> Message | None:
        return self._consumer._receive_queued()

    def _commit_waiter(self) -> CommitWaiter | None:
        return self._consumer._waiter

    async def _after_redelivery(self) -> None:
        r = self._redelivering
        if r is not None and not r.done():
            await asyncio.wait([asyncio.wrap_future(r)])

    async def receive(self) -> Message:
        """The next message, waiting as long as it takes.

        Raises
        ------
        PulsarException
            ``AlreadyClosed`` if the consumer is (or gets) closed.
        """
        await self._after_redelivery()
        return await self._next()

    async def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message (a Message or a MessageId), grouped with others as the
        synchronous consumer groups them (stored within ``ack_grouping_time_ms``, at most
        ``mark_delete_rate_limit`` times a second per partition, and by ``close``; with
        ``ack_grouping_time_ms=0``, durable when this returns)."""
        await self._client._run(self._consumer.acknowledge, message)

    async def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge every message of its partition up to and including ``message``.

        Raises
        ------
        PulsarException
            ``CumulativeAcknowledgementNotAllowedError`` on Shared and Key_Shared.
        """
        await self._client._run(self._consumer.acknowledge_cumulative, message)

    async def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Ask for redelivery of ``message`` after the negative-ack delay."""
        await self._client._run(self._consumer.negative_acknowledge, message)

    async def unsubscribe(self) -> None:
        """Delete the subscription and close the consumer.

        Raises
        ------
        PulsarException
            ``ConsumerBusy`` if other consumers are connected to the subscription.
        """
        await self._client._run(self._consumer.unsubscribe)
        self._waiting.wake()

    async def seek(self, messageid: MessageId | int) -> None:
        """Reset the subscription to a message id or a publish time (epoch ms).

        Raises
        ------
        ValueError
            If ``messageid`` is neither.
        """
        if isinstance(messageid, bool) or not isinstance(messageid, MessageId | int):
            raise ValueError(f"invalid messageid type {type(messageid)}")
        await self._after_redelivery()
        w = self._waiting
        await w.settle()
        await self._client._run(self._consumer.seek, messageid)
        w.handoff.clear()  # taken before the seek: the subscription starts over anyway

    async def close(self) -> None:
        """Close the consumer; receives waiting on it raise ``AlreadyClosed``.

        Raises
        ------
        PulsarException
            ``AlreadyClosed`` if it was closed before (by ``close``, ``unsubscribe`` or the
            client), as pulsar-client's.
        """
        if not self._consumer.is_connected():
            raise PulsarException(Result.AlreadyClosed, f"{self._what} is already closed")
        self._waiting.wake()
        await self._client._run(self._consumer.close)

    async def get_last_message_id(self) -> MessageId:
        """The id of the last message stored in the consumer's (only) topic partition."""
        return await self._client._run(self._consumer.get_last_message_id)

    def redeliver_unacknowledged_messages(self) -> None:
        """Redeliver every message received and not acknowledged (the dead-letter policy
        applies). Returns at once; the next ``receive`` waits until it is done."""
        w = self._waiting
        w.handoff.clear()
        prev = self._redelivering

        def redeliver() -> None:
            if prev is not None:
                concurrent.futures.wait([prev])
            w.wait_orphans()
            self._consumer.redeliver_unacknowledged_messages()
            w.handoff.clear()

        cf = self._client._submit(redeliver)
        cf.add_done_callback(_log_failure)
        self._redelivering = cf

    def topic(self) -> str:
        """The topic (comma-separated topics, or the pattern) the consumer reads."""
        return self._consumer.topic()

    def subscription_name(self) -> str:
        """The subscription's name."""
        return self._consumer.subscription_name()

    def consumer_name(self) -> str:
        """The consumer's name (given, or generated)."""
        return self._consumer.consumer_name()

    def is_connected(self) -> bool:
        """Whether the consumer is open."""
        return self._consumer.is_connected() and not self._waiting.closing


def _log_failure(cf: concurrent.futures.Future[Any]) -> None:
    if not cf.cancelled() and cf.exception() is not None:
        log.warning("redeliver_unacknowledged_messages failed: %s", cf.exception())


class Reader(Receiving):
    """Reads a topic from a position, with no subscription (pulsar-client's asyncio
    ``Reader``). Created by :meth:`Client.create_reader`."""

    def __init__(self, reader: SyncReader, client: Client) -> None:
        self._reader = reader
        self._client = client
        self._waiting = _Waiting()
        self._what = f"reader of {reader.topic()}"

    def _look(self) -> Message | None:
        try:
            return self._reader.read_next(timeout_millis=0)
        except Timeout:
            return None

    def _look_here(self) -> Message | None:
        return self._reader._read_buffered()

    def _commit_waiter(self) -> CommitWaiter | None:
        return self._reader._reader._waiter

    async def read_next(self) -> Message:
        """The next message, waiting as long as it takes.

        Raises
        ------
        PulsarException
            ``AlreadyClosed`` if the reader is (or gets) closed.
        """
        return await self._next()

    async def has_message_available(self) -> bool:
        """Whether a message is there to read from the current position."""
        if self._waiting.handoff:
            return True
        return await self._client._run(self._reader.has_message_available)

    async def seek(self, messageid: MessageId | int) -> None:
        """Move to a message id or a publish time (epoch ms).

        Raises
        ------
        ValueError
            If ``messageid`` is neither.
        """
        if isinstance(messageid, bool) or not isinstance(messageid, MessageId | int):
            raise ValueError(f"invalid messageid type {type(messageid)}")
        w = self._waiting
        await w.settle()
        await self._client._run(self._reader.seek, messageid)
        w.handoff.clear()

    async def close(self) -> None:
        """Close the reader; reads waiting on it raise ``AlreadyClosed``.

        Raises
        ------
        PulsarException
            ``AlreadyClosed`` if it was closed before (by ``close`` or the client).
        """
        if not self._reader.is_connected():
            raise PulsarException(Result.AlreadyClosed, f"{self._what} is already closed")
        self._waiting.wake()
        await self._client._run(self._reader.close)

    def topic(self) -> str:
        """The topic read."""
        return self._reader.topic()

    def is_connected(self) -> bool:
        """Whether the reader is open."""
        return self._reader.is_connected() and not self._waiting.closing
