"""TableView (pulsar-client's ``Client.create_table_view``): the latest value of every key.

A table view reads its topic (every partition) from the start through the compacted view
(``filepulsar.storage.compaction``: only the latest message per key up to the last compaction, then
everything after it), keeps the newest value of each key in memory, and goes on following the
topic in a background thread. A message with an empty or null value removes its key; messages
without a key are ignored (as Pulsar's TableView). ``create_table_view`` returns once
everything stored at that moment is loaded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import FilePulsarError
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.reader import Reader as StorageReader

log = logging.getLogger(__name__)

#: Pause of the follower thread after a failed read (doubling up to the maximum).
_RETRY_MIN_S = 0.1
_RETRY_MAX_S = 5.0
#: How long one read of the follower waits for new messages before looking at ``close``.
_POLL_MS = 100


class TableView:
    """The latest value of every key of a topic (see the module docstring).

    ``get``, ``len()``, ``for_each`` and ``for_each_and_listen`` are pulsar-client's. Listener
    callbacks run on the view's follower thread, in message order, with ``(key, value)``; a
    removal is passed with the empty value.
    """

    def __init__(
        self,
        store: BlobStore,
        topic: str,
        subscription_name: str | None,
        schema: Any,
        *,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._topic = topic
        self._subscription = subscription_name
        self._schema = schema
        self._reader = StorageReader(
            store, topic, MessageId.earliest, clock=clock, auto_create=True, read_compacted=True
        )
        self._data: dict[str, bytes] = {}
        self._listeners: list[Callable[[str, Any], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        while self._reader.has_message_available():
            self._apply(self._reader.read_batch(1000, timeout_ms=0))
        self._thread = threading.Thread(
            target=self._follow, name=f"filepulsar-tableview-{topic}", daemon=True
        )
        self._thread.start()

    def _decode(self, raw: bytes) -> Any:
        return raw if self._schema is None else self._schema.decode(raw)

    def _apply(self, table: Any) -> None:
        if not table.num_rows:
            return
        keys = table.column("key").to_pylist()
        values = table.column("value").to_pylist()
        events = []
        with self._lock:
            for k, v in zip(keys, values):
                if k is None:
                    continue
                raw = v or b""
                if raw:
                    self._data[k] = raw
                else:
                    self._data.pop(k, None)
                if self._listeners:
                    events.append((k, raw))
            listeners = list(self._listeners)
        for k, raw in events:
            for fn in listeners:
                try:
                    fn(k, self._decode(raw) if raw else raw)
                except Exception:  # a listener's failure must not stop the view
                    log.exception("table view listener on %s raised", self._topic)

    def _follow(self) -> None:
        pause = _RETRY_MIN_S
        while not self._stop.is_set():
            try:
                table = self._reader.read_batch(1000, timeout_ms=_POLL_MS)
            except FilePulsarError:
                if self._stop.is_set():
                    return
                log.exception(
                    "table view of %s: read failed; retrying in %.1f s", self._topic, pause
                )
                self._stop.wait(pause)
                pause = min(pause * 2, _RETRY_MAX_S)
                continue
            pause = _RETRY_MIN_S
            if self._stop.is_set():
                return
            self._apply(table)

    def get(self, key: str) -> Any | None:
        """The latest value of ``key`` (decoded with the view's schema), or None."""
        with self._lock:
            raw = self._data.get(key)
        return None if raw is None else self._decode(raw)

    def for_each(self, callback: Callable[[str, Any], None]) -> None:
        """Call ``callback(key, value)`` for every key in the view now."""
        with self._lock:
            items = list(self._data.items())
        for k, raw in items:
            callback(k, self._decode(raw))

    def for_each_and_listen(self, callback: Callable[[str, Any], None]) -> None:
        """:meth:`for_each`, then call ``callback`` for every later update (an empty value
        for a removal), on the view's follower thread."""
        with self._lock:
            items = list(self._data.items())
            self._listeners.append(callback)
        for k, raw in items:
            callback(k, self._decode(raw))

    def close(self) -> None:
        """Stop following the topic."""
        self._closed = True
        self._stop.set()
        self._thread.join(timeout=(_POLL_MS / 1000) * 50)
        self._reader.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def __str__(self) -> str:
        if self._subscription is None:
            return f"TableView(topic={self._topic})"
        return f"TableView(topic={self._topic}, subscription={self._subscription})"

    __repr__ = __str__
