"""The client consumer's topics (:class:`TopicSet`): a subscription on each partition of the
topics named, and the topics of a pattern subscription (listed at the start and re-listed by
the housekeeping thread, picking up new topics and dropping deleted ones).

A consumer of many partitions registers on them at once, as Pulsar's multi-topic consumer
subscribes to each of its topics concurrently, and leaves them at once on ``close``: each
registration is a durable commit of its own partition's subscription state, so done one after
another a subscription over 30 topics waits for 30 flushes in a row
(:func:`each_partition`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

from filepulsar.connector.client.consumer.records import Part
from filepulsar.connector.client.message import message_id_topic
from filepulsar.connector.client.schema import bind_for_reading
from filepulsar.connector.client.schema.codecs import Schema
from filepulsar.connector.client.types import OperationNotSupported, RegexSubscriptionMode
from filepulsar.dispatch.clock import Clock
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import FilePulsarError, InvalidConfiguration
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import DOMAINS, TopicName
from filepulsar.storage.policies import effective_policies
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.topics import TopicPattern, ensure_topic, match_topics, partitions_of

#: The domains a pattern consumer's topics are listed in (pulsar-client's regex_subscription_mode).
REGEX_DOMAINS = {
    RegexSubscriptionMode.PersistentOnly: ("persistent",),
    RegexSubscriptionMode.NonPersistentOnly: ("non-persistent",),
    RegexSubscriptionMode.AllTopics: DOMAINS,
}

log = logging.getLogger("filepulsar.connector.client.consumer")  # the Consumer's logger, as before

#: Opens the subscription on one managed ledger: (the ledger's name, its topic's name).
Subscribe = Callable[[TopicName, TopicName], SubscriptionConsumer]

#: Partitions one consumer registers on (or leaves) at once: a registration is mostly a wait
#: for its commit's flush, and flushes of different partitions overlap.
PARTITION_THREADS = 16

_I = TypeVar("_I")
_R = TypeVar("_R")


def each_partition(
    work: Callable[[_I], _R],
    items: Sequence[_I],
    *,
    undo: Callable[[_R], object] | None = None,
) -> list[tuple[_R | None, Exception | None]]:
    """``work(item)`` for every item, up to :data:`PARTITION_THREADS` at once (on the calling
    thread alone for one item); each one's result or the error it raised, in ``items``'
    order, once every one has ended. Interrupted meanwhile (a ``KeyboardInterrupt`` in the
    calling thread), it waits for those started, ``undo``-es what they did (each result) and
    raises."""

    def one(item: _I) -> tuple[_R | None, Exception | None]:
        try:
            return work(item), None
        except Exception as e:  # handed to the caller, which raises it (or logs it)
            return None, e

    if len(items) <= 1:
        return [one(i) for i in items]
    workers = min(len(items), PARTITION_THREADS)
    with ThreadPoolExecutor(workers, thread_name_prefix="filepulsar-partitions") as pool:
        futures = [pool.submit(one, i) for i in items]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            wait(futures)
            for f in futures:
                if not f.cancelled() and undo is not None:
                    result, _ = f.result()
                    if result is not None:
                        with contextlib.suppress(Exception):  # (the interrupt goes first)
                            undo(result)
            raise


def pattern_topics(store: BlobStore, pattern: TopicPattern) -> list[str]:
    """The topics ``pattern`` matches now."""
    return [str(info.name) for info in match_topics(store, pattern)]


class TopicSet:
    """The managed ledgers one consumer reads, in the order they were added.

    ``parts`` and ``tags`` are read by the other collaborators; only this object changes them.
    The consumer's lock is held by every caller.

    Parameters
    ----------
    store, schema, clock, waits
        Where the topics live, the consumer's value schema (bound to each topic's registry as
        a reader), the clock and what times the pattern's listings.
    subscribe
        Opens the subscription on a managed ledger (the consumer's settings are its own).
    pattern
        For a pattern subscription, the pattern re-listed by :meth:`rediscover`.
    retry_topic
        The retry-letter topic the consumer also reads (kept by :meth:`rediscover`; ids
        without a topic are not placed on it).
    label
        The topics as the consumer names them in errors.
    discovery_s
        Seconds between two listings of the pattern's topics.
    """

    def __init__(
        self,
        store: BlobStore,
        *,
        schema: Schema | None,
        clock: Callable[[], int],
        waits: Clock,
        subscribe: Subscribe,
        pattern: TopicPattern | None,
        retry_topic: str | None,
        label: str,
        discovery_s: int,
    ) -> None:
        self._store = store
        self._schema = schema
        self._clock = clock
        self._waits = waits
        self._subscribe = subscribe
        self.pattern = pattern
        self.label = label
        self._discovery_s = discovery_s
        self._next_discovery = 0.0
        self.retry_topic = retry_topic
        self.parts: list[Part] = []
        #: The subscription's tags (its properties' keys) on every topic, OR-ed.
        self.tags: frozenset[str] = frozenset()

    def add(self, topic: str) -> None:
        """Subscribe to every partition of ``topic`` not read yet (creating the topic)."""
        self.add_all([topic])

    def add_all(self, topics: Sequence[str]) -> None:
        """Subscribe to every partition of ``topics`` not read yet (creating the topics):
        the topics are created and their schemas bound in order, then the partitions are
        registered on at once (:func:`each_partition`) and added in order. If one fails,
        the partitions this call registered on are left and the first error (in order) is
        raised."""
        have = {p.topic for p in self.parts}
        todo: list[tuple[TopicName, TopicName]] = []
        for topic in topics:
            t = TopicName.parse(topic)
            n = ensure_topic(self._store, t)
            bind_for_reading(
                self._store, t, self._schema, effective_policies(self._store, t), clock=self._clock
            )
            for name in [t.partition(i) for i in range(n)] if n else [t]:
                if name not in have:
                    have.add(name)
                    todo.append((name, t))
        done = each_partition(
            lambda item: self._subscribe(*item), todo, undo=SubscriptionConsumer.close
        )
        failed = next((e for _, e in done if e is not None), None)
        if failed is not None:
            each_partition(SubscriptionConsumer.close, [sc for sc, _ in done if sc is not None])
            raise failed
        for (name, _), (sc, _) in zip(todo, done, strict=True):
            assert sc is not None
            self.parts.append(Part(sc, name))
            tags = frozenset(sc.subscription_properties)
            if self.tags and tags != self.tags:
                log.warning(
                    "subscription %r on %s has tags %s, other topics have %s",
                    sc.subscription,
                    name,
                    sorted(tags),
                    sorted(self.tags),
                )
            self.tags = self.tags | tags

    def rediscovery_due(self) -> bool:
        """Whether a pattern subscription should list its topics again (and counts from now)."""
        if self.pattern is None or self._waits.monotonic() < self._next_discovery:
            return False
        self._next_discovery = self._waits.monotonic() + self._discovery_s
        return True

    def rediscover(self, name: str, dropped: Callable[[Part], None]) -> None:
        """List the pattern's topics again: subscribe to new ones, drop the deleted ones
        (``dropped`` is called for each part dropped, before it is closed)."""
        assert self.pattern is not None
        current = set(pattern_topics(self._store, self.pattern))
        known = {p.topic.base for p in self.parts}
        for t in sorted(current):
            if TopicName.parse(t) not in known:
                try:
                    self.add(t)
                    log.info("pattern consumer %s picked up %s", name, t)
                except FilePulsarError as e:
                    log.warning("pattern consumer could not subscribe to %s: %s", t, e)
        wanted = {TopicName.parse(t) for t in current}
        if self.retry_topic is not None:
            wanted.add(TopicName.parse(self.retry_topic))
        for p in [p for p in self.parts if p.topic.base not in wanted]:
            if partitions_of(self._store, p.topic.base) is None:  # the topic was deleted
                dropped(p)
                self.parts.remove(p)
                try:
                    p.sc.close()
                except FilePulsarError:
                    pass

    def part_for(self, mid: MessageId) -> Part:
        """The part a message id belongs to.

        Raises
        ------
        InvalidConfiguration
            For an id of a topic this consumer does not read; OperationNotSupported (an
            InvalidConfiguration) for an id without a topic on a consumer of several.
        """
        topic = message_id_topic(mid)
        if topic is not None:
            for p in self.parts:
                if p.topic_str == topic:
                    return p
            raise InvalidConfiguration(
                f"message id {mid} is from topic {topic}, which this consumer does not "
                f"consume ({self.label})"
            )
        cands = [p for p in self.parts if p.partition == mid.partition]
        if len(cands) > 1 and self.retry_topic is not None:
            retry = TopicName.parse(self.retry_topic)
            cands = [p for p in cands if p.topic.base != retry]
        if len(cands) == 1:
            return cands[0]
        # pulsar-client's error for an id without a topic on a multi-topic consumer (a
        # ValueError here too: OperationNotSupported is an InvalidConfiguration).
        raise OperationNotSupported(
            f"message id {mid} does not say which of this consumer's topics it belongs to; "
            "acknowledge the Message or an id from Message.message_id()"
        )

    def close(self, name: str) -> None:
        """Leave the subscription on every part, at once (:func:`each_partition`; errors
        logged)."""
        parts = list(self.parts)
        for p, (_, e) in zip(parts, each_partition(lambda p: p.sc.close(), parts), strict=True):
            if isinstance(e, FilePulsarError | OSError):
                log.warning("closing %s on %s failed: %s", name, p.topic, e)
            elif e is not None:
                raise e
