"""A child forked (multiprocessing's ``fork`` start method, or a library's ``fork()``) while
another thread of the parent held one of filepulsar's process-wide locks gets a lock of its
own: the parent's copy stays held in the child for ever, and the child hung on its first use."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.procs, pytest.mark.alone]  # (forks: no pytest-xdist threads beside)


def _entry_cache() -> tuple[threading.Lock, Callable[[], object]]:
    from filepulsar.storage import entry_cache

    return entry_cache.CACHE._lock, entry_cache.CACHE.clear


def _shared_decodes() -> tuple[threading.Lock, Callable[[], object]]:
    from filepulsar.storage.versioned.journaled import SHARED_DECODES

    def use() -> None:
        SHARED_DECODES.put(("root", "folder"), 1, b"x", object())

    return SHARED_DECODES._lock, use


def _catalog() -> tuple[threading.Lock, Callable[[], object]]:
    from filepulsar.storage import catalog

    return catalog._cache_lock, lambda: catalog._cached(("root", "topic/segment"))


def _shared_ledgers(root: str) -> tuple[threading.Lock, Callable[[], object]]:
    from filepulsar.storage import subscription
    from filepulsar.storage.blobstore import open_blob_store
    from filepulsar.storage.names import TopicName

    def use() -> object:
        return subscription.shared_ledger(open_blob_store(root), TopicName.parse("t"), None)

    return subscription._LEDGERS_LOCK, use


def _ipc_template() -> tuple[threading.Lock, Callable[[], object]]:
    from filepulsar.storage import ipc_value

    return ipc_value._lock, ipc_value._get


def _memory_store() -> tuple[threading.Lock, Callable[[], object]]:
    from filepulsar.storage.blobstore import fsspec, open_blob_store

    return fsspec._MEMORY_LOCK, lambda: open_blob_store("memory://fork-locks").put("k", b"x")


@pytest.mark.parametrize(
    "which",
    [
        "entry cache",
        "shared decodes",
        "catalog",
        "shared ledgers",
        "ipc template",
        "memory store",
    ],
)
def test_a_child_forked_while_a_thread_holds_a_process_lock_does_not_hang(
    which: str, tmp_path: Path
) -> None:
    """Each lock held by this thread at the fork (the child's copy is held, by nobody): the
    child runs the code that takes it, and ends."""
    lock, use = {
        "entry cache": _entry_cache,
        "shared decodes": _shared_decodes,
        "catalog": _catalog,
        "shared ledgers": lambda: _shared_ledgers(str(tmp_path / "root")),
        "ipc template": _ipc_template,
        "memory store": _memory_store,
    }[which]()
    child = multiprocessing.get_context("fork").Process(target=use)
    with lock:
        child.start()
    child.join(10)
    hung = child.is_alive()
    if hung:
        child.kill()
    assert not hung and child.exitcode == 0
