"""The client consumer's dead-letter and retry-letter topics (:class:`DeadLetters`): the two
producers that copy messages there with Pulsar's properties, made on first use, and the rules
of ``reconsume_later`` (delays, levels, counts). Acknowledging the originals is the caller's.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Callable

from filepulsar.connector.client.message import Message
from filepulsar.connector.client.types import ConsumerDeadLetterPolicy
from filepulsar.dispatch.redelivery import (
    PROPERTY_DELAY_TIME,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIMES,
    delay_of_level,
    retry_goes_to_dead_letter,
)
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import InvalidConfiguration
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


class DeadLetters:
    """The consumer's dead-letter and retry-letter topics and their producers.

    Parameters
    ----------
    store, clock
        Where the topics live; the producers' clock.
    policy
        The dead-letter policy (None: no dead-letter topic; ``retry_enable`` makes one).
    dlq_topic, retry_topic
        The topics' full names (None: not used).
    delay_levels
        ``reconsume_later``'s delay levels, in ms.
    name, subscription
        The consumer's name and subscription, in the producers' names.
    """

    def __init__(
        self,
        store: BlobStore,
        *,
        policy: ConsumerDeadLetterPolicy | None,
        dlq_topic: str | None,
        retry_topic: str | None,
        delay_levels: tuple[int, ...],
        clock: Callable[[], int],
        name: str,
        subscription: str,
    ) -> None:
        self._store = store
        self._policy = policy
        self._dlq_topic = dlq_topic
        self._retry_topic = retry_topic
        self._delay_levels = delay_levels
        self._clock = clock
        self._name = name
        self._subscription = subscription
        self._dlq_producer: StorageProducer | None = None
        self._retry_producer: StorageProducer | None = None

    def _producer(self, topic: str, kind: str) -> StorageProducer:
        # Copies of chunked messages are as large as the reassembled message: chunking on
        # (which needs batching off; storage chunks persistent topics only).
        p = StorageProducer(
            self._store,
            topic,
            producer_name=f"{self._subscription}-{self._name}-{uuid.uuid4().hex[:8]}-{kind}",
            batching_enabled=False,
            chunking_enabled=TopicName.parse(topic).persistent,
            clock=self._clock,
        )
        return p

    def _dlq(self) -> StorageProducer:
        if self._dlq_producer is None:
            assert self._dlq_topic is not None and self._policy is not None
            self._dlq_producer = self._producer(self._dlq_topic, "DLQ")
            initial = self._policy.initial_subscription_name
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

    def send(self, msgs: list[Message]) -> None:
        """Copy ``msgs`` to the dead-letter topic (its producer is made on first use)."""
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

    @staticmethod
    def _delay_of(levels: tuple[int, ...], level: int) -> int:
        try:
            return delay_of_level(levels, level)
        except ValueError as e:
            raise InvalidConfiguration(str(e)) from e

    def retry_delay(
        self, delay_ms: int | float | datetime.timedelta | None, delay_level: int | None
    ) -> int:
        """The delay ``reconsume_later`` asked for in ms (-1: by the retry's count).

        Raises
        ------
        InvalidConfiguration
            For a bad delay or level, or both.
        """
        if delay_ms is not None and delay_level is not None:
            raise InvalidConfiguration("reconsume_later takes delay_ms or delay_level, not both")
        delay = _ms(delay_ms, "delay_ms") if delay_ms is not None else -1
        if delay_level is not None:
            delay = self._delay_of(self._delay_levels, delay_level)
        return delay

    def retry(self, message: Message, delay: int, properties: dict[str, str] | None) -> None:
        """Copy ``message`` to the retry topic, delivered after ``delay`` ms (-1: the level of
        its retry count), or to the dead-letter topic once its retries exceed the policy's
        ``max_redeliver_count``; with Pulsar's properties and ``properties`` merged in."""
        props = message.properties()
        if properties:
            props.update(properties)
        times = int(props.get(PROPERTY_RECONSUME_TIMES, "0")) + 1  # 1 on the first retry
        if delay < 0:  # increasing levels: the n-th retry waits level n
            delay = delay_of_level(self._delay_levels, times)
        props.setdefault(PROPERTY_REAL_TOPIC, message.topic_name())
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, str(message.message_id()))
        props[PROPERTY_RECONSUME_TIMES] = str(times)
        props[PROPERTY_DELAY_TIME] = str(delay)
        assert self._policy is not None and self._retry_topic is not None
        if retry_goes_to_dead_letter(times, self._policy.max_redeliver_count):
            self._send_copy(self._dlq(), message, props)
        else:
            if self._retry_producer is None:
                self._retry_producer = self._producer(self._retry_topic, "RETRY")
            self._send_copy(self._retry_producer, message, props, deliver_after=delay)

    def close(self) -> None:
        """Close the producers made."""
        for prod in (self._dlq_producer, self._retry_producer):
            if prod is not None:
                prod.close()
