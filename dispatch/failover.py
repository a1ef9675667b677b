"""The active consumer of a Failover subscription.

Pulsar's broker picks one active consumer per topic (or per partition) for a Failover
subscription; the others stand by. The choice is a pure function of the connected consumers,
their priority levels, the partition index and the topic name:

1. Consumers are sorted by priority level (ascending; 0 is the highest priority), then by name
   (Java ``String.compareTo``: UTF-16 code units), keeping connection order for full ties.
2. Only consumers of the best priority level are eligible.
3. Partition ``p`` of a partitioned topic goes to ``eligible[p % len(eligible)]``.
4. A non-partitioned topic (partition index -1), or any topic when the broker enables
   ``activeConsumerFailoverConsistentHashing``, uses a ring: eligible consumer ``i`` puts 100
   points ``murmur3_32(name + str(j))`` (``j = 0..99``, no separator), a later consumer
   overwriting an earlier one on an equal point; the active consumer owns the first point
   ``>= murmur3_32(topic)``, wrapping to the lowest point.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from filepulsar.dispatch.hashing import murmur3_32

__all__ = ["CONSUMER_CONSISTENT_HASH_REPLICAS", "active_consumer", "failover_hash_ring"]

CONSUMER_CONSISTENT_HASH_REPLICAS = 100
"""Ring points per eligible consumer."""


def _java_order(name: str) -> bytes:
    # Big-endian UTF-16 bytes compare like Java's code-unit-by-code-unit compareTo.
    return name.encode("utf-16-be", "surrogatepass")


def _eligible(consumers: Sequence[tuple[str, int]]) -> list[str]:
    if not consumers:
        raise ValueError("a Failover subscription needs at least one consumer")
    for item in consumers:
        if len(item) != 2 or not isinstance(item[0], str) or not isinstance(item[1], int):
            raise TypeError(f"consumers must be (name, priority_level) pairs, got {item!r}")
    ordered = sorted(consumers, key=lambda c: (c[1], _java_order(c[0])))
    best = ordered[0][1]
    return [name for name, priority in ordered if priority == best]


def failover_hash_ring(names: Sequence[str]) -> list[tuple[int, int]]:
    """The failover ring of already sorted, eligible consumer names.

    Parameters
    ----------
    names
        Eligible consumers in their sorted order.

    Returns
    -------
    list of (int, int)
        Sorted ``(point, index into names)`` pairs; on an equal point the later consumer wins.
    """
    ring: dict[int, int] = {}
    for i, name in enumerate(names):
        for j in range(CONSUMER_CONSISTENT_HASH_REPLICAS):
            ring[murmur3_32(f"{name}{j}")] = i
    return sorted(ring.items())


def active_consumer(
    consumers: Sequence[tuple[str, int]],
    partition_index: int,
    topic: str,
    *,
    consistent_hashing: bool = False,
) -> str:
    """Name of the active consumer of a Failover subscription on one topic or partition.

    Parameters
    ----------
    consumers
        Connected consumers as ``(name, priority_level)`` pairs, in connection order.
    partition_index
        Index of the partition, or -1 for a non-partitioned topic.
    topic
        Full topic name as the broker knows it (e.g. ``persistent://public/default/t`` or
        ``persistent://public/default/t-partition-3``); only hashed in ring mode.
    consistent_hashing
        Broker setting ``activeConsumerFailoverConsistentHashing`` (default false): use the ring
        for partitions too.

    Returns
    -------
    str
        The active consumer's name.

    Raises
    ------
    ValueError
        If ``consumers`` is empty or ``partition_index`` is below -1.
    TypeError
        If an entry is not a ``(str, int)`` pair.
    """
    if partition_index < -1:
        raise ValueError(f"partition_index must be -1 or a partition number, got {partition_index}")
    eligible = _eligible(consumers)
    if partition_index >= 0 and not consistent_hashing:
        return eligible[partition_index % len(eligible)]
    ring = failover_hash_ring(eligible)
    points = [point for point, _ in ring]
    i = bisect.bisect_left(points, murmur3_32(topic))
    return eligible[ring[i if i < len(ring) else 0][1]]
