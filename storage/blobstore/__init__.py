"""The blob store: whole-object storage under one root, the only module that touches fsspec.

Everything above this module speaks in relative keys such as
``persistent/public/default/orders/manifest/00000000000000000001.json``; a store maps them
under its root. Keys are ``/``-separated, relative, and may not contain empty, ``.`` or ``..``
segments, backslashes or control characters (``ValueError`` otherwise), so nothing a caller
passes can reach a path outside the root.

The commit protocol of the managed ledger rests on :meth:`BlobStore.put_if_absent`, an atomic
create whose content is all-or-nothing. How each backend provides it:

========== ====================================================================================
backend    put_if_absent
========== ====================================================================================
local      write an anonymous temporary file (``O_TMPFILE``) in the target directory, fsync
           it, ``linkat`` it to the final name (``EEXIST`` means the key existed), fsync the
           directory. Where ``O_TMPFILE`` is refused: a named temporary file, linked, then
           unlinked. A crash leaves at most a temporary file (none with ``O_TMPFILE``),
           never a torn final file. Needs a filesystem with hard links.
memory     a process-wide lock around check-and-store. ``memory://`` lives in this process
           only (fsspec's memory filesystem is process-global): for tests and notebooks.
s3         a conditional PUT with ``If-None-Match: *`` (s3fs ``pipe_file(mode="create")``);
           ``412 PreconditionFailed`` means the key existed, ``409 ConditionalRequestConflict``
           is retried.
other      refused with :class:`BlobStoreError` until atomic create is proven for that
           backend (fsspec's generic ``mode="create"`` is check-then-write, not atomic).
========== ====================================================================================

This module opens a store for a root (:func:`open_blob_store`); the interface and the key rules
are in :mod:`filepulsar.storage.blobstore.port`, the backends in
:mod:`filepulsar.storage.blobstore.local` and :mod:`filepulsar.storage.blobstore.fsspec`.
"""

from __future__ import annotations

from typing import Any

from filepulsar.storage.blobstore.fsspec import FsspecBlobStore, MemoryBlobStore, S3BlobStore
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import (
    BlobExists,
    BlobNotFound,
    BlobStoreError,
    BlobTruncated,
    InvalidConfiguration,
)

# Re-exported: BlobStore is the storage package's public type (filepulsar.storage exports it,
# filepulsar.admin.Admin documents it under this module), and the blob errors live in
# storage.errors and were always reachable here.
__all__ = [
    "BlobExists",
    "BlobNotFound",
    "BlobStore",
    "BlobStoreError",
    "BlobTruncated",
    "open_blob_store",
]

_S3_PROTOCOLS = ("s3", "s3a")
_LOCAL_PROTOCOLS = ("file", "local")


def open_blob_store(root: str, *, storage_options: dict[str, Any] | None = None) -> BlobStore:
    """Open the blob store for ``root``.

    Parameters
    ----------
    root : str
        A local path or ``file://`` URL, ``memory://<name>``, ``s3://bucket/prefix``, or any
        other fsspec URL (a :class:`FsspecBlobStore` whose ``put_if_absent`` is refused).
    storage_options : dict, optional
        Passed to the fsspec filesystem (for S3: ``endpoint_url``, ``key``, ``secret``,
        ``client_kwargs`` ...). Local and memory roots take none. For S3, s3fs's instance
        and listing caches are always turned off.

    Raises
    ------
    InvalidConfiguration
        (a ``ValueError``) The root is empty or malformed, its scheme is unknown, or options
        were given for a local or memory root or are not accepted by the backend.
    """
    if not isinstance(root, str):
        raise InvalidConfiguration(f"storage root must be a string, got {type(root).__name__}")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise InvalidConfiguration(
            f"storage_options must be a dict, got {type(storage_options).__name__}"
        )
    options = dict(storage_options or {})
    if "://" not in root and "::" not in root:
        # A plain local path: no need to import fsspec (it costs every Spark task's worker).
        if options:
            raise InvalidConfiguration(_no_options(options, root))
        if not root:
            raise InvalidConfiguration(_EMPTY_ROOT)
        return LocalBlobStore(root)
    import fsspec

    protocol, path = fsspec.core.split_protocol(root)
    if protocol in (None, *_LOCAL_PROTOCOLS) or protocol == "memory":
        if options:
            raise InvalidConfiguration(_no_options(options, root))
        if protocol == "memory":
            name = path.strip("/")
            if not name:
                raise InvalidConfiguration(f"memory root {root!r} needs a name: memory://<name>")
            fs = fsspec.filesystem("memory")
            return MemoryBlobStore(fs, f"/{name}", f"memory://{name}")
        if not path:
            raise InvalidConfiguration(_EMPTY_ROOT)
        return LocalBlobStore(path)
    known = fsspec.available_protocols()
    if any(p not in known for p in str(protocol).split("::")):
        raise InvalidConfiguration(
            f"storage root {root!r} has an unknown scheme {protocol!r}: use a local path, "
            "file://, memory://<name> or s3://bucket/prefix"
        )
    try:
        fs, base = fsspec.core.url_to_fs(
            root,
            **(
                {**options, "skip_instance_cache": True, "use_listings_cache": False}
                if protocol in _S3_PROTOCOLS
                else options
            ),
        )
        if protocol in _S3_PROTOCOLS:
            fs.connect()  # builds the client now: options it does not take fail here, not later
    except (ImportError, TypeError, ValueError) as e:
        # A missing backend package or options the backend does not take.
        raise InvalidConfiguration(f"cannot open storage root {root!r}: {e}") from e
    if protocol in _S3_PROTOCOLS:
        base = base.rstrip("/")
        if not base:
            raise InvalidConfiguration(f"S3 root {root!r} needs a bucket: s3://bucket/prefix")
        return S3BlobStore(fs, base, f"s3://{base}")
    return FsspecBlobStore(fs, base, fs.unstrip_protocol(base))


_EMPTY_ROOT = "storage root must not be empty: give a local path, memory://<name> or s3://..."


def _no_options(options: dict[str, Any], root: str) -> str:
    return (
        f"storage_options {sorted(options)} do not apply to {root!r}: only object stores "
        "(s3://...) take options"
    )
