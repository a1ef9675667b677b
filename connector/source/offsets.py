"""The Spark source's offsets: their form, their arithmetic, and the options resolved to them.

One partition's offset is a :class:`PartitionOffset`; in the checkpoint JSON it is written
``[ledgerId, entryId, n]`` or ``[ledgerId, entryId, n, incarnation]``
(:meth:`PartitionOffset.from_json`, :meth:`PartitionOffset.to_json`, and for a whole offset
:func:`parse_offsets`, :func:`offsets_json`; see :mod:`filepulsar.connector.source.batch`).
Owns building and reading them (:func:`end_offset`, :func:`offset_before`,
:func:`_offset_of_message_id`, :func:`recreated_between`), checking JSON offset options
against the partitions read (:func:`check_offset_keys`), and resolving
``startingOffsets``/``endingOffsets``/``startingTime``/``endingTime`` to one partition's offset
(:func:`resolve_offset`). Driver side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from filepulsar.connector.source.options import SourceOptions, parse_topic_pattern, time_for
from filepulsar.storage import InvalidConfiguration, ManagedLedger, MessageId, TopicName
from filepulsar.storage.ledger import Position
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.read_range import WHOLE


@dataclass(frozen=True, slots=True)
class PartitionOffset:
    """One partition's offset: every message up to message ``messages`` (counted from 1) of
    entry (``ledger_id``, ``entry_id``) is read; ``messages`` is ``WHOLE`` (-1) for the whole
    entry. ``incarnation`` is the topic's creation id the offset was taken in ("": unknown,
    an offset written before incarnations existed).

    Not ordered: offsets compare by :attr:`position` (a :class:`Position`), equal only when
    all four fields are.
    """

    ledger_id: int
    entry_id: int
    messages: int = WHOLE
    incarnation: str = ""

    @property
    def position(self) -> Position:
        """The entry the offset is in (or after, when ``messages`` is ``WHOLE``)."""
        return Position(self.ledger_id, self.entry_id)

    @property
    def task(self) -> tuple[int, int, int]:
        """``(ledger, entry, messages)``: the form a task and storage's range reader take."""
        return (self.ledger_id, self.entry_id, self.messages)

    def at(self, incarnation: str) -> PartitionOffset:
        """The same place, taken in ``incarnation``."""
        return PartitionOffset(self.ledger_id, self.entry_id, self.messages, incarnation)

    def to_json(self) -> list[Any]:
        """The checkpoint's spelling: ``[ledger, entry, n]`` plus the incarnation if known."""
        out: list[Any] = [self.ledger_id, self.entry_id, self.messages]
        if self.incarnation:
            out.append(self.incarnation)
        return out

    @classmethod
    def from_json(cls, key: str, value: Any) -> PartitionOffset:
        """Read :meth:`to_json`'s spelling (``key``: the partition, for the error).

        Raises
        ------
        InvalidConfiguration
            For anything else, naming the partition, the value and the form allowed.
        """
        if isinstance(value, list | tuple) and 3 <= len(value) <= 4:
            lid, eid, n = value[0], value[1], value[2]
            if type(lid) is int and type(eid) is int and type(n) is int:
                return cls(lid, eid, n, str(value[3]) if len(value) > 3 else "")
        raise InvalidConfiguration(
            f"filepulsar source: offset of {key} is {value!r}; an offset is "
            "[ledgerId, entryId, n] or [ledgerId, entryId, n, incarnation] with integer ids"
        )


def parse_offsets(offsets: Mapping[str, Any]) -> dict[str, PartitionOffset]:
    """A source offset from Spark (its JSON, partition -> list) with every partition's parsed."""
    return {k: PartitionOffset.from_json(k, v) for k, v in offsets.items()}


def offsets_json(offsets: Mapping[str, PartitionOffset]) -> dict[str, Any]:
    """The JSON of a source offset for Spark's checkpoint (:meth:`PartitionOffset.to_json`)."""
    return {k: v.to_json() for k, v in offsets.items()}


#: Before every entry, in no known incarnation.
START = PartitionOffset(-1, -1)


def end_offset(m: ManifestState) -> PartitionOffset:
    lid, eid = m.last_position()
    return PartitionOffset(lid, eid, WHOLE, m.incarnation)


def offset_before(pos: Position) -> PartitionOffset:
    """The offset just before entry ``pos``: ``(ledger, entry - 1)``, a position that may not
    exist (entry -1, or a ledger retention deleted) but orders and advances correctly."""
    return PartitionOffset(pos.ledger_id, pos.entry_id - 1)


def _offset_of_message_id(mid: MessageId) -> PartitionOffset:
    """Offset so that reading starts AT message ``mid`` (inclusive), as Pulsar's seek."""
    if mid.batch_index > 0:
        return PartitionOffset(mid.ledger_id, mid.entry_id, mid.batch_index)
    return offset_before(Position(mid.ledger_id, mid.entry_id))


def recreated_between(s: PartitionOffset, e: PartitionOffset) -> bool:
    """``s`` and ``e`` were taken in different incarnations of the topic."""
    return bool(s.incarnation) and bool(e.incarnation) and s.incarnation != e.incarnation


def check_offset_keys(
    opts: SourceOptions, partitions: list[TopicName], *, starting: bool = True
) -> None:
    """JSON starting/ending offsets must name exactly the partitions the query reads.

    As Spark's Kafka source: every partition read must be named (``-2``/``-1`` for
    earliest/latest), so none is read from a default by accident; with a pattern, partitions
    of matching topics not created yet may be named too.

    Raises
    ------
    InvalidConfiguration
        Naming the keys that match no partition (a typo, or a partitioned topic's base name)
        or the partitions left out.
    """
    known = {str(t) for t in partitions}
    pattern = parse_topic_pattern(opts.pattern) if opts.pattern else None

    def reads(key: str) -> bool:  # with a pattern, also partitions of topics not made yet
        return key in known or (pattern is not None and pattern.matches(TopicName.parse(key)))

    specs: list[tuple[str, Any]] = [("endingOffsets", opts.ending_offsets)]
    if starting:
        specs.insert(0, ("startingOffsets", opts.starting_offsets))
        specs.insert(1, ("startingTime", opts.starting_time))
    for name, spec in specs:
        if not isinstance(spec, dict):
            continue
        unknown = sorted(k for k in spec if not reads(k))
        if unknown:
            sample = ", ".join(sorted(known)[:4]) + (" ..." if len(known) > 4 else "")
            raise InvalidConfiguration(
                f"filepulsar source: {name} names {unknown}, which this query does not read; "
                f"keys are partition names such as {sample}"
            )
        missing = sorted(known - set(spec))
        if missing:
            more = " ..." if len(missing) > 6 else ""
            raise InvalidConfiguration(
                f"filepulsar source: {name} JSON must name every partition the query reads "
                f"(as Kafka's); missing {missing[:6]}{more}. Give -2 (earliest) or -1 "
                "(latest) for partitions that start at either end"
            )


def check_start_not_after_end(topic: str, start: str, end: str) -> None:
    """A batch read's explicit starting message id must not be after its explicit ending one
    (Spark's Kafka source fails such a range: "Beginning offset ... is after the ending
    offset"); equal ids are an empty range.

    Raises
    ------
    InvalidConfiguration
        Naming the partition and both ids.
    """
    if start in ("earliest", "latest") or end in ("earliest", "latest"):
        return
    if MessageId.parse(start) > MessageId.parse(end):  # Pulsar's order of message ids
        raise InvalidConfiguration(
            f"filepulsar source: startingOffsets {start} of {topic} is after its endingOffsets "
            f"{end}; the start must be at or before the end (as Spark's Kafka source requires)"
        )


def partition_spec(spec: Any, topic: str, *, is_start: bool) -> str:
    """The per-partition form of an offsets option: 'earliest', 'latest' or a message id."""
    if isinstance(spec, dict):
        return str(spec.get(topic, "earliest" if is_start else "latest"))
    return str(spec)


def resolve_offset(
    spec: Any,
    topic: str,
    m: ManifestState,
    ml: ManagedLedger,
    opts: SourceOptions,
    *,
    is_start: bool,
) -> PartitionOffset:
    inc = m.incarnation
    at = time_for(opts.starting_time, topic) if is_start else opts.ending_time
    if at is not None and spec in ("latest", "earliest"):
        # From the first message published at or after ``at`` (start, included), or up to
        # the last one published before it (end, as Kafka's endingTimestamp).
        pos = ml.find_by_publish_time(m, at)
        if pos is None:
            return end_offset(m)
        return offset_before(pos).at(inc)
    spec = partition_spec(spec, topic, is_start=is_start)
    if spec == "earliest":
        return START.at(inc)
    if spec == "latest":
        return end_offset(m)
    # A starting message id is included; an ending one is not (reading stops before it, as
    # Kafka's endingOffsets): both are the offset just before the message.
    return _offset_of_message_id(MessageId.parse(spec)).at(inc)
