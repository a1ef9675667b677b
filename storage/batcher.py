"""The one write path's entry cutter: Arrow rows → entry specs → encoded entries.

Both bulk writers, :meth:`filepulsar.storage.producer.Producer.send_table` and the Spark sink's task
writer (``filepulsar.connector.sink.task``), turn rows into entries here, under one frozen
:class:`BatchPolicy` (Pulsar's producer settings that shape entries):

1. :func:`filepulsar.storage.bulk_columns.normalize` checks and converts the input columns to the
   stored types;
2. :func:`too_big` is the one size rule: a message is too big when its value *after
   compression* plus its key, ordering key and properties (names and values) exceeds the max
   message size, as Pulsar counts the serialized message, not the raw value;
3. :func:`cut` cuts the rows of one partition (and producer) into :class:`EntrySpec` s:
   delayed rows (``deliver_at`` > 0) are never batched, every row is its own entry when
   batching is off, oversized rows become chunk entries when chunking is on (else
   :class:`MessageTooBig` names the row), and the other rows are batched up to the count and
   byte limits (:func:`split_points`), one batch per key with ``KeyBased`` batching (the
   ordering key if set, else the key);
4. :func:`encode` compresses and frames the specs into :class:`PendingEntry` groups.

The single-message path (``Producer.send_async``) batches in its send queue but takes the
size rule and the chunk cut from here: :func:`check_size` on the message's one-row batch and
:func:`chunks` for its chunk entries, so ``send()`` stores what ``send_table`` stores
(``tests/test_write_path_parity.py``).

Routing (which partition a row goes to) is ``filepulsar.dispatch.routing``'s; where the bytes go (a
ledger's blob or a staged blob) and how entries become visible is the caller's.

Everything here is vectorised; the only Python loops run per entry, never per batched
message (delayed, oversized and non-batched rows are an entry each, so they cost one).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from filepulsar.dispatch.dedup import NO_SEQUENCE_ID
from filepulsar.dispatch.modes import BatchingType
from filepulsar.storage.bulk_columns import stored_columns
from filepulsar.storage.codec import Codec, compress
from filepulsar.storage.commit import PendingEntry
from filepulsar.storage.entry import ChunkInfo
from filepulsar.storage.entry_encode import encode_entry_parts
from filepulsar.storage.errors import InvalidConfiguration, MessageTooBig

#: Entries encoded per group handed to the writer (bounds the bytes held in memory).
ENCODE_GROUP = 32

_PROPS_AS_LIST = pa.list_(
    pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())])
)


@dataclass(frozen=True)
class BatchPolicy:
    """How rows become entries: Pulsar's producer settings that shape them.

    Parameters
    ----------
    max_message_size
        The largest message (see :func:`too_big`); the topic's policy or a lower setting.
    codec
        Compression of every entry's payload.
    batching
        Batch messages into entries; off: one entry per message.
    max_messages, max_bytes
        A batch ends once it holds ``max_messages`` messages or at least ``max_bytes`` of
        values (the message that crosses the byte limit is the batch's last).
    batching_type
        ``BatchingType.Default`` or ``BatchingType.KeyBased`` (one batch per ordering key,
        else key), or either spelling of one.
    chunking
        Split a message above the max message size into chunk entries instead of failing.

    Raises
    ------
    InvalidConfiguration
        For a limit that is not a positive integer or an unknown batching type.
    """

    max_message_size: int
    codec: Codec = Codec.NONE
    batching: bool = True
    max_messages: int = 1000
    max_bytes: int = 128 * 1024
    #: Either spelling or a member in; the member after init.
    batching_type: BatchingType | str = BatchingType.Default
    chunking: bool = False

    def __post_init__(self) -> None:
        for name in ("max_message_size", "max_messages", "max_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise InvalidConfiguration(f"{name} must be a positive integer, got {v!r}")
        # Either spelling or a member; kept as the member (frozen: set through object).
        object.__setattr__(
            self, "batching_type", BatchingType.parse(self.batching_type, "batching type")
        )

    @property
    def key_based(self) -> bool:
        """Whether batches are cut per key (``KeyBased`` batching, batching on)."""
        return self.batching and self.batching_type is BatchingType.KeyBased


@dataclass(slots=True)
class EntrySpec:
    """One entry to encode: its stored rows and header fields.

    ``rows`` are the positions of its messages in the table given to :func:`cut` (empty for
    a chunk other than the last: a chunked message is identified by its last chunk).
    ``first_sequence_id`` is set when ``batch`` has no ``sequence_id`` column (message ``i``
    then has ``first + i``); ``header_sequence_id`` overrides both header ids (key-based
    batches: their highest; chunks: the message's id on the last chunk, else -1).
    ``sequence_id``/``highest_sequence_id`` are the header's, as the commit sees them.
    """

    batch: pa.RecordBatch
    rows: range | np.ndarray
    batched: bool
    sequence_id: int
    highest_sequence_id: int
    first_sequence_id: int | None = None
    header_sequence_id: int | None = None
    deliver_at: int = 0
    chunk: ChunkInfo | None = None


def value_offsets(values: pa.Array) -> np.ndarray:
    """The offsets of a binary array as int64 numpy (zero-copy view of Arrow's buffer)."""
    raw = np.frombuffer(values.buffers()[1], np.int32)
    return raw[values.offset : values.offset + len(values) + 1]


def split_points(offsets: np.ndarray, max_messages: int, max_bytes: int) -> list[int]:
    """Row indexes where entries start, greedily filling up to the count and byte limits.

    ``offsets`` are the value offsets of the rows (n+1 of them; a binary array's offsets
    buffer, which is the running total of value lengths, so nothing is summed here). An entry
    ends once it holds ``max_messages`` messages or at least ``max_bytes`` of values (the
    message that crosses the byte limit is the entry's last, as in Pulsar's batcher).
    """
    n = len(offsets) - 1
    starts = [0]
    pos = 0
    while True:
        by_bytes = int(np.searchsorted(offsets, offsets[pos] + max_bytes, side="left"))
        end = min(pos + max_messages, max(by_bytes, pos + 1), n)
        if end >= n:
            return starts
        starts.append(end)
        pos = end


def meta_bytes(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """Bytes of each row's key, ordering key and properties (names and values), int64.

    Counted as Pulsar counts them in a message's metadata, so a message with a large key or
    many properties is as big as its bytes say.
    """
    n = table.num_rows
    total = np.zeros(n, np.int64)
    names = table.schema.names
    for name in ("key", "ordering_key"):
        if name in names:
            col = table.column(name)
            total += np.asarray(
                pc.fill_null(pc.binary_length(col), 0).to_numpy(zero_copy_only=False), np.int64
            )
    if "properties" in names:
        col = table.column("properties")
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        if col.null_count < n:
            entries = col.cast(_PROPS_AS_LIST)
            flat = pc.list_flatten(entries)
            lengths = np.zeros(len(flat) + 1, np.int64)
            for field in ("key", "value"):
                part = pc.fill_null(pc.binary_length(pc.struct_field(flat, field)), 0)
                lengths[1:] += np.asarray(part.to_numpy(zero_copy_only=False), np.int64)
            cum = np.cumsum(lengths)
            counts = pc.fill_null(pc.list_value_length(entries), 0).to_numpy(zero_copy_only=False)
            ends = np.cumsum(np.asarray(counts, np.int64))
            total += cum[ends] - cum[ends - counts]
    return total


def too_big(table: pa.Table | pa.RecordBatch, policy: BatchPolicy) -> np.ndarray | None:
    """The one size rule: which rows are messages above ``policy.max_message_size``.

    A message's size is its value after compression (``policy.codec``) plus its
    :func:`meta_bytes`, as Pulsar's client checks the compressed payload and its broker the
    whole serialized message. Values are compressed one by one only for the rows whose raw
    size is above the limit (rare), so the common case stays vectorised.

    Returns
    -------
    numpy.ndarray or None
        A boolean mask (None when no row is too big).
    """
    limit = policy.max_message_size
    values = table.column("value")
    lengths = pc.binary_length(values)
    longest = pc.max(lengths).as_py()
    if not _has_meta(table) and (longest is None or longest <= limit):
        return None
    raw = np.asarray(pc.fill_null(lengths, 0).to_numpy(zero_copy_only=False), np.int64)
    meta = meta_bytes(table)
    big = (raw + meta) > limit
    if not big.any():
        return None
    if policy.codec is not Codec.NONE:
        for i in np.flatnonzero(big).tolist():
            value = values[i].as_py()
            if value is not None and len(compress(policy.codec, value)) + int(meta[i]) <= limit:
                big[i] = False
        if not big.any():
            return None
    return big


def message_size(
    value: bytes,
    codec: Codec,
    *,
    key: str | None = None,
    ordering_key: bytes | None = None,
    properties: dict[str, str] | None = None,
) -> int:
    """The size :func:`too_big` compares with the max message size, for one message.

    For reports and tests (it compresses the value); a writer asks :func:`too_big`.
    """
    meta = len(key.encode()) if key is not None else 0
    meta += len(ordering_key) if ordering_key is not None else 0
    for k, v in (properties or {}).items():
        meta += len(k.encode()) + len(v.encode())
    return len(compress(codec, value)) + meta


def _has_meta(table: pa.Table | pa.RecordBatch) -> bool:
    return any(n in table.schema.names for n in ("key", "ordering_key", "properties"))


def check_size(
    table: pa.Table | pa.RecordBatch,
    policy: BatchPolicy,
    *,
    where: str,
    hint: str = "",
    rows: np.ndarray | None = None,
    single: bool = False,
) -> np.ndarray | None:
    """Apply :func:`too_big`; return the rows to chunk, or raise if chunking is off.

    Parameters
    ----------
    where
        What is writing where, for the error (e.g. ``"send_table to persistent://..."``).
    hint
        How to lift the limit or chunk, appended to the error.
    rows
        The input row number of each row of ``table`` (default: its position), for the error.
    single
        ``table`` is one message sent on its own (``send``): the error names no row.

    Raises
    ------
    MessageTooBig
        Naming the first row too big, its size and the limit, when chunking is off.
    """
    big = too_big(table, policy)
    if big is None or policy.chunking:
        return big
    i = int(np.flatnonzero(big)[0])
    value = table.column("value")[i].as_py() or b""
    meta = int(meta_bytes(table.slice(i, 1))[0])
    row = int(rows[i]) if rows is not None else i
    extra = f" plus {meta} bytes of key/ordering key/properties" if meta else ""
    which = "the message" if single else f"the message in row {row}"
    packed = ""
    if policy.codec is not Codec.NONE:
        packed = f" ({len(compress(policy.codec, value))} bytes {policy.codec.name}-compressed)"
    size = len(value)
    raise MessageTooBig(
        f"{where}: {which} has a value of {size} bytes{packed}{extra} and "
        f"exceeds the max message size {policy.max_message_size}{hint}"
    )


def cut(
    table: pa.Table,
    policy: BatchPolicy,
    *,
    big: np.ndarray | None = None,
    seq_base: int | None = None,
    chunk_uuid: Callable[[int], str] | None = None,
) -> list[EntrySpec]:
    """Cut the rows of one partition and producer into entries, in the order to write them.

    Parameters
    ----------
    table
        Normalized rows (:func:`normalize`), in send order; ``deliver_at`` may be present.
    policy
        The batch policy.
    big
        The rows to chunk (from :func:`check_size` on these rows); None: none.
    seq_base
        The sequence id of the first row when ``table`` has no ``sequence_id`` column (row
        ``i`` gets ``seq_base + i``); None when it has one.
    chunk_uuid
        The uuid of a chunked message from its sequence id (default ``str(seq)``).

    Returns
    -------
    list[EntrySpec]
        Singles for delayed rows, for every row when batching is off and chunk entries for
        ``big`` rows, in row order; batches of the rows between them. Key-based batches of
        one run go out in order of their highest sequence id, then of their last row, so a
        key's rows keep their order and deduplication accepts them all.

    Raises
    ------
    MessageTooBig
        If a row to chunk has more key, ordering key and property bytes than the max message
        size (no room is left for its value).
    """
    n = table.num_rows
    if n == 0:
        return []
    special = None if big is None else np.asarray(big, bool).copy()
    deliver = None
    if "deliver_at" in table.column_names:
        d = table.column("deliver_at")
        delayed = pc.fill_null(pc.greater(d, 0), False).to_numpy(zero_copy_only=False)
        if delayed.any():
            deliver = np.asarray(d.fill_null(0).to_numpy(zero_copy_only=False), np.int64)
            special = delayed if special is None else special | delayed
        table = table.drop_columns(["deliver_at"])
    if (
        seq_base is not None
        and policy.key_based
        and ("key" in table.column_names or "ordering_key" in table.column_names)
    ):
        # Key-based batches reorder rows, so their ids are no longer consecutive: store them.
        ids = pa.array(np.arange(seq_base, seq_base + n, dtype=np.int64))
        table = table.append_column("sequence_id", ids)
        seq_base = None
    stored = stored_columns(table)
    seqs = None
    if seq_base is None:
        if stored.schema.names[-1] != "sequence_id":
            raise ValueError("cut needs seq_base when the rows have no sequence_id column")
        seqs = np.asarray(stored.column(stored.num_columns - 1).to_numpy(), np.int64)
    if not policy.batching:
        special = np.ones(n, bool)
    if special is None or not special.any():
        return _batches(stored, seqs, seq_base, 0, n, policy)
    out: list[EntrySpec] = []
    meta = meta_bytes(stored) if big is not None and big.any() else None
    pos = 0
    for i in np.flatnonzero(special).tolist():
        if i > pos:
            out.extend(_batches(stored, seqs, seq_base, pos, i, policy))
        seq = int(seqs[i]) if seqs is not None else int(seq_base) + i  # type: ignore[arg-type]
        if big is not None and big[i]:
            assert meta is not None
            out.extend(
                chunks(
                    stored,
                    i,
                    seq,
                    implicit=seqs is None,
                    meta=int(meta[i]),
                    max_message_size=policy.max_message_size,
                    chunk_uuid=chunk_uuid,
                )
            )
        else:
            out.append(
                EntrySpec(
                    stored.slice(i, 1),
                    range(i, i + 1),
                    False,
                    seq,
                    seq,
                    first_sequence_id=None if seqs is not None else seq,
                    deliver_at=int(deliver[i]) if deliver is not None else 0,
                )
            )
        pos = i + 1
    if pos < n:
        out.extend(_batches(stored, seqs, seq_base, pos, n, policy))
    return out


def _batches(
    stored: pa.RecordBatch,
    seqs: np.ndarray | None,
    seq_base: int | None,
    lo: int,
    hi: int,
    policy: BatchPolicy,
) -> list[EntrySpec]:
    """Batch entries of rows ``lo..hi-1`` (none of them delayed or chunked)."""
    run = stored.slice(lo, hi - lo)
    names = run.schema.names
    key_based = policy.key_based and ("key" in names or "ordering_key" in names)
    order: np.ndarray | None = None
    bounds = [0, hi - lo]
    if key_based:
        # One batch per key (the ordering key if set, else the key), as Pulsar's key-based
        # batcher; rows without either share one batch.
        bkey = run.column("ordering_key") if "ordering_key" in names else None
        if "key" in names:
            k = run.column("key").cast(pa.binary())
            bkey = k if bkey is None else pc.coalesce(bkey, k)
        assert bkey is not None
        codes = pc.dictionary_encode(bkey.fill_null(b"")).indices.to_numpy(zero_copy_only=False)
        order = np.argsort(codes, kind="stable")
        run = run.take(pa.array(order))
        ordered = codes[order]
        bounds = [0, *(np.flatnonzero(np.diff(ordered)) + 1).tolist(), hi - lo]
    run_seqs = None
    if seqs is not None:
        run_seqs = seqs[lo:hi] if order is None else seqs[lo:hi][order]
    offsets = value_offsets(run.column(0))
    starts: list[int] = []
    ends: list[int] = []
    for g_lo, g_hi in itertools.pairwise(bounds):
        cuts = split_points(offsets[g_lo : g_hi + 1], policy.max_messages, policy.max_bytes)
        starts.extend(g_lo + s for s in cuts)
        ends.extend(g_lo + e for e in [*cuts[1:], g_hi - g_lo])
    highs = None
    if run_seqs is not None:
        highs = np.maximum.reduceat(run_seqs, np.asarray(starts, np.intp)).tolist()
    out: list[EntrySpec] = []
    for j, (a, b) in enumerate(zip(starts, ends)):
        rb = run.slice(a, b - a)
        rows: range | np.ndarray = range(lo + a, lo + b) if order is None else lo + order[a:b]
        if highs is None:
            first = int(seq_base) + lo + a  # type: ignore[arg-type]
            out.append(EntrySpec(rb, rows, True, first, first + b - a - 1, first_sequence_id=first))
        elif key_based:
            high = int(highs[j])
            out.append(EntrySpec(rb, rows, True, high, high, header_sequence_id=high))
        else:
            assert run_seqs is not None
            out.append(EntrySpec(rb, rows, True, int(run_seqs[a]), int(highs[j])))
    if key_based and len(out) > 1:
        assert order is not None
        last = [int(order[b - 1]) for b in ends]
        ranked = sorted(range(len(out)), key=lambda j: (out[j].highest_sequence_id, last[j]))
        out = [out[j] for j in ranked]
    return out


def chunks(
    stored: pa.RecordBatch,
    i: int,
    seq: int,
    *,
    implicit: bool,
    meta: int,
    max_message_size: int,
    chunk_uuid: Callable[[int], str] | None,
    what: str | None = None,
) -> list[EntrySpec]:
    """Chunk entries of row ``i``: its value split so that each chunk, with the row's key,
    ordering key and properties (copied to every chunk), fits the max message size.

    The one chunk cut, of :func:`cut` and of ``send_async`` (which hands it its message as a
    one-row ``stored`` batch). ``seq`` is the message's sequence id, ``implicit`` true when
    ``stored`` has no ``sequence_id`` column, ``meta`` the row's :func:`meta_bytes`, ``what``
    names the message in the error (default: row ``i``).

    Raises
    ------
    MessageTooBig
        If the key, ordering key and property bytes leave no room for the value.
    """
    row = stored.slice(i, 1)
    step = max_message_size - meta
    if step <= 0:
        raise MessageTooBig(
            f"{what or f'the message in row {i}'}: its key/ordering key/properties alone "
            f"({meta} bytes) leave no room for its value under the max message size "
            f"{max_message_size} (chunking splits only the value)"
        )
    value = row.column(0)[0].as_py()  # not null: a null value is too big by its meta alone
    size = len(value)
    num = max(1, math.ceil(size / step))
    uuid = chunk_uuid(seq) if chunk_uuid is not None else str(seq)
    out = []
    for cid in range(num):
        piece = pa.array([value[cid * step : (cid + 1) * step]], pa.binary())
        rb = pa.RecordBatch.from_arrays([piece, *row.columns[1:]], schema=row.schema)
        last = cid == num - 1
        header = seq if last else NO_SEQUENCE_ID
        out.append(
            EntrySpec(
                rb,
                range(i, i + 1) if last else range(0),
                False,
                header,
                header,
                first_sequence_id=seq if implicit else None,
                header_sequence_id=header,
                chunk=ChunkInfo(uuid, cid, num, size),
            )
        )
    return out


def encode(
    specs: Iterable[EntrySpec],
    *,
    producer_name: str,
    publish_time: int,
    codec: Codec,
    group_size: int = ENCODE_GROUP,
    schema_version: bytes = b"",
) -> Iterator[list[PendingEntry]]:
    """Encode entry specs lazily into groups of ``group_size`` :class:`PendingEntry` s.

    Encoding group by group lets the writer write (and release) a group's bytes before the
    next is encoded, so a large bulk write never holds all its bytes in memory.
    """
    group: list[PendingEntry] = []
    for s in specs:
        parts = encode_entry_parts(
            s.batch,
            producer_name=producer_name,
            publish_time=publish_time,
            codec=codec,
            batched=s.batched,
            deliver_at=s.deliver_at,
            chunk=s.chunk,
            first_sequence_id=s.first_sequence_id,
            header_sequence_id=s.header_sequence_id,
            schema_version=schema_version,
        )
        group.append(
            PendingEntry.of(
                parts,
                s.batch.num_rows,
                publish_time,
                producer_name,
                s.sequence_id,
                s.highest_sequence_id,
            )
        )
        if len(group) >= group_size:
            yield group
            group = []
    if group:
        yield group
