"""The Spark source's offsets: their form, their arithmetic, and the options resolved to them.

An offset is ``[ledgerId, entryId, n]`` or ``[ledgerId, entryId, n, incarnation]`` (:data:`Off`,
see :mod:`filepulsar.connector.source.batch`). Owns building and reading them
(:func:`make_offset`, :func:`incarnation_of`, :func:`end_offset`, :func:`offset_before`,
:func:`_offset_of_message_id`, :func:`recreated_between`),
checking JSON offset options against the partitions read (:func:`check_offset_keys`), and resolving
``startingOffsets``/``endingOffsets``/``startingTime``/``endingTime`` to one partition's offset
(:func:`resolve_offset`). Driver side.
"""

from __future__ import annotations

from typing import Any

from filepulsar.connector.source.options import SourceOptions, parse_topic_pattern, time_for
from filepulsar.storage import InvalidConfiguration, ManagedLedger, MessageId, TopicName
from filepulsar.storage.ledger import Position
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.read_range import WHOLE

Off = list[Any]  # [ledger, entry, n] or [ledger, entry, n, incarnation]


def make_offset(ledger: int, entry: int, n: int, incarnation: str) -> Off:
    """An offset; the topic's incarnation rides along when it has one."""
    return [ledger, entry, n, incarnation] if incarnation else [ledger, entry, n]


def incarnation_of(off: Off) -> str:
    """The incarnation an offset was taken in ("" unknown: offsets written before them)."""
    return str(off[3]) if len(off) > 3 else ""


def end_offset(m: ManifestState) -> Off:
    """The offset just after the last entry the manifest ``m`` holds (its "latest")."""
    lid, eid = m.last_position()
    return make_offset(lid, eid, WHOLE, m.incarnation)


def offset_before(pos: Position) -> list[int]:
    """The offset just before entry ``pos``: ``(ledger, entry - 1)``, a position that may not
    exist (entry -1, or a ledger retention deleted) but orders and advances correctly."""
    return [pos.ledger_id, pos.entry_id - 1, WHOLE]


def _offset_of_message_id(mid: MessageId) -> list[int]:
    """Offset so that reading starts AT message ``mid`` (inclusive), as Pulsar's seek."""
    pos = Position(mid.ledger_id, mid.entry_id)
    if mid.batch_index > 0:
        return [mid.ledger_id, mid.entry_id, mid.batch_index]
    return offset_before(pos)


def recreated_between(s: Off, e: Off) -> bool:
    """``s`` and ``e`` were taken in different incarnations of the topic."""
    return (
        bool(incarnation_of(s))
        and bool(incarnation_of(e))
        and incarnation_of(s) != incarnation_of(e)
    )


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
) -> Off:
    """Partition ``topic``'s offset for the offsets option ``spec`` (a starting one with
    ``is_start``), a time option taking precedence over "earliest"/"latest"; "latest" is the
    end of ``m``, a message id the offset just before it."""
    inc = m.incarnation
    at = time_for(opts.starting_time, topic) if is_start else opts.ending_time
    if at is not None and spec in ("latest", "earliest"):
        # From the first message published at or after ``at`` (start, included), or up to
        # the last one published before it (end, as Kafka's endingTimestamp).
        pos = ml.find_by_publish_time(m, at)
        if pos is None:
            return end_offset(m)
        b = offset_before(pos)
        return make_offset(b[0], b[1], b[2], inc)
    spec = partition_spec(spec, topic, is_start=is_start)
    if spec == "earliest":
        return make_offset(-1, -1, WHOLE, inc)
    if spec == "latest":
        return end_offset(m)
    # A starting message id is included; an ending one is not (reading stops before it, as
    # Kafka's endingOffsets): both are the offset just before the message.
    o = _offset_of_message_id(MessageId.parse(spec))
    return make_offset(o[0], o[1], o[2], inc)
