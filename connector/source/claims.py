"""What a Shared/Key_Shared stream claims per trigger, counted in messages (driver side).

A subscription hands out whole entries; ``maxMessagesPerTrigger`` counts messages, and a batch
entry may hold hundreds. So the stream reader keeps each claimed entry as a *piece*
``[ledger, entry, redelivery, lo, n]`` -- its messages ``lo .. n-1`` still to read -- and
:func:`take_messages` turns pieces into the offset's claim items up to the limit, splitting
the entry that does not fit whole, as Failover's offsets cut inside an entry. The rest stays
claimed by the query (its lease) and is taken first in the next trigger. Used by
:meth:`~filepulsar.connector.source.stream.FilePulsarStreamReader._claim` (offsets),
``partitions`` (:func:`claim_slice`) and ``commit`` (:func:`claim_acks`).

A claim item in the offset is ``[ledger, entry, redelivery]`` for a whole entry (the form
older checkpoints hold) or ``[ledger, entry, redelivery, lo, hi, n]`` for its messages
``lo .. hi-1`` of ``n``.
"""

from __future__ import annotations

from collections.abc import Sequence

from filepulsar.storage.delivery import Delivery
from filepulsar.storage.ledger import Position

#: ``[ledger, entry, redelivery, lo, n]``: a claimed entry's messages ``lo .. n-1`` not yet read.
Piece = list[int]


def piece_of(d: Delivery) -> Piece:
    """The unread part of a delivered entry: from its first batch index not acknowledged (an
    entry split across triggers, then released by a query that stopped, comes back with its
    first part acknowledged)."""
    n = d.entry.header.num_messages
    lo = 0
    while lo < n and lo in d.acked_indexes:
        lo += 1
    return [d.entry.ledger_id, d.entry.entry_id, d.redelivery_count, lo, n]


def take_messages(
    pieces: Sequence[Piece], room: int | None, cap: int
) -> tuple[list[list[int]], list[Piece], int]:
    """Claim items for at most ``room`` messages (``None``: no limit) and ``cap`` entries,
    from ``pieces`` in order; the entry where ``room`` runs out is split.

    Returns
    -------
    tuple
        ``(items, rest, messages)``: the claim items (see the module docstring), the pieces
        left for a later trigger, and the messages the items hold.
    """
    items: list[list[int]] = []
    used = 0
    for i, (ledger, entry, red, lo, n) in enumerate(pieces):
        if len(items) >= cap or (room is not None and used >= room):
            return items, list(pieces[i:]), used
        hi = n if room is None else min(n, lo + room - used)
        items.append(
            [ledger, entry, red] if (lo, hi) == (0, n) else [ledger, entry, red, lo, hi, n]
        )
        used += hi - lo
        if hi < n:
            return items, [[ledger, entry, red, hi, n], *pieces[i + 1 :]], used
    return items, [], used


def claim_slice(item: Sequence[int]) -> tuple[int, int, int, int] | None:
    """``(ledger, entry, lo, hi)`` of an item that covers part of its entry, else None."""
    return (item[0], item[1], item[3], item[4]) if len(item) > 3 else None


def claim_acks(item: Sequence[int]) -> list[tuple[Position, int, int]]:
    """What acknowledging an item means: the whole entry, or its batch indexes ``lo .. hi-1``
    (the entry is acknowledged whole when its last part is)."""
    position = Position(item[0], item[1])
    if len(item) <= 3:
        return [(position, -1, 1)]
    return [(position, i, item[5]) for i in range(item[3], item[4])]
