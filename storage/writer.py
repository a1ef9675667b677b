"""Writing one producer session's entries: :class:`LedgerWriter` appends their bytes to a blob of
its own, syncs them and publishes them with one manifest commit (a
:class:`filepulsar.storage.commit.Publish` whose guard checks and renews the producer's lease).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from filepulsar.dispatch.modes import ProducerAccessMode
from filepulsar.storage import paths
from filepulsar.storage.commit import LEDGER_MISMATCH as _MISMATCH
from filepulsar.storage.commit import PendingEntry, Publish
from filepulsar.storage.entry_blob import EntryBlob
from filepulsar.storage.errors import ProducerFenced
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.policies import Policies

#: The largest append :meth:`LedgerWriter.append` syncs in the writer's thread when asked
#: (``sync_first``); a larger one always syncs in the background while the commit is prepared.
INLINE_SYNC_BYTES = 32 * 1024

#: The part of a producer's lease that passes before a commit renews it. A commit that renews
#: it writes the lease into the manifest's record; one that does not leaves it out, so a
#: producer sending one message per commit writes it about once every quarter of the lease
#: instead of in every record (which every other writer and reader of the topic folds). The
#: producer's I/O thread renews each partition's lease a third of the lease after it was last
#: renewed there (between writes to other partitions as when idle), so either way a live
#: lease is renewed at least every third of it (FORMAT.md, "producers"). A quarter, not that
#: same third: a partition written at least once in the twelfth of the lease between them
#: (2.5 s by default) has its lease renewed by its data commits alone, never by a commit of
#: its own (with both at a third, the I/O thread came first nearly every time: a gateway of
#: 30 producers at 100 msg/s spent 4% of its commits on renewals).
RENEW_AFTER = 1 / 4

#: Zeros a producer's blob keeps written after its entries (on a local disk), so the sync of
#: each append is an ``fdatasync`` of data alone (EntryBlob); its appends are then always
#: synced before their commit starts (``append_stream``).
WRITE_AHEAD_BYTES = 64 * 1024


class LedgerWriter:
    """Writes one producer session's entries to a managed ledger and commits them.

    Not thread-safe: one writer thread per instance. The producer's lease in the manifest is
    checked by every commit, and renewed by one that finds more than a quarter of it gone
    (:data:`RENEW_AFTER`; :attr:`lease_renewed` says whether the last commit did); losing it
    raises :class:`ProducerFenced`.
    """

    def __init__(
        self,
        ml: ManagedLedger,
        *,
        producer_name: str,
        session: str,
        policies: Policies,
        durable: bool = True,
    ) -> None:
        self.ml = ml
        self.producer_name = producer_name
        self.session = session
        self.policies = policies
        self.durable = durable
        #: The blob being appended to (stores that append; None between blobs).
        self._open_blob: EntryBlob | None = None
        self._blob: str | None = None
        self._blob_seq = 0
        self._blob_ledger: int | None = None
        #: Whether the last commit renewed this session's lease (see :data:`RENEW_AFTER`).
        self.lease_renewed = False

    def _new_blob_id(self) -> str:
        self._blob_seq += 1
        return paths.session_blob_id(self.session, self._blob_seq)

    def _write(self, entries: list[PendingEntry]) -> tuple[str, list[int]]:
        """Write the entries' bytes (not yet synced; their buffers are released); return the
        blob id and their offsets. A store that appends keeps one blob across writes until
        :meth:`_drop_blob`; on the others every write is a blob of its own."""
        store = self.ml.store
        if self._open_blob is None:
            self._blob = self._new_blob_id()
            self._blob_ledger = None
            blob = EntryBlob(
                store,
                paths.data_blob(self.ml.topic, self._blob),
                write_ahead=WRITE_AHEAD_BYTES if self.durable else 0,
            )
            if not blob.appends:
                offsets = blob.write(entries)
                blob.finish()
                return self._blob, offsets
            self._open_blob = blob
        assert self._blob is not None
        return self._blob, self._open_blob.write(entries)

    def _sync(self) -> None:
        if self._open_blob is not None and self.durable:
            self._open_blob.sync()

    def _start_sync(self) -> None:
        """Start the data fsync in the background; :meth:`_sync` (called by the commit
        before it writes the manifest that names the bytes) waits for it."""
        if self._open_blob is not None and self.durable:
            self._open_blob.start_sync()

    def _drop_blob(self) -> None:
        if self._open_blob is not None:
            self._open_blob.close()
        self._open_blob = None
        self._blob = None
        self._blob_ledger = None

    def append(
        self,
        entries: list[PendingEntry],
        *,
        dedup: bool,
        follows: list[bool] | None = None,
        sync_first: bool = False,
    ) -> list[Position | None]:
        """Write and commit ``entries`` in order; None marks a duplicate that was dropped.

        ``follows[i]`` joins entry ``i`` to entry ``i-1``: a joined run (the chunks of one
        message) is kept or dropped whole, by its last entry's ids. Returns only once the
        entries are durable and committed.

        ``sync_first``: when the entries are small (at most :data:`INLINE_SYNC_BYTES`), fsync
        their bytes in this thread before the commit starts, instead of in the appender's
        thread while the commit is prepared. It saves the two thread switches of that
        hand-off (about a tenth of the CPU of a one-message publish) and costs one fsync of
        latency; a producer's I/O thread asks for it (its messages already wait for the
        batching delay), a ``send()`` writing its own message does not. On a local disk
        the blob keeps zeros written ahead (:data:`WRITE_AHEAD_BYTES`): every append is then
        synced (an ``fdatasync`` of data alone) before its commit starts, whatever
        ``sync_first`` says.

        Raises
        ------
        ProducerFenced
            If this session's lease is gone or another producer holds the topic exclusively.
        """
        return self.append_stream([entries], dedup=dedup, follows=follows, sync_first=sync_first)

    def append_stream(
        self,
        groups: Iterable[list[PendingEntry]],
        *,
        dedup: bool,
        follows: list[bool] | None = None,
        sync_first: bool = False,
    ) -> list[Position | None]:
        """Like :meth:`append` for entries produced group by group.

        Each group is written as soon as it arrives and its buffers are released (set to
        ``[]``), so a large bulk write never holds all its bytes in memory; one sync and one
        commit publish everything at the end.
        """
        entries: list[PendingEntry] = []
        blobs: list[str] = []
        offsets: list[int] = []
        for group in groups:
            if not group:
                continue
            if entries and self._open_blob is not None and self.durable:
                # More than one group: write back what is already written while this one is
                # encoded and written, so the final sync has little left (bulk sends).
                self._open_blob.start_flush()
            blob, offs = self._write(group)  # releases the group's buffers
            entries.extend(group)
            blobs.extend([blob] * len(group))
            offsets.extend(offs)
        if not entries:
            return []
        blob_now = self._open_blob
        if (blob_now is not None and blob_now.writes_ahead) or (
            sync_first and sum(e.size for e in entries) <= INLINE_SYNC_BYTES
        ):
            # (Before the commit rather than in it: the journal record stays in flight for its
            # own fdatasync only.) A blob written ahead is always synced first: its size does
            # not show whether the bytes a record names were written (FORMAT.md, "Journal",
            # settling), so no record may name them before they are durable.
            self._sync()
            synced = True
        else:
            # The data fsync runs while the commit applies the change and writes the
            # manifest's bytes; the commit waits for it before the manifest becomes visible
            # (FORMAT.md: data durable first).
            self._start_sync()
            synced = False
        while True:
            closed_after: list[bool] = [False]
            result = self._commit(entries, blobs, offsets, dedup, follows, closed_after, synced)
            if result is _MISMATCH:
                # Another writer rolled the ledger our blob belongs to: copy our bytes into a
                # fresh blob (re-read from the old one, which stays an unreferenced orphan).
                blobs, offsets = self._rewrite(entries, blobs, offsets)
                synced = True
                continue
            assert isinstance(result, list)
            if closed_after[0] or not self.ml.store.supports_append:
                self._drop_blob()
            return result

    def _rewrite(
        self, entries: list[PendingEntry], blobs: list[str], offsets: list[int]
    ) -> tuple[list[str], list[int]]:
        store = self.ml.store
        self._drop_blob()
        for e, blob, off in zip(entries, blobs, offsets):
            e.parts = [store.get_range(paths.data_blob(self.ml.topic, blob), off, off + e.size)]
        blob, offs = self._write(entries)
        self._sync()
        return [blob] * len(entries), offs

    def _commit(
        self,
        entries: list[PendingEntry],
        blobs: list[str],
        offsets: list[int],
        dedup: bool,
        follows: list[bool] | None,
        closed_after: list[bool],
        synced: bool,
    ) -> list[Position | None] | str:
        name, session, lease_ms = self.producer_name, self.session, self.policies.producer_lease_ms
        keep_until = lease_ms - int(lease_ms * RENEW_AFTER)  # renew when less is left
        renewed = [False]

        def guard(state: ManifestState, now: int) -> None:
            lease = state.producers.get(name)
            if lease is None or lease.session != session:
                raise ProducerFenced(
                    f"producer {name!r} on {self.ml.topic} lost its registration "
                    "(lease expired or taken over)"
                )
            if (
                lease.epoch != state.topic_epoch
                and lease.access_mode is not ProducerAccessMode.Shared
            ):
                raise ProducerFenced(
                    f"producer {name!r} on {self.ml.topic} was fenced by a newer exclusive producer"
                )
            renewed[0] = lease.expires_ms - now < keep_until
            if renewed[0]:
                state.producers[name] = lease.renewed(now + lease_ms)

        publish = Publish(
            self.ml,
            entries,
            blobs,
            offsets,
            policies=self.policies,
            dedup=dedup,
            guard=guard,
            follows=follows,
            blob_ledger=self._blob_ledger,
            durable=self.durable,
        )
        # The entries' bytes are durable before any manifest names them: the commit waits
        # for their sync just before the manifest is linked. Where append_stream only started
        # that sync, it overlaps with writing and fsyncing the manifest's bytes; a blob with
        # zeros written ahead (a durable producer's, on a local disk) was synced before the
        # commit began, and the wait returns at once. On a local disk's journal, a commit
        # record whose writer died before marking it counts only if these bytes are there
        # (FORMAT.md, "Journal"). Bytes synced before the commit began (``synced``) need no
        # wait: the commit is then given none (one call chain less inside every commit).
        result = publish.commit(before_link=None if synced else self._sync)
        self.lease_renewed = renewed[0]
        if publish.ledger_id is not None:
            self._blob_ledger = publish.ledger_id
        closed_after[0] = publish.closed
        return result

    def renew_lease(self) -> None:
        """Extend this session's lease (the I/O thread, on a partition no commit renewed lately).

        Raises
        ------
        ProducerFenced
            If the lease is already gone.
        """
        name, session, lease_ms = self.producer_name, self.session, self.policies.producer_lease_ms

        def change(state: ManifestState) -> None:
            lease = state.producers.get(name)
            if lease is None or lease.session != session:
                raise ProducerFenced(
                    f"producer {name!r} on {self.ml.topic} lost its registration "
                    "(lease expired or taken over)"
                )
            state.producers[name] = lease.renewed(self.ml.clock() + lease_ms)

        self.ml.manifest.commit(change)

    def close(self) -> None:
        self._drop_blob()


def new_session_id() -> str:
    """A unique id for a producer session (names its blobs)."""
    return uuid.uuid4().hex[:20]
