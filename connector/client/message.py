"""Messages handed to applications: cheap objects over the Arrow columns of a fetch.

A fetch of entries becomes one Arrow table (``filepulsar.storage.reader.READ_SCHEMA``); a
:class:`Message` is just (view, row). Its fields are read from the table's columns on first
use, one column at a time for the whole fetch, so receiving costs one small object per message
and nothing per field the application never looks at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from filepulsar.storage.errors import IncompatibleSchema
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.reader import MessageRows
from filepulsar.storage.schemas import version_bytes

if TYPE_CHECKING:
    from filepulsar.connector.client.schema.codecs import Schema

__all__ = ["Delivered", "Message", "View", "tag_filter_matches"]

#: Property value that marks a property key as a tag (the vendor guide's tag filtering).
TAG_VALUE = "TAGS"


def tag_filter_matches(properties: Mapping[str, str] | None, tags: frozenset[str]) -> bool:
    """Whether a message passes a subscription's tag filter.

    A message's tags are its property keys whose value is ``"TAGS"``. With no subscription
    tags every message passes; a message without tags always passes; otherwise it passes if
    one of its tags is subscribed (the tags of a subscription are OR-ed).
    """
    if not tags or not properties:
        return True
    found = False
    for k, v in properties.items():
        if v == TAG_VALUE:
            if k in tags:
                return True
            found = True
    return not found


class _TableRows:
    """A READ_SCHEMA table behind :class:`~filepulsar.storage.reader.MessageRows`' interface."""

    __slots__ = ("num_rows", "table")

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.num_rows = table.num_rows

    def column(self, name: str) -> list[Any]:
        col = self.table.column(name)
        if not col.null_count and pa.types.is_integer(col.type):
            return col.to_numpy().tolist()  # the same ints, without a scalar per row
        return col.to_pylist()

    def sizes(self) -> np.ndarray:
        lengths = pc.binary_length(self.table.column("value")).fill_null(0)
        return np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)


class Delivered(Protocol):
    """What a message needs of the consumer's record of its entry
    (:class:`~filepulsar.connector.client.consumer.records.Entry`): how often it was
    delivered before. Declared here so this module imports nothing of the consumer's."""

    redelivery_count: int


#: The consumer's record of an entry (a reader's views have none).
E = TypeVar("E", bound=Delivered)


class View(Generic[E]):
    """The messages of one fetch from one managed ledger: rows of a READ_SCHEMA table, or
    :class:`~filepulsar.storage.reader.MessageRows` (a fetch of a few messages, which needs no
    table).

    ``row_entry[r]`` is the consumer's tracking record of row ``r``'s entry (None for
    readers). Columns are converted to Python lists lazily and cached.
    """

    __slots__ = (
        "_cols",
        "_sizes",
        "entries",
        "entry_index",
        "row_entry",
        "rows",
        "schema",
        "topic",
    )

    def __init__(
        self,
        rows: pa.Table | MessageRows,
        topic: str,
        entries: Sequence[E] | None = None,
        row_entry: Sequence[E] | None = None,
        entry_index: Sequence[int] | None = None,
    ) -> None:
        self.rows = rows if isinstance(rows, MessageRows) else _TableRows(rows)
        self.topic = topic
        self.entries = entries
        self.row_entry = row_entry
        self.entry_index = entry_index
        self._cols: dict[str, list[Any]] = {}
        self._sizes: np.ndarray | None = None
        #: The consumer's or reader's value schema (None: values are bytes).
        self.schema: Schema | None = None

    def column(self, name: str) -> list[Any]:
        col = self._cols.get(name)
        if col is None:
            col = self._cols[name] = self.rows.column(name)
        return col

    def batch_indexes(self) -> list[int]:
        return self.column("batch_index")

    def sizes(self) -> np.ndarray:
        """Payload bytes per row (0 for a null value)."""
        if self._sizes is None:
            self._sizes = self.rows.sizes()
        return self._sizes


class Message:
    """A received message (pulsar-client's ``Message``: accessors are methods).

    ``message_id()`` returns a :class:`~filepulsar.storage.messageid.MessageId` that remembers its
    topic, so a multi-topic consumer can acknowledge by id.
    """

    __slots__ = ("_r", "_v")

    def __init__(self, view: View[Any], row: int) -> None:
        self._v = view
        self._r = row

    def data(self) -> bytes:
        """The payload bytes (``b""`` for a null value)."""
        v = self._v.column("value")[self._r]
        return b"" if v is None else v

    def value(self) -> Any:
        """The payload decoded with the consumer's schema (without one: the bytes of
        :meth:`data`; with one, None for a null value). Avro values are read through the
        schema version they were written with, resolved to the consumer's schema.

        Raises
        ------
        IncompatibleSchema
            If the value does not decode with the schema (for example JSON that is not an
            object, bytes written without the schema, or a version missing from the topic's
            registry), naming the message and its topic.
        """
        view = self._v
        schema = view.schema
        if schema is None:
            return self.data()
        data = view.column("value")[self._r]
        if data is None:
            return None  # a null value (a tombstone) has no value to decode
        v = view.column("schema_version")[self._r]
        version = -1 if v is None else v
        try:
            return schema.decode_message(data, view.topic, version)
        except IncompatibleSchema as e:
            written = f"schema version {version}" if version >= 0 else "no schema"
            raise IncompatibleSchema(
                f"message {self.message_id()} of {self.topic_name()} (written with {written}) "
                f"does not decode with {schema}: {e}"
            ) from e

    def properties(self) -> dict[str, str]:
        p = self._v.column("properties")[self._r]
        return dict(p) if p else {}

    def partition_key(self) -> str:
        """The message key (``""`` if none, as pulsar-client returns)."""
        return self._v.column("key")[self._r] or ""

    def has_key(self) -> bool:
        return self._v.column("key")[self._r] is not None

    def ordering_key(self) -> str:
        """The ordering key (``""`` if none), a ``str`` as in pulsar-client (bytes that are not
        UTF-8 are decoded with replacement characters)."""
        ok = self._v.column("ordering_key")[self._r]
        return ok.decode("utf-8", errors="replace") if ok else ""

    def has_null_value(self) -> bool:
        """Whether the message has a null value (a tombstone)."""
        return self._v.column("value")[self._r] is None

    def encryption_context(self) -> None:
        """None: messages are never encrypted here (pulsar-client returns None for
        unencrypted messages)."""
        return None

    def publish_timestamp(self) -> int:
        """Publish time in epoch milliseconds."""
        return int(self._v.column("publish_time")[self._r])

    def event_timestamp(self) -> int:
        """Event time in epoch milliseconds (0 if unset, as in Pulsar)."""
        return self._v.column("event_time")[self._r] or 0

    def sequence_id(self) -> int:
        return int(self._v.column("sequence_id")[self._r])

    def producer_name(self) -> str:
        return str(self._v.column("producer_name")[self._r])

    def deliver_at(self) -> int:
        """Requested delivery time in epoch ms (0 if the message was not delayed)."""
        return self._v.column("deliver_at")[self._r] or 0

    def schema_version(self) -> str:
        """The schema version the message was written with, as pulsar-client returns it: the
        8 big-endian bytes of the version as a ``str`` (``""`` if written without a schema)."""
        v = self._v.column("schema_version")[self._r]
        return "" if v is None else version_bytes(v).decode("latin-1")

    def int_schema_version(self) -> int:
        """The schema version as an int (-1 if written without a schema)."""
        v = self._v.column("schema_version")[self._r]
        return -1 if v is None else int(v)

    def topic_name(self) -> str:
        """Full name of the topic (the partition's, for a partitioned topic)."""
        return self._v.topic

    def redelivery_count(self) -> int:
        """How many times this message was delivered before (0 on its first delivery)."""
        re = self._v.row_entry
        return 0 if re is None else re[self._r].redelivery_count

    def message_id(self) -> MessageId:
        v, r = self._v, self._r
        mid = MessageId(
            v.column("partition")[r],
            v.column("ledger_id")[r],
            v.column("entry_id")[r],
            v.batch_indexes()[r],
        )
        object.__setattr__(mid, "_fp_topic", v.topic)
        return mid

    def __repr__(self) -> str:
        return f"Message(id={self.message_id()}, topic={self._v.topic!r}, {len(self.data())} B)"


def message_id_topic(mid: MessageId) -> str | None:
    """The topic a message id came from, if it was obtained from a received message."""
    t = getattr(mid, "_fp_topic", None)
    return t if isinstance(t, str) else None
