"""The blob-store port: the :class:`BlobStore` interface every backend implements, the rules
for keys (relative, ``/``-separated, no ``.``/``..`` or temporary-file names) and the mapping of
OS and backend errors to blob-store errors. Backends: :mod:`filepulsar.storage.blobstore.local`,
:mod:`filepulsar.storage.blobstore.fsspec`; :func:`filepulsar.storage.blobstore.open_blob_store`
picks one for a root.
"""

from __future__ import annotations

import builtins
import contextlib
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING

from filepulsar.storage import paths
from filepulsar.storage.errors import BlobNotFound, BlobStoreError

if TYPE_CHECKING:
    from filepulsar.storage.blobstore.local import Appender

#: Suffix of the temporary files a local store writes next to their final name
#: (:func:`storage.paths.temp_name`).
TMP_SUFFIX = paths.TMP_SUFFIX
_CONTROL_CHARS = re.compile("[\x00-\x1f\x7f]")


def check_key(key: str, *, allow_root: bool = False) -> str:
    """``key`` when every backend can store it: a non-empty relative ``/``-separated string
    (``""`` only with ``allow_root``) without backslashes, control characters, empty, ``.``
    or ``..`` segments, or a temporary file's name; else TypeError/ValueError naming it."""
    if not isinstance(key, str):
        raise TypeError(f"blob key must be a str, not {type(key).__name__}")
    if key == "" and allow_root:
        return key
    if key == "":
        raise ValueError("blob key must not be empty")
    if key.startswith("/"):
        raise ValueError(f"blob key {key!r} must be relative (no leading '/')")
    if "\\" in key:
        raise ValueError(f"blob key {key!r} must not contain a backslash")
    if _CONTROL_CHARS.search(key):
        raise ValueError(f"blob key {key!r} must not contain control characters")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"blob key {key!r} has an empty, '.' or '..' segment")
    name = key.rsplit("/", 1)[-1]
    if name.startswith(".") and name.endswith(TMP_SUFFIX):
        raise ValueError(f"blob key {key!r} is reserved for temporary files")
    return key


def check_prefix_to_delete(prefix: str) -> str:
    """``prefix`` when ``delete_prefix`` may take it: a valid key, never the whole store."""
    if prefix == "":
        raise ValueError("delete_prefix('') would delete the whole store; name a directory")
    return check_key(prefix)


def check_byte_range(key: str, start: int, end: int) -> None:
    """Raise ValueError naming ``key`` unless ``0 <= start <= end``."""
    if start < 0 or end < start:
        raise ValueError(f"invalid byte range [{start}, {end}) for {key!r}")


def is_tmp_name(name: str) -> bool:
    """Whether a file name is a backend's temporary file (a dot name ending in
    :data:`TMP_SUFFIX`), which listings skip and keys may not be."""
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


@contextlib.contextmanager
def translate_errors(
    url: str,
    operation: str,
    *,
    reading: bool,
    errors: tuple[type[Exception], ...] = (OSError,),
) -> Iterator[None]:
    """Turn OS and backend errors into blob-store errors naming ``url``.

    When ``reading``, a missing file or a directory where the blob should be is
    :class:`BlobNotFound`; every other error in ``errors`` is :class:`BlobStoreError`.
    """
    try:
        yield
    except errors as e:
        raise translated(e, url, operation, reading=reading) from e


def translated(e: Exception, url: str, operation: str, *, reading: bool) -> Exception:
    """The blob-store error for ``e`` (as :func:`translate_errors` turns it; the caller
    raises it ``from e``)."""
    if reading and isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return BlobNotFound(f"{operation}: no blob at {url}")
    return BlobStoreError(f"{operation} failed for {url}: {e}")


class BlobStore(ABC):
    """Whole blobs under one root, addressed by relative keys.

    Attributes
    ----------
    root : str
        The normalised root URL (``file:///abs/path``, ``memory://name``,
        ``s3://bucket/prefix``).
    supports_append : bool
        Whether :meth:`open_append` works (local files only).

    Every method validates its key (``ValueError``) and reports backend failures as
    :class:`BlobStoreError` naming the URL, with the original error as ``__cause__``.
    """

    root: str
    supports_append: bool = False

    def url(self, key: str) -> str:
        """Return the full URL of ``key`` (for messages and logs)."""
        return f"{self.root}/{check_key(key, allow_root=True)}".rstrip("/")

    @abstractmethod
    def put(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` as the whole blob ``key``, replacing any previous blob.

        Readers see the old or the new content, never a mix. Durable when it returns
        (local: temporary file, fsync, ``os.replace``, fsync of the directory).
        """

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        """Create ``key`` with ``data`` unless it exists: an atomic, all-or-nothing create.

        Among any number of concurrent callers (threads, processes, machines sharing the
        backend) exactly one gets ``True``; the others get ``False`` and the content is the
        winner's. Readers never see partial content. Durable when it returns ``True``.

        Returns
        -------
        bool
            ``True`` if this call created the blob, ``False`` if the key already existed.

        Raises
        ------
        BlobStoreError
            The backend failed, or cannot create atomically. On S3 a request whose answer
            was lost and that the client retried may report ``False`` for a blob this call
            created; callers that must know put a unique writer id in ``data`` and read back.
        """

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Return the whole blob.

        Raises
        ------
        BlobNotFound
            No blob at ``key``.
        """

    @abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Return bytes ``[start, end)`` of the blob (a ranged read, not a full download).

        Raises
        ------
        ValueError
            ``start < 0`` or ``end < start``.
        BlobNotFound
            No blob at ``key``.
        BlobStoreError
            The blob is shorter than ``end``; the message names the key and the range.
        """

    def get_range_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of a blob whose bytes in that range never change once
        written, possibly without copying them (a read-only memory map of a local file).

        Only for such ranges: the committed fragments of data blobs, which are append-only
        (storage/FORMAT.md, "Reading data blobs"). Raises like :meth:`get_range`; this
        default is :meth:`get_range`.
        """
        return self.get_range(key, start, end)

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Return whether a blob (not a directory) exists at ``key``; never cached."""

    @abstractmethod
    def size(self, key: str) -> int:
        """Return the blob's size in bytes; :class:`BlobNotFound` if missing."""

    @abstractmethod
    def mtime_ms(self, key: str) -> int:
        """Return the blob's modification time in epoch milliseconds (S3: 1 s resolution).

        Raises :class:`BlobNotFound` if missing.
        """

    @abstractmethod
    def list(self, prefix: str) -> builtins.list[str]:
        """Return the keys of all blobs below the directory ``prefix``, recursively, sorted.

        ``prefix`` names a directory (``""`` for the root): ``list("a/b")`` returns
        ``a/b/x`` and ``a/b/c/y`` but not ``a/bc/z``. ``[]`` if there are none. Never served
        from a cache.
        """

    @abstractmethod
    def list_dirs(self, prefix: str) -> builtins.list[str]:
        """Return the names of the immediate child directories of ``prefix``, sorted.

        Object stores have a directory only while a blob lies below it; a local store may
        also report a directory left empty by :meth:`delete`.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete the blob ``key``; a missing key is not an error."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Delete every blob below the directory ``prefix``; the root itself is refused."""

    def open_append(self, key: str) -> Appender:
        """Create ``key`` exclusively and return an :class:`Appender` for it.

        Raises
        ------
        NotImplementedError
            The backend has no appends (``supports_append`` is ``False``).
        BlobExists
            The key already exists.
        """
        raise NotImplementedError(
            f"{type(self).__name__} at {self.root} cannot append; "
            "write whole blobs with put() or put_if_absent()"
        )

    def local_path(self, key: str) -> str | None:
        """Return the absolute OS path of ``key`` for a local store (to memory-map), else None."""
        check_key(key)
        return None

    def journal_dir(self, folder: str, *, create: bool = False) -> str | None:
        """The OS path of ``folder`` if versioned states in it are kept as a journal (a local
        disk: FORMAT.md, "Journal"), else None. ``create`` makes the folder (durably)."""
        check_key(folder)
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"
