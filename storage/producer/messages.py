"""The producer's message vocabulary: :class:`MessageRecord` (one message as the facade hands
it to the send queue, whole), pulsar-client's ``Result`` codes, ``OutgoingMessage`` (what a
custom ``message_router`` is shown), the producer-name limits, ``send`` argument checks and the
Arrow column builders used when a batch is sealed.
"""

from __future__ import annotations

import datetime
import enum
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from filepulsar.storage.entry import numpy_to_arrow
from filepulsar.storage.errors import (
    InvalidConfiguration,
)


class Result(enum.Enum):
    """Pulsar's result codes, with pulsar-client's names and values (its ``Result``).

    ``send_async`` callbacks get ``Ok``, ``UnknownError``, ``ProducerFenced``,
    ``AlreadyClosed`` or ``MessageTooBig``; :class:`filepulsar.asyncio.PulsarException`'s
    ``error()`` may be any of them.
    """

    Ok = 0
    UnknownError = 1
    InvalidConfiguration = 2
    Timeout = 3
    LookupError = 4
    ConnectError = 5
    ReadError = 6
    AuthenticationError = 7
    AuthorizationError = 8
    ErrorGettingAuthenticationData = 9
    BrokerMetadataError = 10
    BrokerPersistenceError = 11
    ChecksumError = 12
    ConsumerBusy = 13
    NotConnected = 14
    AlreadyClosed = 15
    InvalidMessage = 16
    ConsumerNotInitialized = 17
    ProducerNotInitialized = 18
    ProducerBusy = 19
    TooManyLookupRequestException = 20
    InvalidTopicName = 21
    InvalidUrl = 22
    ServiceUnitNotReady = 23
    OperationNotSupported = 24
    ProducerBlockedQuotaExceededError = 25
    ProducerBlockedQuotaExceededException = 26
    ProducerQueueIsFull = 27
    MessageTooBig = 28
    TopicNotFound = 29
    SubscriptionNotFound = 30
    ConsumerNotFound = 31
    UnsupportedVersionError = 32
    TopicTerminated = 33
    CryptoError = 34
    IncompatibleSchema = 35
    ConsumerAssignError = 36
    CumulativeAcknowledgementNotAllowedError = 37
    TransactionCoordinatorNotFoundError = 38
    InvalidTxnStatusError = 39
    NotAllowedError = 40
    TransactionConflict = 41
    TransactionNotFound = 42
    ProducerFenced = 43
    MemoryBufferIsFull = 44
    Interrupted = 45


_MAX_BINARY_BYTES = 2**31 - 1


#: Longest producer name: the entry header stores it with a 16-bit length.
MAX_PRODUCER_NAME_BYTES = 0xFFFF
#: Longest sequence id suffix of a chunked message's uuid (``<producer name>-<sequence id>``).
CHUNK_UUID_SUFFIX = 21


_BINARY = pa.binary()
_STRING = pa.string()
_OFFSETS_1 = struct.Struct("<ii")


def binary_array(values: Sequence[Any], typ: pa.DataType | None = None) -> pa.Array:
    """``values`` (bytes, or str for ``pa.string()``; None is null) as an Arrow binary or
    string array, built from its buffers.

    ``pa.array`` on a Python list first imports pandas (pyarrow looks for pandas-like input),
    which made a process's first send take 0.25-1.2 s; building the offsets, data and
    validity buffers directly never does.
    """
    if len(values) == 1:
        # One value (every unbatched send, most keyed batches of a live producer): the same
        # array, without the NumPy steps (which cost 50x as much for one value).
        v = values[0]
        if typ is None or typ == _BINARY:
            data, typ1 = (v if type(v) is bytes else None), _BINARY
        elif typ == _STRING:
            data, typ1 = (v.encode() if type(v) is str else None), _STRING
        else:
            data, typ1 = None, _BINARY
        if data is not None and len(data) <= _MAX_BINARY_BYTES:
            offsets = pa.py_buffer(_OFFSETS_1.pack(0, len(data)))
            return pa.Array.from_buffers(typ1, 1, [None, offsets, pa.py_buffer(data)])
    typ = pa.binary() if typ is None else typ
    n = len(values)
    mask = np.fromiter((v is None for v in values), np.bool_, n)
    has_nulls = bool(mask.any())
    if typ == pa.string():
        values = [b"" if v is None else v.encode() for v in values]
    elif has_nulls:
        values = [b"" if v is None else v for v in values]
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > _MAX_BINARY_BYTES:
        return pa.array(values, typ)  # needs more than 32-bit offsets: let pyarrow chunk
    validity = pa.py_buffer(np.packbits(~mask, bitorder="little")) if has_nulls else None
    return pa.Array.from_buffers(
        typ,
        n,
        [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(values))],
        null_count=int(mask.sum()),
    )


def int64_array(values: Sequence[int | None]) -> pa.Array:
    """Python ints (None: null) as an Arrow int64 array, from its buffers (see
    :func:`binary_array`)."""
    mask = np.fromiter((v is None for v in values), np.bool_, len(values))
    data = np.fromiter((0 if v is None else v for v in values), np.int64, len(values))
    return numpy_to_arrow(data, mask if mask.any() else None)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_send_args(
    properties: Any,
    partition_key: Any,
    sequence_id: Any,
    replication_clusters: Any,
    disable_replication: Any,
    event_timestamp: Any,
    deliver_at: Any,
    deliver_after: Any,
) -> None:
    """Refuse wrongly typed ``send`` arguments at once with ``InvalidConfiguration`` (a
    ``ValueError``, as pulsar-client raises), before anything is queued."""
    problem = None
    if properties is not None and (
        not isinstance(properties, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in properties.items())
    ):
        problem = f"properties must be a dict of str to str, got {properties!r}"
    elif partition_key is not None and not isinstance(partition_key, str):
        problem = f"partition_key must be a str, got {partition_key!r}"
    elif sequence_id is not None and (not _is_int(sequence_id) or sequence_id < 0):
        problem = f"sequence_id must be an int >= 0, got {sequence_id!r}"
    elif replication_clusters is not None and not isinstance(replication_clusters, list):
        problem = f"replication_clusters must be a list of str, got {replication_clusters!r}"
    elif not isinstance(disable_replication, bool):
        problem = f"disable_replication must be a bool, got {disable_replication!r}"
    elif event_timestamp is not None and not _is_int(event_timestamp):
        problem = f"event_timestamp must be an int (epoch ms), got {event_timestamp!r}"
    elif deliver_at is not None and not _is_int(deliver_at):
        problem = f"deliver_at must be an int (epoch ms), got {deliver_at!r}"
    elif deliver_after is not None and not (
        isinstance(deliver_after, datetime.timedelta) or _is_int(deliver_after)
    ):
        problem = f"deliver_after must be a timedelta (or int ms), got {deliver_after!r}"
    if problem is not None:
        raise InvalidConfiguration(problem)


def metadata_size(
    properties: dict[str, str] | None,
    partition_key: str | None,
    ordering_key: bytes | None,
) -> int:
    """Bytes a message's metadata adds to its size, as counted against the max message size.

    Pulsar counts the whole serialized message, metadata included, so properties and keys
    count: a message of 1 byte with 20 MiB of properties is too big, as in Pulsar.
    """
    n = 0
    if properties:
        for k, v in properties.items():
            n += len(k.encode()) + len(v.encode())
    if partition_key is not None:
        n += len(partition_key.encode())
    if ordering_key is not None:
        n += len(ordering_key)
    return n


class MessageRecord(NamedTuple):
    """One message on its way to the send queue, checked and normalised by the facade:
    ``ordering_key`` as bytes, ``deliver_after`` already turned into ``deliver_at`` (epoch
    ms, 0: none), ``sequence_id`` None when the producer numbers it. Immutable; built by
    keyword. (A tuple: a frozen dataclass took 5x as long to build, once per message.)"""

    content: bytes | None
    properties: dict[str, str] | None = None
    partition_key: str | None = None
    ordering_key: bytes | None = None
    #: Epoch ms (a ``datetime`` from a bulk table's timestamp column when a router is shown it).
    event_timestamp: int | datetime.datetime | None = None
    sequence_id: int | None = None
    deliver_at: int = 0

    @property
    def plain(self) -> bool:
        """True when the entry stores only the value (no properties, keys or event time)."""
        return (
            self.properties is None
            and self.partition_key is None
            and self.ordering_key is None
            and self.event_timestamp is None
        )


class OutgoingMessage:
    """What a custom ``message_router`` is given: the message about to be sent, with the
    accessors of a received message (``data()``, ``value()``, ``properties()``,
    ``partition_key()``, ``has_key()``, ``ordering_key()``, ``event_timestamp()``)."""

    __slots__ = ("_record",)

    def __init__(self, record: MessageRecord) -> None:
        self._record = record

    def data(self) -> bytes:
        c = self._record.content
        return b"" if c is None else c

    def value(self) -> bytes:
        return self.data()

    def properties(self) -> dict[str, str]:
        return dict(self._record.properties or {})

    def partition_key(self) -> str:
        return self._record.partition_key or ""

    def has_key(self) -> bool:
        return self._record.partition_key is not None

    def ordering_key(self) -> str:
        ok = self._record.ordering_key
        return ok.decode(errors="replace") if isinstance(ok, bytes) else (ok or "")

    def event_timestamp(self) -> int:
        e = self._record.event_timestamp
        if isinstance(e, datetime.datetime):
            return int(e.timestamp() * 1000)
        return int(e or 0)
