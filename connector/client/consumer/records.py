"""What the client consumer keeps of each managed ledger it reads (:class:`Part`) and of each
entry it delivered until that entry is acknowledged (:class:`Entry`).

Plain records: the :class:`~filepulsar.connector.client.consumer.topics.TopicSet` makes the
parts, the :class:`~filepulsar.connector.client.consumer.receiver_queue.ReceiverQueue` the
entries, and the :class:`~filepulsar.connector.client.consumer.ack_tracker.AckTracker` retires
them. A :class:`~filepulsar.connector.client.message.View` refers to its entries through the
:class:`~filepulsar.connector.client.message.Delivered` protocol, so ``message`` imports
nothing from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from filepulsar.connector.client.message import View
from filepulsar.storage.ledger import Position
from filepulsar.storage.names import TopicName
from filepulsar.storage.reader import ChunkAssembler
from filepulsar.storage.subscription import SubscriptionConsumer

#: What a new entry has of acknowledged batch indexes and other chunks' positions: shared
#: empty values (an entry of one message, most of them, never gets its own).
_NO_INDEXES: frozenset[int] = frozenset()
_NO_POSITIONS: tuple[Position, ...] = ()


class Entry:
    """What the consumer tracks of one delivered entry until it is acknowledged.

    Made for every message delivered, so it holds no container of its own until one is
    needed: ``acked`` is a shared empty set until :meth:`acked_indexes` (objects made per
    message are what the cyclic GC goes over)."""

    __slots__ = (
        "acked",
        "batched",
        "chunk_positions",
        "first_row",
        "nacked",
        "part",
        "pos",
        "received_ms",
        "redelivery_count",
        "registration",
        "rows",
        "size",
        "view",
    )

    def __init__(self, part: Part, pos: Position, size: int, batched: bool, count: int) -> None:
        self.part = part
        self.registration = part.registration  # the consumer's registration that claimed it
        self.pos = pos
        self.size = size
        self.batched = batched
        self.redelivery_count = count
        #: The batch indexes acknowledged (or skipped): read here, changed through
        #: :meth:`acked_indexes`.
        self.acked: AbstractSet[int] = _NO_INDEXES
        self.view: View[Entry] | None = None
        self.first_row = 0
        self.rows = 0
        self.received_ms = 0
        self.nacked = False
        #: A chunked message's other chunks (its last chunk is ``pos``).
        self.chunk_positions: Sequence[Position] = _NO_POSITIONS

    def acked_indexes(self) -> set[int]:
        """``acked``, as a set of this entry's own to add to."""
        a = self.acked
        if not isinstance(a, set):
            a = self.acked = set(a)
        return a


class Part:
    """One subscribed managed ledger (a partition or a non-partitioned topic)."""

    def __init__(self, sc: SubscriptionConsumer, topic: TopicName) -> None:
        self.sc = sc
        self.topic = topic
        self.topic_str = str(topic)
        self.partition = topic.partition_index
        self.assembler = ChunkAssembler()
        self.chunks: dict[str, dict[int, Position]] = {}
        self.unacked: dict[Position, Entry] = {}
        self.avg = 0.0  # messages per entry, to size fetches (0: not known yet)
        self.skip: tuple[Position, int] | None = None  # seek into a batch: skip indexes < n
        self.registration = sc.registrations  # what the queue holds was claimed under it
        self.seeks = sc.seeks_followed  # others' seeks it followed (what it holds is after)

    def reset(self) -> None:
        """Forget chunks half assembled and entries delivered (after a seek)."""
        self.assembler = ChunkAssembler()
        self.chunks = {}
        self.unacked = {}

    def forget(self, ent: Entry) -> None:
        """Stop tracking ``ent`` (acknowledged), unless a redelivery replaced it already.

        The entry lets go of its view: the view holds its entries, and a cycle left for
        every delivered entry (entry, view, rows, their lists) would be freed only by
        CPython's collector, which it would bring round sooner and keep busy."""
        ent.view = None
        if self.unacked.get(ent.pos) is ent:
            del self.unacked[ent.pos]
