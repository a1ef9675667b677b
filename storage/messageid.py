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


@dataclass(frozen=True, order=True)
class MessageId:
    """Where a message sits: ledger, entry, partition (-1 if not partitioned), batch index.

    The four fields are ints that can also be called (``mid.ledger_id()``), as pulsar-client's
    accessors are. Ordering is by ``(ledger_id, entry_id, partition, batch_index)``; a
    non-batched id (batch index -1) sorts before index 0 of the same entry.
    ``MessageId.earliest`` is ``-1:-1:-1`` and ``MessageId.latest`` is
    ``Long.MAX:Long.MAX:-1``, as in Pulsar. A duplicate dropped by deduplication is
    acknowledged with ``-1:-1:-1``.
    """

    ledger_id: int
    entry_id: int
    partition: int = -1
    batch_index: int = -1

    earliest: ClassVar[MessageId]
    latest: ClassVar[MessageId]

    def __post_init__(self) -> None:
        for name in ("ledger_id", "entry_id", "partition", "batch_index"):
            object.__setattr__(self, name, _Field(getattr(self, name)))

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
        return cls(*nums)

    def serialize(self) -> bytes:
        """Bytes that :meth:`deserialize` turns back into this id (the text form, UTF-8)."""
        return str(self).encode()

    @classmethod
    def deserialize(cls, data: bytes) -> MessageId:
        return cls.parse(data.decode())

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
            int(d["ledgerId"]),
            int(d["entryId"]),
            int(d.get("partition", -1)),
            int(d.get("batchIndex", -1)),
        )


MessageId.earliest = MessageId(-1, -1, -1)
MessageId.latest = MessageId(_LONG_MAX, _LONG_MAX, -1)
#: The id a producer gets back for a message dropped as a duplicate.
DUPLICATE_MESSAGE_ID = MessageId(-1, -1, -1)
