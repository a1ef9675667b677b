"""The asyncio client's :class:`Producer`: ``send`` queues on the synchronous producer and
completes its future from the producer's callback (:class:`_Completer` batches the wake-ups of
the event loop); everything else runs on the client's thread pool.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from filepulsar.connector.client.asyncio.errors import PulsarException, to_pulsar_exception
from filepulsar.connector.client.producer import Producer as SyncProducer
from filepulsar.storage.errors import FilePulsarError
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.producer import Result

if TYPE_CHECKING:
    from filepulsar.connector.client.asyncio import Client


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
            why = None if result is Result.Ok or inner.error is None else str(inner.error)
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
                raise to_pulsar_exception(e) from e
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
