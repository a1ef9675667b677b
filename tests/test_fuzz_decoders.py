"""Fuzzing every decoder of stored bytes with Hypothesis: the entry decoder (framing, header,
payload to Arrow) and the metadata parsers (manifest, subscription state, policy files,
closed-ledger index). Whatever the bytes, only filepulsar's own errors come out, and decoding
one input never allocates more than a bound.

Quick by default (a few seconds); ``FILEPULSAR_LONG=1`` runs many more examples. The two
wrong-type campaigns over real stored files try one wrong value per field in the no-JVM loop and
every wrong value per field in ``make test`` (their ``full`` cases are marked slow).
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import crc32c
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filepulsar.storage import Codec, FilePulsarError, TopicName, jsontext, open_blob_store
from filepulsar.storage.codec import compress
from filepulsar.storage.cursor import SubscriptionState
from filepulsar.storage.entry import (
    COLUMN_FLAGS,
    FLAG_BATCH,
    FLAG_CHUNK,
    HEADER,
    iter_entries,
    stored_schema,
)
from filepulsar.storage.entry_encode import encode_entry, frame_entry_parts
from filepulsar.storage.ledger import LedgerInfo, ManagedLedger, ReadEntry
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.policies import effective_policies
from filepulsar.storage.reader import entries_to_table

pytestmark = pytest.mark.property

LONG = os.environ.get("FILEPULSAR_LONG") == "1"
FUZZ = settings(
    max_examples=3000 if LONG else 120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: No single input may make a decoder allocate more than this (Python heap, tracemalloc).
MEMORY_BOUND = 32 << 20


@contextmanager
def bounded_memory() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND, f"decoding allocated {peak} bytes"


def only_own_errors(fn: Callable[[], Any]) -> None:
    """Run ``fn``: it may succeed or raise a FilePulsarError, nothing else, within the bound."""
    with bounded_memory():
        try:
            fn()
        except FilePulsarError:
            pass


# --------------------------------------------------------------------------- entries

_FLAGS = [FLAG_BATCH | sum(COLUMN_FLAGS.values()), FLAG_BATCH, 0, FLAG_CHUNK]


def _real_entry(codec: Codec) -> bytes:
    n = 3
    cols = [
        pa.array([b"v0", b"v1", None], pa.binary()),
        pa.array(["k", None, "k2"], pa.string()),
        pa.array([b"o", b"", None], pa.binary()),
        pa.array([[("a", "b")], None, []], pa.map_(pa.string(), pa.string())),
        pa.array([1, None, 3], pa.int64()),
        pa.array([10, 11, 12], pa.int64()),
    ]
    batch = pa.RecordBatch.from_arrays(cols, schema=stored_schema(_FLAGS[0]))
    assert batch.num_rows == n
    return encode_entry(batch, producer_name="p", publish_time=1, codec=codec)


REAL = {c: _real_entry(c) for c in Codec}
BODY = pa.RecordBatch.from_arrays(
    [pa.array([b"v0", b"v1", None], pa.binary()), pa.array(["k", None, "k2"], pa.string())],
    schema=stored_schema(FLAG_BATCH | COLUMN_FLAGS["key"]),
).serialize()


def _decode_all(data: bytes, count: int) -> None:
    raws = list(iter_entries(data, count))
    entries = [ReadEntry(0, i, r, "persistent://public/default/fuzz") for i, r in enumerate(raws)]
    for e in entries:
        e.messages().to_pylist()
    entries_to_table(entries, -1).to_pylist()


@FUZZ
@given(st.binary(max_size=2048), st.integers(0, 3))
def test_random_bytes_as_entries(data: bytes, count: int) -> None:
    only_own_errors(lambda: _decode_all(data, count))


@FUZZ
@given(st.sampled_from(list(Codec)), st.data())
def test_mutated_real_entries(codec: Codec, data: st.DataObject) -> None:
    raw = bytearray(REAL[codec])
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    only_own_errors(lambda: _decode_all(bytes(raw[:cut] if cut % 7 == 0 else raw), 1))


_I32 = st.integers(-(2**31), 2**31 - 1)
_I64 = st.integers(-(2**63), 2**63 - 1)


@FUZZ
@given(
    codec=st.sampled_from(list(Codec)),
    flags=st.sampled_from(_FLAGS) | st.integers(0, 0xFFFF).map(lambda f: f & 0x1F03),
    n=st.one_of(st.integers(-2, 5), _I32),
    usize=st.one_of(st.integers(0, 4096), st.integers(0, 2**32 - 1)),
    chunk=st.tuples(_I32, _I32, _I64),
    strings=st.tuples(st.binary(max_size=40), st.binary(max_size=40), st.binary(max_size=8)),
    payload_kind=st.sampled_from(["body", "compressed-body", "mutated", "random"]),
    data=st.data(),
)
def test_valid_framing_around_hostile_contents(
    codec: Codec,
    flags: int,
    n: int,
    usize: int,
    chunk: tuple[int, int, int],
    strings: tuple[bytes, bytes, bytes],
    payload_kind: str,
    data: st.DataObject,
) -> None:
    """The CRC is right, so everything after it is decoded: header fields, codec, Arrow."""
    body = BODY.to_pybytes()
    if payload_kind == "body":
        payload = body
    elif payload_kind == "compressed-body":
        payload = bytes(compress(codec, body))
    elif payload_kind == "mutated":
        b = bytearray(compress(codec, body))
        for _ in range(data.draw(st.integers(1, 6))):
            b[data.draw(st.integers(0, len(b) - 1))] = data.draw(st.integers(0, 255))
        payload = bytes(b)
    else:
        payload = data.draw(st.binary(max_size=512))
    if data.draw(st.booleans()):
        usize = len(body)  # often the right size, so the decoder goes further
    cid, nch, tot = chunk
    header = HEADER.pack(1, 0, 0, 0, n, usize, cid, nch, tot) + b"".join(
        struct.pack("<H", len(s)) + s for s in strings
    )
    entry = b"".join(bytes(p) for p in frame_entry_parts(codec, flags, header, payload))
    only_own_errors(lambda: _decode_all(entry, 1))


# --------------------------------------------------------------------------- metadata

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _real_manifest() -> dict[str, Any]:
    store = open_blob_store("memory://fuzz-manifest")
    from filepulsar.storage import Producer

    with Producer(store, "m") as p:
        p.send(b"x")
    ml = ManagedLedger(store, TopicName.parse("m"))
    return jsontext.loads(ml.state().encode().split(b"\n")[0])


def _real_subscription() -> dict[str, Any]:
    from filepulsar.connector.client import Client, InitialPosition

    with Client("memory://fuzz-sub") as c:
        c.create_producer("s").send(b"x")
        consumer = c.subscribe("s", "sub", initial_position=InitialPosition.Earliest)
        consumer.receive(timeout_millis=2000)
        from filepulsar.storage.subscriptions import SubscriptionStore

        st_ = SubscriptionStore(c.store, TopicName.parse("s"), "sub").latest()
        return jsontext.loads(st_.encode().split(b"\n")[0])


MANIFEST = _real_manifest()
SUBSCRIPTION = _real_subscription()


def _mutate(d: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    d = dict(d)
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(sorted(d)))
        if data.draw(st.booleans()):
            del d[key]
        else:
            d[key] = data.draw(_JSON)
        if not d:
            break
    return d


_PARSERS: dict[str, Callable[[bytes], Any]] = {
    "manifest": lambda raw: ManifestState.decode(raw, "fuzz"),
    "subscription": lambda raw: SubscriptionState.decode(raw, "fuzz"),
    "framed": lambda raw: jsontext.decode_framed(raw, "fuzz"),
}


def _policies(raw: bytes) -> None:
    store = open_blob_store("memory://fuzz-policies")
    store.put("namespaces/public/default/policies.json", raw)
    effective_policies(store, TopicName.parse("p"))


def _index(raw: bytes) -> None:
    store = open_blob_store("memory://fuzz-index")
    ml = ManagedLedger(store, TopicName.parse("i"))
    store.put("topics/persistent/public/default/i/ledgers/x.index", raw)
    lg = LedgerInfo(0, entries=1, closed_ms=1, index="ledgers/x.index")
    ml.fragments(lg)


_PARSERS["policies"] = _policies
_PARSERS["index"] = _index


@FUZZ
@given(st.sampled_from(sorted(_PARSERS)), st.binary(max_size=1024))
def test_random_bytes_as_metadata(parser: str, raw: bytes) -> None:
    only_own_errors(lambda: _PARSERS[parser](raw))


@FUZZ
@given(st.sampled_from(sorted(_PARSERS)), _JSON)
def test_framed_json_of_any_shape_as_metadata(parser: str, value: Any) -> None:
    """A right checksum around a wrong shape (what a buggy writer would commit)."""
    only_own_errors(lambda: _PARSERS[parser](jsontext.encode_framed(value)))


@FUZZ
@given(st.sampled_from(["manifest", "subscription"]), st.data())
def test_framed_real_metadata_with_fields_dropped_or_retyped(
    parser: str, data: st.DataObject
) -> None:
    real = MANIFEST if parser == "manifest" else SUBSCRIPTION
    only_own_errors(lambda: _PARSERS[parser](jsontext.encode_framed(_mutate(real, data))))


def test_deeply_nested_metadata_is_corrupt_not_a_recursion_error() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    for name, parse in _PARSERS.items():
        for raw in (deep, deep + b"\ncrc32c=%08x\n" % crc32c.crc32c(deep)):
            try:
                parse(raw)
            except FilePulsarError:
                continue
            raise AssertionError(f"{name} accepted {raw[:20]!r}...")


# ------------------------------------------------ a right checksum around wrong types (#31)
_WRONG = [None, True, -1, 2**70, 1.5, "../../etc", [], {"a": 1}]


def _leaf_paths(v: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _leaf_paths(x, (*path, k))
    elif isinstance(v, list):
        for i, x in enumerate(v[:2]):
            yield from _leaf_paths(x, (*path, i))


def _replaced(v: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    v = copy.deepcopy(v)
    cur = v
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = new
    return v


@contextmanager
def _no_hang(seconds: int) -> Iterator[None]:
    def stop(*_: Any) -> None:
        raise TimeoutError(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _mutate_stored(
    tmp_path: Path,
    base: Path,
    keys: list[str],
    wrongs: list[Any],
    use: Callable[[Any], None],
    located: Callable[[str, str], bool],
    full: bool,
) -> tuple[int, list[str]]:
    """Each of ``keys`` (framed JSON files under the local root ``base``) with one value
    replaced by each of ``wrongs`` (``full``; else by one of them per value, in turn),
    re-framed with a right checksum, in a copy of the root
    that ``use(store)`` then works on. Returns how many mutations ran and what went wrong:
    anything but success, CorruptDataError ``located(message, file name)``, DataLossError or
    IncompatibleFormat (a hang of 5 s counts as wrong)."""
    from filepulsar.storage.blobstore.local import LocalBlobStore
    from filepulsar.storage.errors import CorruptDataError, DataLossError, IncompatibleFormat

    store = LocalBlobStore(str(base), journal=False)
    bad: list[str] = []
    n = 0
    for key in keys:
        real = jsontext.loads(jsontext.unframe(store.get(key), key))
        name = key.rsplit("/", 1)[-1]
        for i, path in enumerate(_leaf_paths(real)):
            for wrong in wrongs if full else [wrongs[i % len(wrongs)]]:
                n += 1
                root = tmp_path / f"r{n}"
                shutil.copytree(base, root)
                s = LocalBlobStore(str(root), journal=False)
                s.put(key, jsontext.encode_framed(_replaced(real, path, wrong)))
                try:
                    with _no_hang(5):
                        use(s)
                except CorruptDataError as e:
                    if not located(str(e), name):
                        bad.append(f"{name} {path} = {wrong!r}: not located: {e}")
                except (DataLossError, IncompatibleFormat):
                    pass
                except Exception as e:
                    bad.append(f"{name} {path} = {wrong!r}: {type(e).__name__} {e}"[:200])
                shutil.rmtree(root)
    return n, bad


@pytest.mark.parametrize("full", [pytest.param(True, marks=pytest.mark.slow), False])
def test_metadata_with_a_wrong_type_or_a_path_outside_its_folder_is_corrupt_data(
    tmp_path: Path, full: bool
) -> None:
    """Every value of a real manifest head (an open ledger's fragments, the catalog's
    references, producers, dedup, ...), of a ledger-catalog segment and of a closed
    ledger's index replaced by a value of another type, a negative or
    65-bit number, or a path reaching outside the root, then framed with a right checksum
    and stored in place in a real root: reading the topic and sending to it either works or
    fails with CorruptDataError naming the file (or DataLossError for
    a name that points at nothing, IncompatibleFormat for the format) -- never a ValueError,
    TypeError, a blob id refused as a name, or a hang."""
    from filepulsar.storage import set_namespace_policies
    from filepulsar.storage.blobstore.local import LocalBlobStore
    from filepulsar.storage.paths import manifest

    base = tmp_path / "base"
    store = LocalBlobStore(str(base), journal=False)  # versions as files, one to replace
    set_namespace_policies(store, "public", "default", ledger_max_entries=2)
    from filepulsar.storage import Producer, Reader

    with Producer(store, "m", batching_enabled=False, producer_name="p") as p:
        for i in range(5):
            p.send(b"x%d" % i)
    t = TopicName.parse("m")
    head = manifest(t, ManagedLedger(store, t).state().version)
    real = jsontext.loads(jsontext.unframe(store.get(head), head))
    assert real["format"] == 2 and real["catalog"] and real["ledgers"][0]["fragments"]
    folder = head.rsplit("/manifest/", 1)[0]
    catalog = sorted(store.list(f"{folder}/catalog"))[-1]
    index = sorted(store.list(f"{folder}/ledgers"))[-1]

    def use(s: Any) -> None:
        r = Reader(s, "m")
        while r.read_batch(10).num_rows:
            pass
        r.close()
        with Producer(s, "m", batching_enabled=False, producer_name="p") as p:
            p.send(b"y")

    n, bad = _mutate_stored(
        tmp_path, base, [head, catalog, index], _WRONG, use, lambda e, name: name in e, full
    )
    assert n > (400 if full else 50)
    assert bad == [], f"{len(bad)} of {n}:\n" + "\n".join(bad[:20])


@pytest.mark.parametrize("full", [pytest.param(True, marks=pytest.mark.slow), False])
def test_subscription_and_compaction_state_with_a_wrong_type_is_corrupt_data(
    tmp_path: Path, full: bool
) -> None:
    """As above for the newest state of a Shared and a Key_Shared subscription, the compacted
    view's state and its index: consumers fetching and acknowledging, a compacted read and a
    new compaction either work or fail with CorruptDataError naming the file (a Key_Shared
    selector: the subscription, topic and version), never a raw TypeError, KeyError,
    ValueError, a blob id refused as a name, or a hang."""
    from filepulsar.storage import Producer, Reader, set_namespace_policies
    from filepulsar.storage.blobstore.local import LocalBlobStore
    from filepulsar.storage.compaction import compact
    from filepulsar.storage.subscription import SubscriptionConsumer

    base = tmp_path / "base"
    store = LocalBlobStore(str(base), journal=False)
    set_namespace_policies(store, "public", "default", ledger_max_entries=2)
    t = TopicName.parse("m")
    with Producer(store, "m", batching_enabled=False) as p:
        for i in range(5):
            p.send(b"x%d" % i, partition_key=f"k{i % 2}")
    types = ("Shared", "Key_Shared")
    for typ in types:
        c = SubscriptionConsumer(store, t, typ, sub_type=typ, initial_position="Earliest")
        ds = c.fetch(3)
        c.acknowledge([(ds[0].position, -1, 1), (ds[2].position, -1, 1)])
    compact(store, "m")
    folder = "topics/persistent/public/default/m"
    keys = [sorted(store.list(f"{folder}/subscriptions/{typ}/state"))[-1] for typ in types]
    keys += [sorted(store.list(f"{folder}/compaction/state"))[-1]]
    keys += [k for k in store.list(f"{folder}/compaction/data") if k.endswith(".index")]
    assert len(keys) == 4

    def use(s: LocalBlobStore) -> None:
        for typ in types:
            c = SubscriptionConsumer(s, t, typ, sub_type=typ, initial_position="Earliest")
            c.acknowledge([(d.position, -1, 1) for d in c.fetch(10)])
            c.close()
        r = Reader(s, "m", read_compacted=True)
        while r.read_batch(10).num_rows:
            pass
        r.close()
        compact(s, "m")

    def located(e: str, name: str) -> bool:
        return name in e or ("selector" in e and f"on {t}, version" in e)

    n, bad = _mutate_stored(
        tmp_path, base, keys, [None, -1, 2**70, "../../etc", {"a": 1}], use, located, full
    )
    assert n > (400 if full else 80)
    assert bad == [], f"{len(bad)} of {n}:\n" + "\n".join(bad[:20])
