"""Messages retention deleted after a read position before they were read (issue #31).

A reader and a non-durable subscription's consumer hold back no retention (as in Pulsar):
retention may delete ledgers they have not read yet. They go on at the first message that
remains, but never silently: :class:`RetentionSkips` tells when retention passed a read
position (the manifest's ``trimmedLast`` is after it), counts the messages it deleted there
(``trimmedMessages`` less the messages up to the position) and logs each skip once.

Counting is lazy: moving the position (a seek, a start, a restart at the cursor) reads
nothing; the messages up to a position are worked out only when retention has passed it,
from the manifest state kept with the position (in memory) and, when the position lies
inside a ledger, that ledger's index and fragment (the index is cached once the reader read
from that ledger). Reading on moves the count with the entries read, and a read that enters
a new ledger at its first entry anchors the count there (no read needed to know what came
before). Only a position inside a ledger that retention deleted before the rest of it could
be counted (a seek into the middle of a ledger, then retention before any read) is counted
as the ledgers after it ("at least N messages"): the rest of that ledger is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from filepulsar.storage.errors import DataLossError
from filepulsar.storage.ledger import ManagedLedger, Position, ReadEntry
from filepulsar.storage.manifest import ManifestState

log = logging.getLogger(__name__)


def messages_before(state: ManifestState, ledger_id: int) -> int:
    """Messages of the managed ledger in ledgers before ``ledger_id`` (those retention deleted
    counted), from ``state`` alone."""
    n = state.trimmed_messages
    for lg in state.ledgers:
        if lg.ledger_id >= ledger_id:
            break
        n += lg.messages
    return n


def messages_in_ledger_through(
    ml: ManagedLedger, state: ManifestState, pos: Position
) -> int | None:
    """Messages of ``pos``'s ledger up to and including ``pos``: read from its index (cached
    once read) and, when ``pos`` lies inside a fragment, that fragment's first entries. None
    if they are gone."""
    lg = state.ledger(pos.ledger_id)
    if lg is None:
        return None
    n = 0
    try:
        for frag in ml.fragments(lg):
            end = frag.first_entry + frag.count - 1
            if end <= pos.entry_id:
                n += frag.messages
            elif frag.first_entry <= pos.entry_id:
                first = Position(lg.ledger_id, frag.first_entry)
                for e in ml.iter_entries(state, first, end=pos):
                    n += e.header.num_messages
    except DataLossError:
        return None
    return n


def _warn(line: str) -> None:
    log.warning("%s; it goes on after them", line)


class RetentionSkips:
    """Retention passing one read position of ``ml``: the count (:attr:`skipped`) and the
    report of each skip. ``who`` starts its line (``reader of <topic>``); ``report`` says it
    (default: a warning in the log); if it raises, the skip is neither counted nor passed."""

    def __init__(
        self, ml: ManagedLedger, who: str, report: Callable[[str], None] | None = None
    ) -> None:
        self.ml = ml
        self.who = who
        self.report = report or _warn
        #: Messages retention deleted after the position before they were read.
        self.skipped = 0
        #: The last skip's log line (None before any).
        self.last_warning: str | None = None
        self._state: ManifestState | None = None  # the manifest when the anchor was set
        self._anchor = Position(-1, -1)
        self._before: int | None = None  # messages in ledgers before the anchor's, once known
        self._partial: int | None = 0  # messages of the anchor's ledger up to it, if known
        self._since = 0  # messages read after the anchor

    def start_at(self, state: ManifestState, pos: Position) -> None:
        """The position moved to ``pos`` (a seek, a start); ``state`` is the manifest it was
        found in. Reads nothing."""
        self._state, self._anchor, self._before, self._since = state, pos, None, 0
        inside = pos.entry_id >= 0 and pos.ledger_id >= state.trimmed_before
        self._partial = None if inside else 0

    def read(self, state: ManifestState, entries: Sequence[ReadEntry]) -> None:
        """``entries`` (read from ``state``) were read: the position is now the last one. The
        first read in the anchor's ledger also counts that ledger's messages up to the anchor
        (its index and fragment were just read)."""
        if not entries:
            return
        if self._partial is None and entries[0].ledger_id == self._anchor.ledger_id:
            assert self._state is not None
            self._partial = messages_in_ledger_through(self.ml, self._state, self._anchor)
        for e in entries:
            if e.entry_id == 0 and e.ledger_id != self._anchor.ledger_id and self._before is None:
                # A ledger entered at its start: what came before is in the manifest alone.
                self.start_at(state, Position(e.ledger_id, -1))
            self._since += e.header.num_messages

    def through(self) -> int | None:
        """Messages up to the position (retention's deleted ones counted); None if unknown."""
        state, anchor = self._state, self._anchor
        if state is None:
            return None
        if self._partial is None:
            self._partial = messages_in_ledger_through(self.ml, state, anchor)
            if self._partial is None:
                return None
        if self._before is None:
            if anchor.ledger_id < state.trimmed_before:
                self._before = state.trimmed_messages  # before what remains
            else:
                self._before = messages_before(state, anchor.ledger_id)
        return self._before + self._partial + self._since

    def passed(self, state: ManifestState, pos: Position) -> Position | None:
        """If retention deleted messages after ``pos`` (the position) that were not read --
        ``state``'s ``trimmedLast`` is after it -- count them, log them once and return
        ``trimmedLast``, where reading goes on; else None."""
        trimmed = state.trimmed_last
        if trimmed <= pos:
            return None
        through = self.through()
        if through is not None and state.trimmed_messages <= through:
            return None  # what was trimmed had been read (or lay before the start)
        since = "from the start" if pos.ledger_id < 0 else f"after {pos.ledger_id}:{pos.entry_id}"
        if through is not None:
            lost = state.trimmed_messages - through
            what = f"{lost} messages"
        else:
            # The position's ledger is gone before its messages up to the position were
            # counted: the ledgers after it are known whole, the rest of it is not.
            seen = self._state or state
            lost = sum(
                lg.messages
                for lg in seen.ledgers
                if pos.ledger_id < lg.ledger_id < state.trimmed_before
            )
            what = (
                f"at least {lost} messages (and the rest of ledger {pos.ledger_id}, whose "
                "entries are gone)"
            )
        line = (
            f"{self.who}: retention deleted {what} it had not read (entries {since} up to "
            f"{trimmed.ledger_id}:{trimmed.entry_id}, ledgers before {state.trimmed_before})"
        )
        self.report(line)
        self.last_warning = line
        self.skipped += lost
        self.start_at(state, trimmed)
        self._before, self._partial = state.trimmed_messages, 0
        return trimmed
