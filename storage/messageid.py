"""Message ids: ``ledgerId:entryId:partitionIndex[:batchIndex]`` with Pulsar's ordering."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

_LONG_MAX = (1 << 63) - 1


class _Field(int):
    """An int that can also be called, so ``mid.ledger_id`` and pulsar-client's
    ``mid.ledger_id()`` both work."""

    __slots__ = ()

    def __call__(self) -> int:
        return int(self)


@dataclass(frozen=True, eq=True, order=False)
class MessageId:
    """Where a message sits: partition (-1 if not partitioned), ledger, entry, batch index.

    The constructor takes pulsar-client's order, ``MessageId(partition, ledger_id, entry_id,
    batch_index)``, every field defaulting to -1; keywords work as well. The four fields are
    ints that can also be called (``mid.ledger_id()``), as pulsar-client's accessors are.
    Ordering is Pulsar's: by ``(ledger_id, entry_id, partition, batch_index)``; a
    non-batched id (batch index -1) sorts before index 0 of the same entry.
    ``MessageId.earliest`` is ``-1:-1:-1`` and ``MessageId.latest`` is
    ``Long.MAX:Long.MAX:-1``, as in Pulsar. A duplicate dropped by deduplication is
    acknowledged with ``-1:-1:-1``.
    """

    partition: int = -1
    ledger_id: int = -1
    entry_id: int = -1
    batch_index: int = -1

    earliest: ClassVar[MessageId]
    latest: ClassVar[MessageId]

    def __post_init__(self) -> None:
        for name in ("partition", "ledger_id", "entry_id", "batch_index"):
            v = getattr(self, name)
            if type(v) is not int and (isinstance(v, bool) or not isinstance(v, int)):
                try:
                    v = int(v)  # numpy integers and the like
                except (TypeError, ValueError) as e:
                    raise ValueError(f"MessageId {name} must be an integer, got {v!r}") from e
            object.__setattr__(self, name, _Field(v))

    def _key(self) -> tuple[int, int, int, int]:
        return (self.ledger_id, self.entry_id, self.partition, self.batch_index)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() >= other._key()

    @classmethod
    def of(
        cls, ledger_id: int, entry_id: int, partition: int = -1, batch_index: int = -1
    ) -> MessageId:
        """An id from its text order (``ledger:entry:partition[:batch]``)."""
        return cls(partition, ledger_id, entry_id, batch_index)

    @classmethod
    def wrap(cls, msg_id: MessageId) -> MessageId:
        """pulsar-client's wrapper of its C extension's id: here the id itself."""
        if not isinstance(msg_id, MessageId):
            raise ValueError(f"MessageId.wrap needs a MessageId, got {type(msg_id).__name__}")
        return msg_id

    def __str__(self) -> str:
        if self.batch_index < 0:
            return f"{self.ledger_id}:{self.entry_id}:{self.partition}"
        return f"{self.ledger_id}:{self.entry_id}:{self.partition}:{self.batch_index}"

    @classmethod
    def parse(cls, text: str) -> MessageId:
        """Parse the text form; ``earliest`` and ``latest`` are accepted too.

        Raises
        ------
        ValueError
            If ``text`` is not 3 or 4 colon-separated integers.
        """
        t = text.strip()
        if t == "earliest":
            return cls.earliest
        if t == "latest":
            return cls.latest
        parts = t.split(":")
        if len(parts) not in (3, 4):
            raise ValueError(
                f"message id {text!r} is malformed: expected "
                "'ledgerId:entryId:partition' or 'ledgerId:entryId:partition:batchIndex'"
            )
        try:
            nums = [int(p) for p in parts]
        except ValueError as e:
            raise ValueError(f"message id {text!r} has a part that is not an integer") from e
        return cls.of(*nums)

    def serialize(self) -> bytes:
        """Bytes that :meth:`deserialize` turns back into this id (the text form, UTF-8)."""
        return str(self).encode()

    @classmethod
    def deserialize(cls, data: bytes, topic: str | None = None) -> MessageId:
        """The id :meth:`serialize` wrote; ``topic`` (pulsar-client's, for multi-topic
        consumers) makes it acknowledgeable on a consumer of several topics."""
        mid = cls.parse(data.decode())
        if topic is not None:
            if not isinstance(topic, str):
                raise ValueError(f"topic must be a str, got {type(topic).__name__}")
            mid = cls(mid.partition, mid.ledger_id, mid.entry_id, mid.batch_index)
            object.__setattr__(mid, "_fp_topic", topic)
        return mid

    def to_dict(self) -> dict[str, int]:
        return {
            "ledgerId": self.ledger_id,
            "entryId": self.entry_id,
            "partition": self.partition,
            "batchIndex": self.batch_index,
        }

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> MessageId:
        return cls(
            partition=int(d.get("partition", -1)),
            ledger_id=int(d["ledgerId"]),
            entry_id=int(d["entryId"]),
            batch_index=int(d.get("batchIndex", -1)),
        )


MessageId.earliest = MessageId()
MessageId.latest = MessageId(ledger_id=_LONG_MAX, entry_id=_LONG_MAX)
#: The id a producer gets back for a message dropped as a duplicate.
DUPLICATE_MESSAGE_ID = MessageId()
