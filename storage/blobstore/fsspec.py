"""The blob stores on fsspec filesystems: :class:`FsspecBlobStore` (any filesystem; its
``put_if_absent`` is refused), :class:`MemoryBlobStore` (``memory://``, for tests and notebooks)
and :class:`S3BlobStore` (conditional PUTs through s3fs). They use the filesystem object
:func:`filepulsar.storage.blobstore.open_blob_store` built; only that function imports fsspec.
"""

from __future__ import annotations

import builtins
import contextlib
import random
import threading
from typing import Any

from filepulsar.dispatch.clock import SYSTEM
from filepulsar.storage.blobstore.port import (
    BlobStore,
    check_byte_range,
    check_key,
    check_prefix_to_delete,
    translate_errors,
)
from filepulsar.storage.errors import BlobNotFound, BlobStoreError, BlobTruncated
from filepulsar.storage.forks import in_forked_child

_CONFLICT_RETRIES = 8
_MEMORY_LOCK = threading.Lock()


@in_forked_child
def _fresh_memory_lock() -> None:
    """A forked child gets a lock of its own (memory:// files are the child's copy): the
    parent's copy may have been held by one of its threads at the fork, and would stay held
    in the child for ever."""
    global _MEMORY_LOCK
    _MEMORY_LOCK = threading.Lock()


class FsspecBlobStore(BlobStore):
    """Blobs on any fsspec filesystem; the base of the memory and S3 stores.

    Used directly for protocols without a dedicated store. Such a store reads, lists, puts
    and deletes with the backend's own guarantees, but :meth:`put_if_absent` raises
    :class:`BlobStoreError`: atomic create must be proven for a backend (a race test, as for
    S3) before the commit protocol can run on it, and fsspec's generic ``mode="create"`` is
    check-then-write.
    """

    #: Exceptions the backend raises besides ``OSError``, reported as :class:`BlobStoreError`.
    _errors: tuple[type[Exception], ...] = (OSError,)

    def __init__(self, fs: Any, base: str, root: str) -> None:
        self._fs = fs
        self._base = base.rstrip("/")
        self.root = root.rstrip("/")

    def _guard(
        self, key: str, operation: str, *, reading: bool
    ) -> contextlib.AbstractContextManager[None]:
        return translate_errors(self.url(key), operation, reading=reading, errors=self._errors)

    def _path(self, key: str, *, allow_root: bool = False) -> str:
        key = check_key(key, allow_root=allow_root)
        return f"{self._base}/{key}" if key else self._base

    def _key_of(self, path: str) -> str:
        return path[len(self._base) + 1 :]

    def put(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        with self._guard(key, "put", reading=False):
            self._fs.pipe_file(path, bytes(data))

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        check_key(key)
        raise BlobStoreError(
            f"put_if_absent is not proven atomic for {self.root} "
            f"({type(self._fs).__name__}); the commit protocol needs an atomic create, "
            "use a local, memory:// or s3:// root"
        )

    def get(self, key: str) -> bytes:
        path = self._path(key)
        with self._guard(key, "get", reading=True):
            return bytes(self._fs.cat_file(path))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        path = self._path(key)
        check_byte_range(key, start, end)
        if start == end:
            if self.size(key) < start:
                raise BlobTruncated(f"range [{start}, {end}) is past the end of {self.url(key)}")
            return b""
        try:
            with self._guard(key, "get_range", reading=True):
                data = bytes(self._fs.cat_file(path, start=start, end=end))
        except BlobNotFound:
            raise
        except BlobStoreError as e:
            # S3 answers a range that starts past the end with 416 InvalidRange.
            if self.exists(key):
                raise BlobTruncated(
                    f"short read from {self.url(key)}: wanted bytes [{start}, {end})"
                ) from e
            raise BlobNotFound(f"get_range: no blob at {self.url(key)}") from e
        if len(data) != end - start:
            raise BlobTruncated(
                f"short read from {self.url(key)}: wanted bytes [{start}, {end}), "
                f"got {len(data)} bytes"
            )
        return data

    def _info(self, key: str, operation: str) -> dict[str, Any]:
        path = self._path(key)
        with self._guard(key, operation, reading=True):
            info: dict[str, Any] = self._fs.info(path)
        if info.get("type") != "file":
            raise BlobNotFound(f"{operation}: no blob at {self.url(key)} (a directory)")
        return info

    def exists(self, key: str) -> bool:
        try:
            self._info(key, "exists")
        except BlobNotFound:
            return False
        return True

    def size(self, key: str) -> int:
        return int(self._info(key, "size")["size"])

    def mtime_ms(self, key: str) -> int:
        path = self._path(key)
        self._info(key, "mtime_ms")
        with self._guard(key, "mtime_ms", reading=True):
            return int(self._fs.modified(path).timestamp() * 1000)

    def list(self, prefix: str) -> builtins.list[str]:
        path = self._path(prefix, allow_root=True)
        with self._guard(prefix, "list", reading=False):
            found = self._fs.find(path)
        below = f"{path}/"
        return sorted(self._key_of(p) for p in found if p.startswith(below) and p[-1] != "/")

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        path = self._path(prefix, allow_root=True)
        try:
            with self._guard(prefix, "list_dirs", reading=True):
                entries = self._fs.ls(path, detail=True)
        except BlobNotFound:
            return []
        names = {
            e["name"].rstrip("/").rsplit("/", 1)[-1]
            for e in entries
            if e["type"] == "directory" and e["name"].rstrip("/") != path
        }
        return sorted(names)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(BlobNotFound), self._guard(key, "delete", reading=True):
            self._fs.rm_file(path)

    def delete_prefix(self, prefix: str) -> None:
        keys = self.list(check_prefix_to_delete(prefix))
        if keys:
            with self._guard(prefix, "delete_prefix", reading=False):
                self._fs.rm([self._path(k) for k in keys])


class MemoryBlobStore(FsspecBlobStore):
    """Blobs in fsspec's memory filesystem under ``memory://<name>``.

    The memory filesystem is global to the process: every store with the same name in this
    process sees the same blobs, and nothing is shared with other processes or survives
    exit. For tests and notebooks. Mutations take one process-wide lock, which makes
    :meth:`put_if_absent` atomic.
    """

    def put(self, key: str, data: bytes | memoryview) -> None:
        with _MEMORY_LOCK:
            super().put(key, data)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        path = self._path(key)
        with _MEMORY_LOCK, self._guard(key, "put_if_absent", reading=False):
            if self._fs.isfile(path):
                return False
            self._fs.pipe_file(path, bytes(data))
            return True

    def exists(self, key: str) -> bool:
        return bool(self._fs.isfile(self._path(key)))

    def delete(self, key: str) -> None:
        with _MEMORY_LOCK:
            super().delete(key)

    def delete_prefix(self, prefix: str) -> None:
        with _MEMORY_LOCK:
            super().delete_prefix(prefix)


def _s3_error_code(error: BaseException) -> str | None:
    """Return the S3 error code behind an s3fs exception (its botocore cause), if any."""
    cause = error.__cause__
    response = getattr(cause, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


class S3BlobStore(FsspecBlobStore):
    """Blobs as S3 objects under ``s3://bucket/prefix``, through s3fs.

    A PUT is atomic and durable when acknowledged; listings and existence checks always go to
    the server (s3fs's listing cache is off), since a stale answer would break the commit
    protocol. :meth:`put_if_absent` is a conditional PUT with ``If-None-Match: *`` (also on
    the completion of a multipart upload, for blobs above s3fs's 100 MB threshold).
    """

    def __init__(self, fs: Any, base: str, root: str) -> None:
        from botocore.exceptions import BotoCoreError  # s3fs's own dependency

        super().__init__(fs, base, root)
        # s3fs passes botocore's connection and timeout errors through untranslated.
        self._errors = (OSError, BotoCoreError)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        path = self._path(key)
        url = self.url(key)
        body = bytes(data)
        conflicts = 0
        while True:
            try:
                self._fs.pipe_file(path, body, mode="create")
            except FileExistsError:
                return False
            except self._errors as e:
                code = _s3_error_code(e)
                if code == "PreconditionFailed":
                    return False
                conflicts += 1
                if code != "ConditionalRequestConflict" or conflicts >= _CONFLICT_RETRIES:
                    raise BlobStoreError(f"put_if_absent failed for {url}: {e}") from e
                # S3 answers 409 while another conditional write to the key is in flight;
                # the retry then gets 412 or succeeds.
                SYSTEM.sleep(random.uniform(0.01, 0.05) * conflicts)
                continue
            return True

    def get(self, key: str) -> bytes:
        path = self._path(key)
        with self._guard(key, "get", reading=True):
            # One GET: a concurrent chunked download could mix two versions of the object.
            return bytes(self._fs.cat_file(path, max_concurrency=1))

    def _info(self, key: str, operation: str) -> dict[str, Any]:
        # One HEAD. s3fs's ``info`` follows a 404 with a LIST of ``<key>/`` (is it a
        # "directory"?): that doubled the cost of every existence check of a missing key
        # (the idle check for the next manifest version), and a LIST is priced as a PUT.
        bucket, name, _ = self._fs.split_path(self._path(key))
        with self._guard(key, operation, reading=True):
            out = self._fs.call_s3("head_object", self._fs.kwargs, Bucket=bucket, Key=name)
        return {"type": "file", "size": out["ContentLength"], "LastModified": out["LastModified"]}

    def mtime_ms(self, key: str) -> int:
        return int(self._info(key, "mtime_ms")["LastModified"].timestamp() * 1000)
