"""The one way encoded entries reach a data blob: :class:`EntryBlob`.

A producer session's :class:`filepulsar.storage.writer.LedgerWriter` and a Spark task's
:class:`filepulsar.storage.staged.StagingBlob` both write through it; what differs is when the
bytes become visible (a manifest commit by the writer, or the driver's staged commit).
"""

from __future__ import annotations

from typing import Any

from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.commit import PendingEntry


class EntryBlob:
    """One blob of encoded entries being written.

    On a store that can append (a local disk) the entries' buffers are appended as they come
    (no joining copy, no blob-sized buffer; :meth:`sync` makes them durable); on the others
    (object stores) they are gathered and put at once by :meth:`finish`. ``key`` is the
    blob's full key (``paths.data_blob``); the caller names it uniquely.
    """

    def __init__(self, store: BlobStore, key: str, *, write_ahead: int = 0) -> None:
        self.store = store
        self.key = key
        #: Bytes written so far (the offset of the next entry, for a fresh blob).
        self.size = 0
        self._parts: list[Any] = []
        self._appender = store.open_append(key) if store.supports_append else None
        #: Whether zeros are written ahead of the entries (``write_ahead`` bytes, on a store
        #: that appends: :meth:`Appender.write_ahead
        #: <filepulsar.storage.blobstore.local.Appender.write_ahead>`), so a :meth:`sync`
        #: flushes data alone. The blob's size then says nothing of what is written: a
        #: commit naming its entries must follow their :meth:`sync` (FORMAT.md, "Journal").
        self.writes_ahead = bool(write_ahead) and self._appender is not None
        if self._appender is not None and write_ahead:
            self._appender.write_ahead(write_ahead)

    @property
    def appends(self) -> bool:
        """True when the bytes go to the store as they are written (the store appends)."""
        return self._appender is not None

    def write(self, entries: list[PendingEntry]) -> list[int]:
        """Add the entries' bytes, in order, releasing their buffers (``parts`` set to
        ``[]``); return each entry's offset in the blob."""
        parts = [p for e in entries for p in e.parts]
        if self._appender is not None:
            pos = self._appender.write_many(parts)
        else:
            self._parts.extend(parts)
            pos = self.size
        offsets = []
        for e in entries:
            offsets.append(pos)
            pos += e.size
            e.parts = []
        self.size = pos
        return offsets

    def start_flush(self) -> None:
        """Start writing back what is appended so far (the final sync then has less left)."""
        if self._appender is not None:
            self._appender.start_flush()

    def start_sync(self) -> None:
        """Start the fsync of what is appended in the background; :meth:`sync` waits for it."""
        if self._appender is not None:
            self._appender.start_sync()

    def sync(self) -> None:
        """Make what is appended so far durable."""
        if self._appender is not None:
            self._appender.sync()

    def finish(self, *, durable: bool = True) -> None:
        """Make the blob whole: sync (when ``durable``) and close an appended one, or put the
        gathered bytes in one write."""
        if self._appender is not None:
            if durable:
                self._appender.sync()
            self._appender.close()
        else:
            self.store.put(self.key, b"".join(self._parts))
            self._parts = []

    def close(self) -> None:
        """Stop writing (nothing more is synced or put)."""
        if self._appender is not None:
            self._appender.close()
        self._parts = []

    def abandon(self) -> None:
        """Close and delete the blob (it will never be published)."""
        self.close()
        if self.appends:
            self.store.delete(self.key)
