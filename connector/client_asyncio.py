"""The asyncio client (pulsar-client's ``pulsar.asyncio``): ``Client``, ``Producer``,
``Consumer``, ``Reader`` and ``PulsarException``, built on the synchronous client.

Shaped like pulsar-client's asyncio module (``from pulsar.asyncio import Client`` becomes
``from filepulsar.asyncio import Client``; the service URL is the storage root)::

    client = Client("/data/pulsar")
    producer = await client.create_producer("orders")
    msg_id = await producer.send(b"hello")
    consumer = await client.subscribe("orders", "billing")
    msg = await consumer.receive()
    await consumer.acknowledge(msg)
    await client.close()

How it maps onto the synchronous client (:mod:`connector.client`):

- ``Producer.send`` queues the message with the producer's ``send_async`` on the calling
  thread and completes a future from its callback (``loop.call_soon_threadsafe``), so the
  event loop never waits for storage. As in pulsar-client's asyncio API, batching is on by
  default, so messages sent together share entries.
- Everything else that touches storage (``subscribe``, ``acknowledge``, ``seek``, ``flush``,
  ``close`` ...) runs on a thread pool owned by the client (``max_blocking_threads``
  workers), never on the loop's default executor.
- ``Consumer.receive`` and ``Reader.read_next`` do not hold a worker while they wait: a
  message already fetched into the receiver queue is taken on the loop's thread (in-memory,
  never waiting on the consumer's lock); otherwise each look for a message is one short job
  on the pool, and between looks the coroutine sleeps on the loop until a commit lands on the
  topic (the synchronous client's wake-ups, ``storage.watch``; re-checking every 250 ms), or,
  where nothing can be watched, for 1 ms doubling to the poll interval (50 ms). Any number
  of consumers may wait at once without starving each other or ``subscribe``.
- Cancelling a ``receive`` (``asyncio.wait_for`` timing out, a task cancelled) loses no
  message: a look that had not started is cancelled and takes nothing; a look already running
  when the caller went away hands what it took to the next ``receive`` of that consumer, in
  order.
- ``close()`` of a consumer or reader (and of the client) wakes receives waiting on it: they
  raise ``PulsarException`` with ``Result.AlreadyClosed``.

Errors are :class:`PulsarException` (a :class:`~filepulsar.storage.errors.FilePulsarError`)
whose ``error()`` is the :class:`~filepulsar.storage.producer.Result` code of the failure; the
synchronous client's exception is its ``__cause__``. Errors caused by a bad argument are also
``ValueError`` s, as pulsar-client raises ``ValueError`` for those.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import re
import threading
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from filepulsar.connector.client import Client as SyncClient
from filepulsar.connector.client import Producer as SyncProducer
from filepulsar.connector.client import Reader as SyncReader
from filepulsar.connector.client_consumer import Consumer as SyncConsumer
from filepulsar.connector.client_message import Message
from filepulsar.connector.client_types import (
    BatchingType,
    CompressionType,
    ConsumerBatchReceivePolicy,
    ConsumerCryptoFailureAction,
    ConsumerDeadLetterPolicy,
    ConsumerKeySharedPolicy,
    ConsumerType,
    HashingScheme,
    InitialPosition,
    PartitionsRoutingMode,
    ProducerAccessMode,
    RegexSubscriptionMode,
    Timeout,
)
from filepulsar.dispatch.redelivery import MultiplierRedeliveryBackoff
from filepulsar.storage.cursor import DEFAULT_LEASE_MS
from filepulsar.storage.errors import FilePulsarError, IncompatibleFormat, ProducerClosed
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.producer import Result
from filepulsar.storage.watch import CommitWaiter, poll_interval_s, recheck_interval_s

__all__ = ["Client", "Consumer", "Producer", "PulsarException", "Reader"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_POLL_MIN_S = 0.001  # receive/read_next: pause after an empty look, doubling to the poll interval
DEFAULT_BLOCKING_THREADS = 16


class PulsarException(FilePulsarError):
    """An asyncio operation failed (pulsar-client's ``pulsar.asyncio.PulsarException``).

    Parameters
    ----------
    result
        The failure's result code, returned by :meth:`error`.
    msg
        What went wrong, in words (optional).
    """

    def __init__(self, result: Result, msg: str | None = None) -> None:
        super().__init__(result, msg)
        self._result = result
        self._msg = msg

    def error(self) -> Result:
        """The result code of the failure."""
        return self._result

    def __str__(self) -> str:
        head = f"{self._result.value} {self._result.name}"
        return f"{head}: {self._msg}" if self._msg else head


class _PulsarValueError(PulsarException, ValueError):
    """A PulsarException caused by a bad argument: ``except ValueError`` catches it too."""


#: Exceptions of the synchronous client whose name is not a Result member's.
_RESULT_OF: dict[type[BaseException], Result] = {
    ProducerClosed: Result.AlreadyClosed,
    IncompatibleFormat: Result.UnsupportedVersionError,
}


def _result_of(e: BaseException) -> Result:
    for cls in type(e).__mro__:
        if cls in _RESULT_OF:
            return _RESULT_OF[cls]
        found = Result.__members__.get(cls.__name__)
        if found is not None and found is not Result.Ok:
            return found
    return Result.UnknownError


def _convert(e: FilePulsarError) -> PulsarException:
    """The asyncio API's exception for ``e`` (raise it ``from e``)."""
    if isinstance(e, PulsarException):
        return e
    kind = _PulsarValueError if isinstance(e, ValueError) else PulsarException
    return kind(_result_of(e), str(e) or type(e).__name__)


def _set_future(future: asyncio.Future[Any], result: Result, value: Any) -> None:
    """Complete ``future`` from any thread: with ``value`` if ``result`` is ``Ok``, else with
    a PulsarException. A future already done or cancelled is left as it is."""

    def complete() -> None:
        if future.done():
            return
        if result is Result.Ok:
            future.set_result(value)
        else:
            future.set_exception(PulsarException(result))

    future.get_loop().call_soon_threadsafe(complete)


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

        def woken() -> None:  # on the watcher thread
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


class Producer:
    """Publishes messages on a topic (pulsar-client's asyncio ``Producer``).

    Created by :meth:`Client.create_producer`.
    """

    def __init__(self, producer: SyncProducer, client: Client) -> None:
        self._producer = producer
        self._client = client
        self._completer = _Completer()

    async def send(
        self,
        content: Any,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        ordering_key: str | None = None,
        sequence_id: int | None = None,
        replication_clusters: list[str] | None = None,
        disable_replication: bool | None = None,
        event_timestamp: int | None = None,
        deliver_at: int | None = None,
        deliver_after: timedelta | None = None,
    ) -> MessageId:
        """Send a message; returns its id once it is stored.

        Parameters are pulsar-client's (see the synchronous ``Producer.send``);
        ``replication_clusters`` and ``disable_replication`` have no effect (one storage root,
        nothing to replicate to). Cancelling the await does not withdraw the message.

        Raises
        ------
        PulsarException
            ``MessageTooBig``, ``AlreadyClosed``, ``ProducerQueueIsFull``, ``ProducerFenced``
            or ``UnknownError`` (the write failed; the message says why).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[MessageId] = loop.create_future()
        inner = self._producer._inner
        completer = self._completer

        def done(result: Result, msg_id: MessageId | None) -> None:
            why = None if result is Result.Ok or inner._error is None else str(inner._error)
            completer.add(future, result, msg_id, why)

        args = (
            content,
            done,
            properties,
            partition_key,
            ordering_key,
            sequence_id,
            replication_clusters,
            bool(disable_replication),
            event_timestamp,
            deliver_at,
            deliver_after,
        )
        if inner.block_if_queue_full:
            # Queueing may wait for room: not on the loop.
            await self._client._run(self._producer.send_async, *args)
        else:
            try:
                self._producer.send_async(*args)
            except FilePulsarError as e:
                raise _convert(e) from e
        return await future

    async def flush(self) -> None:
        """Wait until every message sent so far is stored.

        Raises
        ------
        PulsarException
            If a pending write failed.
        """
        await self._client._run(self._producer.flush)

    async def close(self) -> None:
        """Flush and close the producer.

        Raises
        ------
        PulsarException
            ``AlreadyClosed`` if it was closed before (by this method or the client).
        """
        if self._producer._closed:
            raise PulsarException(
                Result.AlreadyClosed, f"producer {self.producer_name()!r} is already closed"
            )
        await self._client._run(self._producer.close)

    def topic(self) -> str:
        """The topic the producer publishes to."""
        return self._producer.topic()

    def producer_name(self) -> str:
        """The producer's name (given, or generated)."""
        return self._producer.producer_name()

    def last_sequence_id(self) -> int:
        """The highest sequence id stored by this producer (-1 if none)."""
        return self._producer.last_sequence_id()

    def is_connected(self) -> bool:
        """Whether the producer is open and has not failed."""
        return self._producer.is_connected()


class _Completer:
    """Completes ``send`` futures on their loops from the producer's I/O thread, with one
    wake-up of a loop per burst of callbacks (a batch's messages complete together) rather
    than one per message."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[
            asyncio.AbstractEventLoop,
            list[tuple[asyncio.Future[Any], Result, Any, str | None]],
        ] = {}

    def add(self, future: asyncio.Future[Any], result: Result, value: Any, why: str | None) -> None:
        loop = future.get_loop()
        with self._lock:
            items = self._pending.get(loop)
            first = items is None
            if items is None:
                items = self._pending[loop] = []
            items.append((future, result, value, why))
        if first:
            loop.call_soon_threadsafe(self._complete, loop)

    def _complete(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            items = self._pending.pop(loop, [])
        for future, result, value, why in items:
            if future.done():  # cancelled by the caller; the message is stored all the same
                continue
            if result is Result.Ok:
                future.set_result(value)
            else:
                future.set_exception(PulsarException(result, why))


class _Receiving:
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
                raise _convert(e) from e
            if msg is not None:
                if w.closing:
                    # Closed meanwhile: the message stays unacknowledged and goes back to the
                    # subscription with the consumer's close.
                    self._check_open()
                return msg
            if waiter is not None and seen is not None and waiter.watched:
                # Woken by a commit (storage.watch), re-checking now and then as the
                # synchronous consumer does; a commit during the look ends the pause at once.
                await w.pause(recheck_interval_s(), waiter=waiter, seen=seen)
                continue
            await w.pause(delay)
            delay = min(delay * 2, poll_interval_s())


class Consumer(_Receiving):
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
        """Acknowledge one message (a Message or a MessageId); durable when this returns."""
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


class Reader(_Receiving):
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


class Client:
    """The asyncio client (pulsar-client's ``pulsar.asyncio.Client``) over a storage root.

    Parameters
    ----------
    service_url
        The storage root (see :class:`connector.client.Client`).
    max_blocking_threads
        Workers of the client's own thread pool, which runs the storage work of every call
        (filepulsar's; waiting receives hold none).
    **kwargs
        The synchronous ``Client``'s keyword arguments (``storage_options``, pulsar-client's
        connection settings, which have no effect, ...).
    """

    def __init__(
        self,
        service_url: str,
        *,
        max_blocking_threads: int = DEFAULT_BLOCKING_THREADS,
        **kwargs: Any,
    ) -> None:
        if (
            not isinstance(max_blocking_threads, int)
            or isinstance(max_blocking_threads, bool)
            or max_blocking_threads < 1
        ):
            raise ValueError(
                f"max_blocking_threads must be an integer >= 1, got {max_blocking_threads!r}"
            )
        self._client = SyncClient(service_url, **kwargs)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_blocking_threads, thread_name_prefix="filepulsar-asyncio"
        )
        self._receivers: list[_Receiving] = []
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ plumbing
    def _submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        with self._lock:
            if self._closed:
                raise PulsarException(Result.AlreadyClosed, "client is closed")
            return self._pool.submit(fn, *args)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the client's pool; its errors as PulsarException."""
        cf = self._submit(functools.partial(fn, *args, **kwargs))
        try:
            return await asyncio.wrap_future(cf)
        except FilePulsarError as e:
            raise _convert(e) from e

    def _keep(self, r: _Receiving) -> None:
        with self._lock:
            self._receivers = [x for x in self._receivers if not x._waiting.closing]
            self._receivers.append(r)

    def _wake_all(self) -> None:
        with self._lock:
            receivers, self._receivers = self._receivers, []
        for r in receivers:
            r._waiting.wake()

    # ------------------------------------------------------------------ API
    async def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        schema: Any = None,
        initial_sequence_id: int | None = None,
        send_timeout_millis: int = 30000,
        compression_type: CompressionType = CompressionType.NONE,
        max_pending_messages: int = 1000,
        max_pending_messages_across_partitions: int = 50000,
        block_if_queue_full: bool = False,
        batching_enabled: bool = True,
        batching_max_messages: int = 1000,
        batching_max_allowed_size_in_bytes: int = 128 * 1024,
        batching_max_publish_delay_ms: int = 10,
        chunking_enabled: bool = False,
        message_routing_mode: PartitionsRoutingMode = PartitionsRoutingMode.RoundRobinDistribution,
        lazy_start_partitioned_producers: bool = False,
        properties: dict[str, str] | None = None,
        batching_type: BatchingType = BatchingType.Default,
        encryption_key: str | None = None,
        crypto_key_reader: Any = None,
        access_mode: ProducerAccessMode = ProducerAccessMode.Shared,
        message_router: Callable[[Any, int], int] | None = None,
        *,
        hashing_scheme: HashingScheme = HashingScheme.JavaStringHash,
        max_pending_bytes: int = 64 * 1024 * 1024,
    ) -> Producer:
        """Create a producer on ``topic``.

        Parameters and defaults are pulsar-client's asyncio ``create_producer``'s, which
        differ from the synchronous one in one point: batching is on by default. See
        :meth:`connector.client.Client.create_producer` for what each means here; the
        keyword-only ones are filepulsar's.

        Raises
        ------
        ValueError
            If batching and chunking are both enabled, or an argument is wrong.
        PulsarException
            ``TopicNotFound`` (missing topic, no auto-creation), ``ProducerBusy``,
            ``ProducerFenced`` ...
        """
        if batching_enabled and chunking_enabled:
            raise ValueError("Batching and chunking of messages can't be enabled together.")
        sync = await self._run(
            self._client.create_producer,
            topic,
            producer_name=producer_name,
            schema=schema,
            initial_sequence_id=initial_sequence_id,
            send_timeout_millis=send_timeout_millis,
            compression_type=compression_type,
            max_pending_messages=max_pending_messages,
            max_pending_messages_across_partitions=max_pending_messages_across_partitions,
            block_if_queue_full=block_if_queue_full,
            batching_enabled=batching_enabled,
            batching_max_messages=batching_max_messages,
            batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms=batching_max_publish_delay_ms,
            chunking_enabled=chunking_enabled,
            message_routing_mode=message_routing_mode,
            lazy_start_partitioned_producers=lazy_start_partitioned_producers,
            properties=properties,
            batching_type=batching_type,
            encryption_key=encryption_key,
            crypto_key_reader=crypto_key_reader,
            access_mode=access_mode,
            message_router=message_router,
            hashing_scheme=hashing_scheme,
            max_pending_bytes=max_pending_bytes,
        )
        return Producer(sync, self)

    async def subscribe(
        self,
        topic: str | list[str] | re.Pattern[str],
        subscription_name: str,
        consumer_type: ConsumerType = ConsumerType.Exclusive,
        schema: Any = None,
        receiver_queue_size: int = 1000,
        max_total_receiver_queue_size_across_partitions: int = 50000,
        consumer_name: str | None = None,
        unacked_messages_timeout_ms: int | None = None,
        broker_consumer_stats_cache_time_ms: int = 30000,
        negative_ack_redelivery_delay_ms: int = 60000,
        is_read_compacted: bool = False,
        properties: dict[str, str] | None = None,
        initial_position: InitialPosition = InitialPosition.Latest,
        crypto_key_reader: Any = None,
        replicate_subscription_state_enabled: bool = False,
        max_pending_chunked_message: int = 10,
        auto_ack_oldest_chunked_message_on_queue_full: bool = False,
        start_message_id_inclusive: bool = False,
        batch_receive_policy: ConsumerBatchReceivePolicy | None = None,
        key_shared_policy: ConsumerKeySharedPolicy | None = None,
        batch_index_ack_enabled: bool = False,
        regex_subscription_mode: RegexSubscriptionMode = RegexSubscriptionMode.PersistentOnly,
        dead_letter_policy: ConsumerDeadLetterPolicy | None = None,
        crypto_failure_action: ConsumerCryptoFailureAction = ConsumerCryptoFailureAction.FAIL,
        is_pattern_topic: bool = False,
        *,
        pattern_auto_discovery_period: int = 60,
        subscription_properties: dict[str, str] | None = None,
        retry_enable: bool = False,
        negative_ack_redelivery_backoff: MultiplierRedeliveryBackoff | None = None,
        ack_timeout_redelivery_backoff: MultiplierRedeliveryBackoff | None = None,
        tick_duration_ms: int = 1000,
        priority_level: int = 0,
        consumer_lease_ms: int = DEFAULT_LEASE_MS,
    ) -> Consumer:
        """Subscribe to a topic, a list of topics, or (``is_pattern_topic=True``) a regex.

        Parameters and defaults are pulsar-client's asyncio ``subscribe``'s; see
        :meth:`connector.client.Client.subscribe` for what each means here. The keyword-only
        ones are filepulsar's.

        Raises
        ------
        ValueError
            If ``topic`` is a list with ``is_pattern_topic``, not a str or list, or another
            argument is wrong.
        PulsarException
            ``ConsumerBusy`` (Exclusive subscription in use) ...
        """
        if isinstance(topic, list | tuple):
            if is_pattern_topic:
                raise ValueError(
                    "Argument 'topic' must be a string when 'is_pattern_topic' is True; "
                    "lists of topics do not support pattern subscriptions"
                )
        elif not isinstance(topic, str | re.Pattern):
            raise ValueError("Argument 'topic' is expected to be of type 'str' or 'list'")
        sync = await self._run(
            self._client.subscribe,
            topic,
            subscription_name,
            consumer_type=consumer_type,
            schema=schema,
            receiver_queue_size=receiver_queue_size,
            max_total_receiver_queue_size_across_partitions=(
                max_total_receiver_queue_size_across_partitions
            ),
            consumer_name=consumer_name,
            unacked_messages_timeout_ms=unacked_messages_timeout_ms,
            broker_consumer_stats_cache_time_ms=broker_consumer_stats_cache_time_ms,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
            is_read_compacted=is_read_compacted,
            properties=properties,
            pattern_auto_discovery_period=pattern_auto_discovery_period,
            initial_position=initial_position,
            crypto_key_reader=crypto_key_reader,
            replicate_subscription_state_enabled=replicate_subscription_state_enabled,
            max_pending_chunked_message=max_pending_chunked_message,
            auto_ack_oldest_chunked_message_on_queue_full=(
                auto_ack_oldest_chunked_message_on_queue_full
            ),
            start_message_id_inclusive=start_message_id_inclusive,
            batch_receive_policy=batch_receive_policy,
            key_shared_policy=key_shared_policy,
            batch_index_ack_enabled=batch_index_ack_enabled,
            regex_subscription_mode=regex_subscription_mode,
            dead_letter_policy=dead_letter_policy,
            crypto_failure_action=crypto_failure_action,
            is_pattern_topic=is_pattern_topic,
            subscription_properties=subscription_properties,
            retry_enable=retry_enable,
            negative_ack_redelivery_backoff=negative_ack_redelivery_backoff,
            ack_timeout_redelivery_backoff=ack_timeout_redelivery_backoff,
            tick_duration_ms=tick_duration_ms,
            priority_level=priority_level,
            consumer_lease_ms=consumer_lease_ms,
        )
        consumer = Consumer(sync, self)
        self._keep(consumer)
        return consumer

    async def create_reader(
        self,
        topic: str,
        start_message_id: MessageId,
        schema: Any = None,
        receiver_queue_size: int = 1000,
        reader_name: str | None = None,
        subscription_role_prefix: str | None = None,
        is_read_compacted: bool = False,
        crypto_key_reader: Any = None,
        start_message_id_inclusive: bool = False,
        crypto_failure_action: ConsumerCryptoFailureAction = ConsumerCryptoFailureAction.FAIL,
    ) -> Reader:
        """Create a reader of ``topic`` from ``start_message_id`` (``MessageId.earliest``,
        ``MessageId.latest`` or an id; exclusive unless ``start_message_id_inclusive``).

        Raises
        ------
        ValueError
            If ``start_message_id`` is not a MessageId, or another argument is wrong.
        PulsarException
            ``TopicNotFound`` (missing topic, no auto-creation) ...
        """
        if not isinstance(start_message_id, MessageId):
            raise ValueError(
                "Argument start_message_id is expected to be of type 'MessageId' and not "
                f"'{type(start_message_id).__name__}'"
            )
        sync = await self._run(
            self._client.create_reader,
            topic,
            start_message_id,
            schema=schema,
            receiver_queue_size=receiver_queue_size,
            reader_name=reader_name,
            subscription_role_prefix=subscription_role_prefix,
            is_read_compacted=is_read_compacted,
            crypto_key_reader=crypto_key_reader,
            start_message_id_inclusive=start_message_id_inclusive,
            crypto_failure_action=crypto_failure_action,
        )
        reader = Reader(sync, self)
        self._keep(reader)
        return reader

    async def get_topic_partitions(self, topic: str) -> list[str]:
        """Partition names of a partitioned topic, or ``[topic]`` for a non-partitioned one
        (a missing topic is auto-created per the namespace policies)."""
        if not isinstance(topic, str):
            raise ValueError(
                f"Argument topic is expected to be of type 'str' and not '{type(topic).__name__}'"
            )
        return await self._run(self._client.get_topic_partitions, topic)

    def shutdown(self) -> None:
        """Close every producer, consumer and reader now, without raising (blocks the
        calling thread while producers flush)."""
        self._wake_all()
        with self._lock:
            self._closed = True
        self._client.shutdown()
        self._pool.shutdown(wait=False)

    async def close(self) -> None:
        """Close every producer (flushing it), consumer and reader of this client.

        Raises
        ------
        PulsarException
            If closing one of them failed (the others are closed nevertheless).

        Closing a closed (or shut down) client does nothing.
        """
        with self._lock:
            if self._closed:
                return
        self._wake_all()
        try:
            await self._run(self._client.close)
        finally:
            with self._lock:
                self._closed = True
            self._pool.shutdown(wait=False)
