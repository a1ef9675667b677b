"""The client consumer's topics: subscribing each partition of the topics named, and the
topics of a pattern subscription (listed at the start and re-listed by the housekeeping
thread, picking up new topics and dropping deleted ones).

Part of :class:`~filepulsar.connector.client.consumer.Consumer` (a base class of it).
"""

from __future__ import annotations

import logging

from filepulsar.connector.client.dead_letter import _DeadLetters
from filepulsar.connector.client.queue import _Part
from filepulsar.connector.client.schema import bind_for_reading
from filepulsar.connector.client.types import (
    RegexSubscriptionMode,
)
from filepulsar.storage.errors import FilePulsarError
from filepulsar.storage.names import DOMAINS, TopicName
from filepulsar.storage.policies import effective_policies
from filepulsar.storage.subscription import (
    SubscriptionConsumer,
)
from filepulsar.storage.topics import ensure_topic, match_topics, partitions_of

#: The domains a pattern consumer's topics are listed in (pulsar-client's regex_subscription_mode).
_REGEX_DOMAINS = {
    RegexSubscriptionMode.PersistentOnly: ("persistent",),
    RegexSubscriptionMode.NonPersistentOnly: ("non-persistent",),
    RegexSubscriptionMode.AllTopics: DOMAINS,
}

log = logging.getLogger("filepulsar.connector.client.consumer")  # the Consumer's logger, as before


class _Topics(_DeadLetters):
    """Adding, discovering and dropping the consumer's topics."""

    # ------------------------------------------------------------------ topics
    def _discover(self) -> list[str]:
        assert self._pattern is not None
        return [str(info.name) for info in match_topics(self._store, self._pattern)]

    def _add_topic(self, topic: str) -> None:
        t = TopicName.parse(topic)
        n = ensure_topic(self._store, t)
        bind_for_reading(
            self._store, t, self._schema, effective_policies(self._store, t), clock=self._clock
        )
        names = [t.partition(i) for i in range(n)] if n else [t]
        have = {p.topic for p in self._parts}
        for name in names:
            if name in have:
                continue
            sc = SubscriptionConsumer(
                self._store,
                name,
                self._subscription,
                sub_type=self._sub_type,
                consumer_name=self._consumer_name,
                initial_position=self._initial,
                priority_level=self._priority,
                key_shared_mode=self._ks_mode,
                sticky_ranges=self._ks_ranges,
                lease_ms=self._lease_ms,
                subscription_properties=self._sub_props,
                use_consistent_hashing=self._ks_consistent,
                clock=self._clock,
                read_compacted=self._read_compacted and str(t) != self._retry_topic,
                # Key_Shared without a claim commit per delivery, unless a dead-letter policy
                # counts redeliveries (a crash must count for the messages it held).
                lazy_claims=self._dlq_policy is None,
            )
            self._parts.append(_Part(sc, name))
            tags = frozenset(sc.subscription_properties)
            if self._tags and tags != self._tags:
                log.warning(
                    "subscription %r on %s has tags %s, other topics have %s",
                    self._subscription,
                    name,
                    sorted(tags),
                    sorted(self._tags),
                )
            self._tags = self._tags | tags

    def _rediscover(self) -> None:
        assert self._pattern is not None
        current = set(self._discover())
        known = {p.topic.base for p in self._parts}
        for t in sorted(current):
            if TopicName.parse(t) not in known:
                try:
                    self._add_topic(t)
                    log.info("pattern consumer %s picked up %s", self._consumer_name, t)
                except FilePulsarError as e:
                    log.warning("pattern consumer could not subscribe to %s: %s", t, e)
        wanted = {TopicName.parse(t) for t in current}
        if self._retry_topic is not None:
            wanted.add(TopicName.parse(self._retry_topic))
        for p in [p for p in self._parts if p.topic.base not in wanted]:
            if partitions_of(self._store, p.topic.base) is None:  # the topic was deleted
                self._acks.discard(p.sc)
                self._drop_part_queue(p)
                self._parts.remove(p)
                try:
                    p.sc.close()
                except FilePulsarError:
                    pass
