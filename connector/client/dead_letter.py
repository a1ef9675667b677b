"""The client consumer's dead-letter and retry-letter topics: the producers that copy
messages there with Pulsar's properties, and ``reconsume_later``.

Part of :class:`~filepulsar.connector.client.consumer.Consumer` (a base class of it).
"""

from __future__ import annotations

import datetime
import logging
import uuid

from filepulsar.connector.client.acks import _Acknowledging
from filepulsar.connector.client.message import Message
from filepulsar.connector.client.queue import _Entry
from filepulsar.dispatch.redelivery import (
    PROPERTY_DELAY_TIME,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIMES,
    delay_of_level,
    retry_goes_to_dead_letter,
)
from filepulsar.storage.errors import FilePulsarError, InvalidConfiguration
from filepulsar.storage.names import TopicName
from filepulsar.storage.producer import Producer as StorageProducer
from filepulsar.storage.subscriptions import ensure_subscription
from filepulsar.storage.topics import partitions_of

log = logging.getLogger("filepulsar.connector.client.consumer")  # the Consumer's logger, as before


def _ms(value: int | float | datetime.timedelta, what: str) -> int:
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidConfiguration(f"{what} must be >= 0 ms or a timedelta, got {value!r}")
    return int(value)


class _DeadLetters(_Acknowledging):
    """Dead-lettering and retrying messages."""

    # ------------------------------------------------------------------ dead and retry letters
    def _dead_letter(self, ent: _Entry, msgs: list[Message] | None = None) -> None:
        """Send ``msgs`` of ``ent`` (default: all its unacknowledged messages, queued ones
        too) to the dead-letter topic, drop those still in the receiver queue (they must not
        be delivered again) and acknowledge them."""
        if msgs is None:
            msgs = self._unacked_messages(ent)
        self._to_dead_letter(msgs)
        rows = {m._r for m in msgs}
        self._drop_queued(lambda e: e is ent, rows)
        self._ack([self._resolve(m) for m in msgs])

    def _try_dead_letter(self, ent: _Entry, msgs: list[Message] | None = None) -> bool:
        """:meth:`_dead_letter`; on a storage error log it and return False (the caller
        redelivers the entry instead, as Pulsar's client does when the DLQ send fails)."""
        try:
            self._dead_letter(ent, msgs)
        except (FilePulsarError, OSError):
            log.exception(
                "consumer %s (subscription %r): dead-lettering entry %d:%d of %s failed; "
                "redelivering it instead",
                self._consumer_name,
                self._subscription,
                ent.pos[0],
                ent.pos[1],
                ent.part.topic_str,
            )
            return False
        return True

    def _producer(self, topic: str, kind: str) -> StorageProducer:
        # Copies of chunked messages are as large as the reassembled message: chunking on
        # (which needs batching off; storage chunks persistent topics only).
        p = StorageProducer(
            self._store,
            topic,
            producer_name=f"{self._subscription}-{self._consumer_name}-{uuid.uuid4().hex[:8]}-{kind}",
            batching_enabled=False,
            chunking_enabled=TopicName.parse(topic).persistent,
            clock=self._clock,
        )
        return p

    def _dlq(self) -> StorageProducer:
        if self._dlq_producer is None:
            assert self._dlq_topic is not None and self._dlq_policy is not None
            self._dlq_producer = self._producer(self._dlq_topic, "DLQ")
            initial = self._dlq_policy.initial_subscription_name
            if initial:
                t = TopicName.parse(self._dlq_topic)
                n = partitions_of(self._store, t) or 0
                for name in [t.partition(i) for i in range(n)] if n else [t]:
                    ensure_subscription(self._store, name, initial, clock=self._clock)
        return self._dlq_producer

    @staticmethod
    def _send_copy(
        p: StorageProducer, m: Message, props: dict[str, str], deliver_after: int | None = None
    ) -> None:
        p.send(
            m.data(),
            properties=props,
            partition_key=m.partition_key() or None,
            ordering_key=m._v.column("ordering_key")[m._r] or None,  # the stored bytes
            event_timestamp=m.event_timestamp() or None,
            deliver_after=deliver_after,
        )

    def _to_dead_letter(self, msgs: list[Message]) -> None:
        p = self._dlq()
        for m in msgs:
            props = m.properties()
            props.setdefault(PROPERTY_REAL_TOPIC, m.topic_name())
            props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, str(m.message_id()))
            self._send_copy(p, m, props)
            log.info(
                "message %s of %s went to dead-letter topic %s",
                m.message_id(),
                m.topic_name(),
                self._dlq_topic,
            )

    def reconsume_later(
        self,
        message: Message,
        delay_ms: int | datetime.timedelta | None = None,
        properties: dict[str, str] | None = None,
        *,
        delay_level: int | None = None,
    ) -> None:
        """Retry a message later through the retry-letter topic (Pulsar's reconsumeLater).

        The copy's properties gain ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID`` (unless present),
        ``RECONSUMETIMES`` (1 on the first retry, then +1) and ``DELAY_TIME``; ``properties``
        are merged in. If ``RECONSUMETIMES`` exceeds the dead-letter policy's
        ``max_redeliver_count`` (16 without a policy) the copy goes to the dead-letter topic,
        else to the retry topic, delivered after the delay (Shared and Key_Shared
        subscriptions hold it; Exclusive and Failover deliver it at once, as Pulsar does).
        The original is acknowledged once the copy is stored.

        The delay is one of (the vendor guide's three modes): ``delay_ms`` (ms or a
        timedelta); ``delay_level=k``, the k-th of the consumer's ``retry_delay_levels``
        (default ``"1s 5s 10s 30s 1m 2m ... 1h 2h"``: level 1 is 1 s, level 3 10 s); or
        neither, increasing levels: the n-th retry of a message waits level n (1 s, 5 s,
        10 s, ..., then the last level).

        Raises
        ------
        InvalidConfiguration
            If the consumer was not subscribed with ``retry_enable=True``, for a bad delay or
            level, or both ``delay_ms`` and ``delay_level``.
        """
        if not self._retry_enable:
            raise InvalidConfiguration(
                "reconsume_later needs subscribe(..., retry_enable=True) (the consumer then "
                "also subscribes to the retry-letter topic)"
            )
        if not isinstance(message, Message):
            raise InvalidConfiguration("reconsume_later takes a received Message")
        if delay_ms is not None and delay_level is not None:
            raise InvalidConfiguration("reconsume_later takes delay_ms or delay_level, not both")
        delay = _ms(delay_ms, "delay_ms") if delay_ms is not None else -1
        if delay_level is not None:
            try:
                delay = delay_of_level(self._delay_levels, delay_level)
            except ValueError as e:
                raise InvalidConfiguration(str(e)) from e
        with self._lock:
            self._check_open()
            props = message.properties()
            if properties:
                props.update(properties)
            if PROPERTY_RECONSUME_TIMES in props:
                times = int(props[PROPERTY_RECONSUME_TIMES]) + 1
            else:
                times = 1
            if delay < 0:  # increasing levels: the n-th retry waits level n
                delay = delay_of_level(self._delay_levels, times)
            props.setdefault(PROPERTY_REAL_TOPIC, message.topic_name())
            props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, str(message.message_id()))
            props[PROPERTY_RECONSUME_TIMES] = str(times)
            props[PROPERTY_DELAY_TIME] = str(delay)
            assert self._dlq_policy is not None and self._retry_topic is not None
            if retry_goes_to_dead_letter(times, self._dlq_policy.max_redeliver_count):
                self._send_copy(self._dlq(), message, props)
            else:
                if self._retry_producer is None:
                    self._retry_producer = self._producer(self._retry_topic, "RETRY")
                self._send_copy(self._retry_producer, message, props, deliver_after=delay)
            self._ack([self._resolve(message)])
