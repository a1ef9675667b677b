"""The position of an entry in a managed ledger: the one position type of the code.

A named pair, so it orders, hashes and compares as the ``(ledger_id, entry_id)`` tuple does
(``Position(3, 4) == (3, 4)``); stored files and checkpoints keep their own spellings
(``[ledger, entry]`` lists, ``"ledger:entry"`` keys: see ``storage/FORMAT.md``).
:mod:`filepulsar.storage.ledger` re-exports it beside the managed ledger that owns positions.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["EARLIEST", "Position"]


class Position(NamedTuple):
    """An entry's place in the managed ledger. ``entry_id`` may be ``-1`` in a mark-delete
    position (before the ledger's first entry), and ``Position(-1, -1)`` is before every
    entry (:data:`filepulsar.storage.ledger.EARLIEST`)."""

    ledger_id: int
    entry_id: int


#: Before the first entry of any managed ledger.
EARLIEST = Position(-1, -1)
