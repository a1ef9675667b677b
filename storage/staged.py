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
from typing import Any

from filepulsar.storage import paths
from filepulsar.storage.commit import PendingEntry, apply_entries
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.names import validate_segment
from filepulsar.storage.policies import Policies
from filepulsar.storage.versioned import Abort


@dataclass(frozen=True)
class EntryMeta:
    """What a commit needs to know of one staged entry (picklable, small)."""

    size: int
    num_messages: int
    publish_time: int
    producer_name: str
    sequence_id: int
    highest_sequence_id: int


@dataclass(frozen=True)
class StagedBlob:
    """A blob of entries written by :func:`stage`, not yet visible to readers."""

    topic: str  # the managed ledger (partition) it is for
    blob: str
    entries: tuple[EntryMeta, ...]


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
        self.size = 0
        self._metas: list[EntryMeta] = []
        self._parts: list[Any] = []
        self._appender = ml.store.open_append(self.key) if ml.store.supports_append else None

    def write(self, entries: list[PendingEntry]) -> None:
        """Add encoded entries (their buffers are released)."""
        parts = [p for e in entries for p in e.parts]
        if self._appender is not None:
            self._appender.write_many(parts)
        else:
            self._parts.extend(parts)
        for e in entries:
            self._metas.append(
                EntryMeta(
                    e.size,
                    e.num_messages,
                    e.publish_time,
                    e.producer_name,
                    e.sequence_id,
                    e.highest_sequence_id,
                )
            )
            self.size += e.size
            e.parts = []

    def finish(self) -> StagedBlob:
        """Make the blob durable; it stays invisible until a commit publishes it."""
        if self._appender is not None:
            self._appender.sync()
            self._appender.close()
        else:
            self.ml.store.put(self.key, b"".join(self._parts))
            self._parts = []
        return StagedBlob(str(self.ml.topic), self.blob, tuple(self._metas))

    def abandon(self) -> None:
        """Close and delete the blob (the writer failed; it will never be published)."""
        if self._appender is not None:
            self._appender.close()
            self.ml.store.delete(self.key)
        self._parts = []


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
        for m in sb.entries:
            entries.append(
                PendingEntry(
                    [],
                    m.size,
                    m.num_messages,
                    m.publish_time,
                    m.producer_name,
                    m.sequence_id,
                    m.highest_sequence_id,
                )
            )
            blobs.append(sb.blob)
            offsets.append(pos)
            pos += m.size
    indexes: list[tuple[str, bytes]] = []

    def change(state: ManifestState) -> list[Position | None]:
        if state.sink_batches.get(writer_id, -1) >= batch_id:
            raise Abort(None)
        now = ml.clock()
        state.note_sink_batch(writer_id, batch_id, now)
        out, _, _ = apply_entries(
            ml,
            state,
            entries,
            blobs,
            offsets,
            policies=policies,
            now=now,
            dedup=dedup,
            indexes=indexes,
        )
        return out

    def before_write(state: ManifestState) -> None:
        for key, data in indexes:
            ml.store.put(key, data)

    _, flat = ml.manifest.commit(change, before_write=before_write)
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
