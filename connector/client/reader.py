"""The client's readers: :meth:`Client.create_reader` and :meth:`Client.create_table_view` (a
base class of :class:`~filepulsar.connector.client.Client`) and the :class:`Reader` returned,
which reads a topic from a position with no subscription.
"""

from __future__ import annotations

import datetime
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from filepulsar.connector.client.base import ClientPart, check_unsupported
from filepulsar.connector.client.message import Message, View
from filepulsar.connector.client.schema import bind_for_reading, check_schema_arg
from filepulsar.connector.client.schema.codecs import Schema
from filepulsar.connector.client.tableview import TableView
from filepulsar.connector.client.types import (
    AlreadyClosed,
    ConsumerCryptoFailureAction,
    Interrupted,
    InvalidConfiguration,
    Timeout,
    check_type,
    check_type_or_none,
)
from filepulsar.dispatch.clock import waits_of, wall_ms
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.entry import preload_pandas
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import effective_policies
from filepulsar.storage.reader import Reader as StorageReader
from filepulsar.storage.topics import ensure_topic


class Reader:
    """A reader (pulsar-client's ``Reader``): reads a topic from a position, no subscription.

    Nothing is acknowledged and no cursor is stored; it holds back no retention: messages
    retention deletes before the reader reaches them are skipped, each skip logged once as a
    warning and counted (:meth:`skipped_by_retention`).
    """

    def __init__(
        self,
        store: BlobStore,
        topic: str,
        start_message_id: MessageId,
        *,
        receiver_queue_size: int,
        start_message_id_inclusive: bool,
        clock: Callable[[], int] | None,
        schema: Schema | None = None,
        read_compacted: bool = False,
    ) -> None:
        preload_pandas()  # off the first message's path
        self._topic = TopicName.parse(topic)
        self._reader = StorageReader(
            store,
            self._topic,
            start_message_id,
            start_message_id_inclusive=start_message_id_inclusive,
            clock=clock,
            auto_create=True,
            read_compacted=read_compacted,
        )
        self._n = ensure_topic(store, self._topic, auto_create=False)
        self._schema = schema
        try:
            bind_for_reading(
                store,
                self._topic,
                schema,
                effective_policies(store, self._topic),
                role="reader",
                clock=clock or wall_ms,
            )
        except BaseException:
            self._reader.close()
            raise
        # Deadlines on the clock when it is a whole Clock (a ManualClock in tests).
        self._waits = waits_of(clock)
        self._entries = max(1, receiver_queue_size // 100)
        self._buf: deque[Message] = deque()
        self._lock = threading.Lock()
        self._closed = False

    def topic(self) -> str:
        return str(self._topic)

    def _load(self, timeout_ms: int) -> None:
        table = self._reader.read_batch(self._entries, timeout_ms=timeout_ms)
        if not table.num_rows:
            return
        p = table.column("partition")[0].as_py()
        topic = str(self._topic.partition(p)) if self._n else str(self._topic)
        view: View[Any] = View(table, topic)
        view.schema = self._schema
        self._buf.extend(Message(view, r) for r in range(table.num_rows))

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message, waiting up to ``timeout_millis`` (None: forever).

        Raises
        ------
        Timeout
            If nothing arrived in time.
        AlreadyClosed
            If the reader is closed.
        Interrupted
            If Ctrl-C (SIGINT) interrupted the wait.
        """
        check_type_or_none(int, timeout_millis, "timeout_millis")
        try:
            return self._read_next(timeout_millis)
        except KeyboardInterrupt as e:
            raise Interrupted(f"read_next on {self._topic} was interrupted") from e

    def _read_next(self, timeout_millis: int | None) -> Message:
        deadline = (
            None if timeout_millis is None else self._waits.monotonic() + timeout_millis / 1000
        )
        self._reader.restart_wait()
        while True:
            # One non-blocking look at a time, the lock released while waiting, so close()
            # (and Client.close()) never wait for a message to arrive.
            with self._lock:
                if self._closed:
                    raise AlreadyClosed(f"reader of {self._topic} is closed")
                if not self._buf:
                    self._load(0)
                if self._buf:
                    return self._buf.popleft()
            if deadline is not None:
                left = deadline - self._waits.monotonic()
                if left <= 0:
                    raise Timeout(f"no message on {self._topic} within {timeout_millis} ms")
                self._reader.wait(left)
            else:
                self._reader.wait()

    def _read_buffered(self) -> Message | None:
        """A message already read ahead, taken without waiting or storage I/O: None if there
        is none or the reader's lock is busy. For the asyncio client's event loop thread."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._buf.popleft() if self._buf and not self._closed else None
        finally:
            self._lock.release()

    def has_message_available(self) -> bool:
        with self._lock:
            return bool(self._buf) or self._reader.has_message_available()

    def seek(self, target: MessageId | int | datetime.datetime) -> None:
        """Move to a message id or to the first message published at or after a time (epoch
        ms or datetime). The message at the id is read again only if the reader was created
        with ``start_message_id_inclusive=True`` (as in pulsar-client).

        Raises
        ------
        InvalidConfiguration
            (a ``ValueError``) If ``target`` is of another type.
        """
        if isinstance(target, datetime.datetime):
            target = int(target.timestamp() * 1000)
        if not isinstance(target, MessageId | int) or isinstance(target, bool):
            raise InvalidConfiguration(
                f"seek needs a MessageId, epoch milliseconds (int) or a datetime, "
                f"got {type(target).__name__}"
            )
        with self._lock:
            self._buf.clear()
            self._reader.seek(target)

    def skipped_by_retention(self) -> int:
        """How many messages retention deleted after this reader's position before it read
        them (filepulsar's own; pulsar-client has no such counter, its readers move on
        silently). Each skip is also logged as a warning, once, naming the range of entries;
        the reader goes on at the first message that remains. See docs/integrity.md."""
        with self._lock:
            return self._reader.skipped_by_retention

    def is_connected(self) -> bool:
        return not self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._buf.clear()
            self._reader.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReaderFactory(ClientPart):
    """``Client.create_reader`` and ``Client.create_table_view``."""

    def create_reader(
        self,
        topic: str,
        start_message_id: MessageId,
        schema: Any = None,
        reader_listener: Any = None,
        receiver_queue_size: int = 1000,
        reader_name: str | None = None,
        subscription_role_prefix: str | None = None,
        is_read_compacted: bool = False,
        crypto_key_reader: Any = None,
        start_message_id_inclusive: bool = False,
        crypto_failure_action: Any = ConsumerCryptoFailureAction.FAIL,
    ) -> Reader:
        """Create a reader of ``topic`` starting at ``start_message_id``
        (``MessageId.earliest``, ``MessageId.latest`` or an id; exclusive unless
        ``start_message_id_inclusive``). A missing topic is auto-created per the namespace
        policies, as Pulsar does.

        Raises
        ------
        TopicNotFound
            If the topic does not exist and auto-creation is off.
        InvalidConfiguration
            (a ``ValueError``) For a wrongly typed argument or unsupported options
            (listener, encryption, compaction), or a schema that is not a
            :mod:`filepulsar.schema` schema.
        IncompatibleSchema
            If ``schema`` cannot read the topic's schema.
        """
        check_type(str, topic, "topic")
        check_type(int, receiver_queue_size, "receiver_queue_size")
        check_type_or_none(str, reader_name, "reader_name")
        check_type_or_none(str, subscription_role_prefix, "subscription_role_prefix")
        check_type(bool, is_read_compacted, "is_read_compacted")
        check_type(bool, start_message_id_inclusive, "start_message_id_inclusive")
        value_schema = check_schema_arg(schema, producer=False)
        check_unsupported(
            reader_listener=reader_listener,
            crypto_key_reader=crypto_key_reader,
            crypto_failure_action=crypto_failure_action,
        )
        if not isinstance(start_message_id, MessageId):
            raise InvalidConfiguration(
                f"start_message_id must be a MessageId (MessageId.earliest, MessageId.latest "
                f"or a received id), got {start_message_id!r}"
            )
        r = Reader(
            self._core.store,
            topic,
            start_message_id,
            receiver_queue_size=receiver_queue_size,
            start_message_id_inclusive=start_message_id_inclusive,
            clock=self._core.clock,
            schema=value_schema,
            read_compacted=is_read_compacted,
        )
        self._core.track(r)
        return r

    def create_table_view(
        self,
        topic: str,
        subscription_name: str | None = None,
        schema: Any = None,
    ) -> TableView:
        """A table view of ``topic``: the latest value of every key, kept up to date (see
        :class:`~filepulsar.connector.client.tableview.TableView`). Returns once everything
        stored now is loaded. ``subscription_name`` is accepted as pulsar-client's and unused:
        the view reads without a subscription and holds back no retention.

        Raises
        ------
        InvalidConfiguration
            (a ``ValueError``) For a wrongly typed argument.
        """
        check_type(str, topic, "topic")
        check_type_or_none(str, subscription_name, "subscription_name")
        tv = TableView(self._core.store, topic, subscription_name, schema, clock=self._core.clock)
        self._core.track(tv)
        return tv
