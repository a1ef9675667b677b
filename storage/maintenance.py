"""The lease of ``filepulsar maintain`` (FORMAT.md, "Maintenance lease"): its state and where
it is kept.

Several ``maintain`` instances may run at once; a lease per scope (every namespace, one
tenant's, or one namespace) decides which one works. The lease is a versioned state,
:class:`LeaseState`, committed in :func:`filepulsar.storage.paths.maintenance_lease_dir` with the
same protocol as manifests and cursors (:func:`lease_store`), so two instances never both
take it. The loop that takes, renews and gives it up is :mod:`filepulsar.jobs.maintain`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from filepulsar.storage import paths
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import CorruptDataError
from filepulsar.storage.versioned import VersionedStore, envelope

#: The lease's format number (its ``format`` field).
LEASE_FORMAT = 1


@dataclass
class LeaseState:
    """One version of a scope's lease. ``holder`` works until ``expires_ms`` (wall clock)."""

    holder: str = ""
    expires_ms: int = 0
    acquired_ms: int = 0
    version: int = 0
    updated_ms: int = 0
    commit_id: str = ""
    prev_commit_id: str = ""

    def encode(self) -> bytes:
        """Line 1 the lease as compact JSON, line 2 ``crc32c=<8 hex>`` over line 1 (the
        versioned states' envelope, storage/FORMAT.md "Maintenance lease")."""
        return envelope.encode(
            {
                "format": LEASE_FORMAT,
                "holder": self.holder,
                "commitId": self.commit_id,
                "prevCommitId": self.prev_commit_id,
                "expires": self.expires_ms,
                "acquired": self.acquired_ms,
                "version": self.version,
                "updated": self.updated_ms,
            }
        )

    @classmethod
    def decode(cls, raw: bytes, where: str) -> LeaseState:
        """Parse a lease version: the framed form, checksum verified, or the bare JSON object
        written before leases were framed.

        Raises
        ------
        CorruptDataError
            Naming ``where``, if the checksum fails or a field is missing or of the wrong type.
        IncompatibleFormat
            If the lease was written in another format.
        """
        try:
            d = envelope.open_framed(raw, "maintenance lease", where, (LEASE_FORMAT,), bare_ok=True)
            ints = [d[k] for k in ("expires", "acquired", "version", "updated")]
            strs = [d[k] for k in ("holder", "commitId", "prevCommitId")]
            if any(type(x) is not int for x in ints) or any(type(x) is not str for x in strs):
                raise TypeError(f"fields of the wrong type: {d!r:.200}")
            expires, acquired, version, updated = ints
            holder, commit_id, prev_commit_id = strs
            return cls(holder, expires, acquired, version, updated, commit_id, prev_commit_id)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptDataError(f"{where}: not a maintenance lease ({e})") from e


def lease_store(
    store: BlobStore,
    tenant: str | None = None,
    namespace: str | None = None,
    *,
    what: str,
    clock: Callable[[], int] | None = None,
) -> VersionedStore[LeaseState]:
    """The versioned store of one scope's lease: every namespace (no ``tenant``), one
    tenant's namespaces, or one namespace; ``what`` names it in errors."""
    folder = paths.maintenance_lease_dir(tenant, namespace)
    return VersionedStore(store, folder, LeaseState.decode, what=what, clock=clock)
