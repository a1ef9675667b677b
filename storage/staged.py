"""Staged writes: entries written by one process, published by another in one commit.

This is how an exactly-once writer (the Spark sink) uses a managed ledger: each task writes its
entries to a fresh blob with :func:`stage` (durable, invisible), and the driver publishes the
staged blobs of a batch with :func:`commit_staged`, one manifest commit per managed ledger that
also records ``(writer id, batch id)``. Committing a batch id that is not newer than the recorded
one changes nothing, so a replayed batch is a no-op; :func:`discard_staged` deletes blobs that
will never be published (an aborted or replayed batch).
"""

from __future__ import annotations

from dataclasses import dataclass

from filepulsar.storage import paths
from filepulsar.storage.commit import PendingEntry, Publish
from filepulsar.storage.entry_blob import EntryBlob
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.names import validate_segment
from filepulsar.storage.policies import Policies
from filepulsar.storage.versioned import Abort


@dataclass(frozen=True)
class StagedBlob:
    """A blob of entries written by :func:`stage`, not yet visible to readers."""

    topic: str  # the managed ledger (partition) it is for
    blob: str
    #: Its entries, in blob order, their buffers released (``parts`` empty): what the
    #: commit needs to know of each (size, message count, publish time, producer, ids).
    entries: tuple[PendingEntry, ...]


class StagingBlob:
    """A blob being staged for one managed ledger, filled entry group by entry group.

    On stores that can append (local disks) the entries are appended as they come (no joining
    copy, no blob-sized buffer); on the others (object stores) they are gathered and put at
    once by :meth:`finish`. Nothing is visible until :func:`commit_staged` publishes it.
    ``blob_id`` must be unique (include the writer, batch, task and attempt) and a valid name
    segment.
    """

    def __init__(self, ml: ManagedLedger, blob_id: str) -> None:
        validate_segment(blob_id, "blob id")
        self.ml = ml
        self.blob = blob_id
        self.key = paths.data_blob(ml.topic, blob_id)
        self._entries: list[PendingEntry] = []
        self._blob = EntryBlob(ml.store, self.key)

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self._blob.size

    def write(self, entries: list[PendingEntry]) -> None:
        """Add encoded entries (their buffers are released)."""
        self._blob.write(entries)
        self._entries.extend(entries)

    def finish(self) -> StagedBlob:
        """Make the blob durable; it stays invisible until a commit publishes it."""
        self._blob.finish()
        return StagedBlob(str(self.ml.topic), self.blob, tuple(self._entries))

    def abandon(self) -> None:
        """Close and delete the blob (the writer failed; it will never be published)."""
        self._blob.abandon()


def stage(ml: ManagedLedger, entries: list[PendingEntry], blob_id: str) -> StagedBlob:
    """Write ``entries`` durably to a new blob named ``blob_id``; nothing becomes visible
    (a :class:`StagingBlob` written at once). The entries' buffers are released."""
    blob = StagingBlob(ml, blob_id)
    blob.write(entries)
    return blob.finish()


def commit_staged(
    ml: ManagedLedger,
    staged: list[StagedBlob],
    *,
    policies: Policies,
    dedup: bool,
    writer_id: str,
    batch_id: int,
) -> list[list[Position | None]] | None:
    """Publish ``staged`` blobs of batch ``batch_id`` in one atomic manifest commit.

    Returns the positions of every staged entry (None: dropped as a duplicate), or None if
    ``writer_id`` already committed ``batch_id`` or a later batch here (nothing changed; the
    caller should discard the blobs).
    """
    entries: list[PendingEntry] = []
    blobs: list[str] = []
    offsets: list[int] = []
    for sb in staged:
        pos = 0
        for e in sb.entries:
            entries.append(e)
            blobs.append(sb.blob)
            offsets.append(pos)
            pos += e.size

    def guard(state: ManifestState, now: int) -> None:
        if state.sink_batches.get(writer_id, -1) >= batch_id:
            raise Abort(None)
        state.note_sink_batch(writer_id, batch_id, now)

    flat = Publish(
        ml, entries, blobs, offsets, policies=policies, dedup=dedup, guard=guard
    ).commit()
    if flat is None:
        return None
    out = []
    k = 0
    for sb in staged:
        out.append(flat[k : k + len(sb.entries)])
        k += len(sb.entries)
    return out


def last_committed_batch(ml: ManagedLedger, writer_id: str) -> int:
    """The last batch id ``writer_id`` committed to this managed ledger (-1 if none)."""
    return ml.state().sink_batches.get(writer_id, -1)


def discard_staged(ml: ManagedLedger, staged: list[StagedBlob]) -> None:
    """Delete staged blobs that will not be published (missing ones are fine)."""
    for sb in staged:
        ml.store.delete(paths.data_blob(ml.topic, sb.blob))
