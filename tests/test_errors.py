"""One exception tree: everything filepulsar raises on purpose is a FilePulsarError, and a
storage failure surfaces as an error naming where it happened, on every read path.

Failures are real: bytes cut off a data blob, a blob the OS cannot open, a write the OS refuses
(a file-size limit, as a full disk would), in real processes.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import filepulsar.connector.client
import filepulsar.connector.client.asyncio
import filepulsar.connector.client.asyncio.errors
import filepulsar.connector.client.types
import filepulsar.jobs.cli
import filepulsar.storage.blobstore
import filepulsar.storage.entry
import filepulsar.storage.errors
from filepulsar import connector, jobs, storage
from filepulsar.connector.client import Client, InitialPosition
from filepulsar.connector.source.partition import FilePulsarPartition
from filepulsar.connector.source.read import read_partition
from filepulsar.jobs.cli import main
from filepulsar.storage import (
    CorruptDataError,
    FilePulsarError,
    ManagedLedger,
    Producer,
    Reader,
    StorageError,
    TopicName,
    open_blob_store,
)
from filepulsar.storage.blobstore import BlobExists, BlobNotFound, BlobStoreError
from filepulsar.storage.blobstore.local import MAP_MIN_BYTES
from filepulsar.storage.ledger import EARLIEST
from filepulsar.storage.read_range import WHOLE

pytestmark = pytest.mark.unit

ERROR_MODULES = [
    storage.errors,
    storage.blobstore,
    storage.entry,
    connector.client.types,
    connector.client,
    connector.client.asyncio,
    connector.client.asyncio.errors,
    jobs.cli,
]


def _exception_classes() -> list[type[BaseException]]:
    out = []
    for module in ERROR_MODULES:
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.removeprefix("filepulsar.").split(
                "."
            )[0] in (
                "dispatch",
                "storage",
                "connector",
                "jobs",
            ):
                out.append(obj)
    return sorted(set(out), key=lambda c: c.__qualname__)


@pytest.mark.parametrize("cls", _exception_classes(), ids=lambda c: c.__qualname__)
def test_every_error_class_is_a_filepulsar_error(cls: type[BaseException]) -> None:
    assert issubclass(cls, FilePulsarError)


def test_the_tree_has_the_expected_shape() -> None:
    assert connector.PulsarException is FilePulsarError
    assert connector.client.PulsarException is FilePulsarError
    assert storage.PulsarException is FilePulsarError
    assert BlobStoreError is StorageError
    for cls in (BlobNotFound, BlobExists, storage.errors.BlobTruncated):
        assert issubclass(cls, StorageError)
    assert issubclass(storage.entry.EntryFormatError, CorruptDataError)
    assert issubclass(storage.errors.ChecksumError, CorruptDataError)
    # Argument errors stay ValueErrors, as callers catch them that way.
    for cls in (
        storage.errors.InvalidConfiguration,
        storage.errors.InvalidTopicName,
        storage.errors.MessageTooBig,
        storage.errors.InvalidAckError,
    ):
        assert issubclass(cls, ValueError)
    assert "PulsarException" in connector.__all__ and "PulsarException" in storage.__all__


#: Every error class filepulsar defines, by name, with its direct parents: the tree as
#: reviewed. A new class, a moved one or a changed parent fails here until this table (and
#: the review of the tree) is updated on purpose.
ERROR_TREE: dict[str, str] = {
    "AlreadyClosed": "FilePulsarError",
    "AlreadyExists": "FilePulsarError",
    "AuthenticationError": "FilePulsarError",
    "AuthorizationError": "FilePulsarError",
    "BadArgument": "InvalidConfiguration",
    "BlobExists": "StorageError",
    "BlobNotFound": "StorageError",
    "BlobTruncated": "StorageError",
    "BrokerMetadataError": "FilePulsarError",
    "BrokerPersistenceError": "FilePulsarError",
    "ChecksumError": "CorruptDataError",
    "CommitConflict": "FilePulsarError",
    "CommitOutcomeUnknown": "CommitConflict",
    "ConnectError": "FilePulsarError",
    "ConsumerAssignError": "FilePulsarError, ValueError",
    "ConsumerBusy": "FilePulsarError",
    "ConsumerNotFound": "FilePulsarError",
    "ConsumerNotInitialized": "FilePulsarError",
    "CorruptDataError": "FilePulsarError",
    "CryptoError": "FilePulsarError",
    "CumulativeAcknowledgementNotAllowedError": "InvalidAckError",
    "DataLossError": "FilePulsarError",
    "EntryFormatError": "CorruptDataError, ValueError",
    "ErrorGettingAuthenticationData": "FilePulsarError",
    "FilePulsarError": "Exception",
    "IncompatibleFormat": "FilePulsarError",
    "IncompatibleSchema": "FilePulsarError",
    "Interrupted": "FilePulsarError",
    "InvalidAckError": "FilePulsarError, ValueError",
    "InvalidConfiguration": "FilePulsarError, ValueError",
    "InvalidMessage": "FilePulsarError",
    "InvalidTopicName": "FilePulsarError, ValueError",
    "InvalidTxnStatusError": "FilePulsarError",
    "InvalidUrl": "InvalidConfiguration",
    "LookupError": "FilePulsarError",
    "MemoryBufferIsFull": "FilePulsarError",
    "MessageTooBig": "FilePulsarError, ValueError",
    "NamespaceNotFound": "FilePulsarError",
    "NotAllowedError": "FilePulsarError",
    "NotConnected": "FilePulsarError",
    "NotEmpty": "FilePulsarError",
    "OperationNotSupported": "InvalidConfiguration",
    "ProducerBlockedQuotaExceededError": "FilePulsarError",
    "ProducerBlockedQuotaExceededException": "FilePulsarError",
    "ProducerBusy": "FilePulsarError",
    "ProducerClosed": "FilePulsarError",
    "ProducerFenced": "FilePulsarError",
    "ProducerNotInitialized": "FilePulsarError",
    "ProducerQueueIsFull": "FilePulsarError",
    "PulsarException": "FilePulsarError",
    "ReadError": "FilePulsarError",
    "ServiceUnitNotReady": "FilePulsarError",
    "StorageError": "FilePulsarError",
    "SubscriptionNotFound": "FilePulsarError",
    "TenantNotFound": "FilePulsarError",
    "Timeout": "FilePulsarError",
    "TooManyLookupRequestException": "FilePulsarError",
    "TopicAlreadyExists": "FilePulsarError",
    "TopicNotFound": "FilePulsarError",
    "TopicTerminated": "FilePulsarError",
    "TransactionConflict": "FilePulsarError",
    "TransactionCoordinatorNotFoundError": "FilePulsarError",
    "TransactionNotFound": "FilePulsarError",
    "UnitError": "InvalidConfiguration",
    "UnknownError": "FilePulsarError",
    "_PulsarValueError": "PulsarException, ValueError",
}


def test_the_exception_tree_is_pinned_by_name_and_parents() -> None:
    found = {c.__name__: ", ".join(b.__name__ for b in c.__bases__) for c in _exception_classes()}
    assert len(found) == len(_exception_classes())  # names are unique across the modules
    assert found == ERROR_TREE
    # The root under pulsar-client's name, and storage failures inside it.
    assert storage.errors.PulsarException is FilePulsarError
    # One ConsumerAssignError: the one the selectors raise is pulsar-client's public name.
    from filepulsar.dispatch.selectors import base as selector_base

    assert connector.client.types.ConsumerAssignError is selector_base.ConsumerAssignError
    assert filepulsar.storage.blobstore.BlobStoreError is StorageError
    assert issubclass(StorageError, FilePulsarError) and not issubclass(StorageError, OSError)


# --------------------------------------------------------------------------- damaged blobs


def _topic_with_data(root: Path, n: int = 6) -> tuple[Any, str]:
    store = open_blob_store(str(root))
    with Producer(store, "t", batching_enabled=False) as p:
        for i in range(n):
            p.send(b"value-%d" % i)
    ml = ManagedLedger(store, TopicName.parse("t"))
    (lg,) = ml.state().ledgers
    (blob,) = {f.blob for f in lg.fragments or []}  # one producer session, one blob
    path = store.local_path(f"topics/persistent/public/default/t/data/{blob}.entries")
    assert path is not None and os.path.getsize(path) == lg.size
    return store, path


def _read_all_storage(store: Any) -> list[bytes]:
    r = Reader(store, "t")
    out: list[bytes] = []
    while True:
        t = r.read_batch(100, timeout_ms=0)
        if not t.num_rows:
            return out
        out.extend(t.column("value").to_pylist())


def _assert_located(err: BaseException) -> None:
    text = str(err)
    assert "persistent://public/default/t" in text and "ledger 0" in text, text
    assert re.search(r"entr(y|ies) 0\b", text), text
    assert "\n" not in text


@pytest.mark.parametrize("keep", [0, 100], ids=["empty", "truncated"])
def test_a_cut_data_blob_is_corrupt_data_naming_topic_ledger_entry(
    tmp_path: Path, capsys: Any, keep: int
) -> None:
    store, path = _topic_with_data(tmp_path)
    os.truncate(path, keep)

    with pytest.raises(CorruptDataError) as info:
        _read_all_storage(store)
    _assert_located(info.value)
    assert info.value.ledger_id == 0 and info.value.entry_id == 0

    # The client's reader and consumer.
    with Client(str(tmp_path)) as client:
        reader = client.create_reader("t", connector.client.MessageId.earliest)
        with pytest.raises(CorruptDataError) as info:
            reader.read_next(timeout_millis=1000)
        _assert_located(info.value)
        consumer = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
        with pytest.raises(CorruptDataError) as info:
            consumer.receive(timeout_millis=1000)
        _assert_located(info.value)

    # The CLI: one line, non-zero exit.
    capsys.readouterr()
    assert main(["--root", str(tmp_path), "peek", "t"]) == 1  # an error, not bad usage (2)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "ledger 0" in err

    # The Spark executor's read (what a task runs), and a reader told to skip what is lost.
    part = FilePulsarPartition(
        str(tmp_path), {}, "persistent://public/default/t", (-1, -1, WHOLE), (0, 5, WHOLE)
    )
    with pytest.raises(CorruptDataError) as info:
        list(read_partition(part))
    _assert_located(info.value)
    skipped: list[Exception] = []
    ml = ManagedLedger(store, TopicName.parse("t"))
    assert ml.read_entries(ml.state(), EARLIEST, on_error=skipped.append) == []
    assert skipped and all(isinstance(e, CorruptDataError) for e in skipped)


def test_a_cut_mapped_fragment_is_corrupt_data_naming_topic_ledger_entry(tmp_path: Path) -> None:
    """Fragments of local data blobs past MAP_MIN_BYTES are memory-mapped, not copied: a blob
    cut shorter than its fragment is still found before anything is mapped (no SIGBUS), and
    reported as corrupt data with its location, in storage and in the Spark executor's read."""
    store = open_blob_store(str(tmp_path))
    with Producer(store, "t", compression_type="NONE") as p:
        p.send_table([os.urandom(200) for _ in range(4000)])  # one fragment of ~0.9 MB
    ml = ManagedLedger(store, TopicName.parse("t"))
    (lg,) = ml.state().ledgers
    (frag,) = lg.fragments or []
    assert frag.length >= 2 * MAP_MIN_BYTES
    entries = ml.read_entries(ml.state(), EARLIEST)
    assert not isinstance(entries[0].raw.payload.obj, bytes)  # mapped, not a copy
    assert sum(e.raw.header.num_messages for e in entries) == 4000
    path = store.local_path(f"topics/persistent/public/default/t/data/{frag.blob}.entries")
    assert path is not None
    os.truncate(path, frag.length // 2)

    fresh = ManagedLedger(store, TopicName.parse("t"))  # no cached entry offsets
    with pytest.raises(CorruptDataError, match="shorter than its fragment") as info:
        fresh.read_entries(fresh.state(), EARLIEST)
    _assert_located(info.value)
    last = lg.entries - 1
    part = FilePulsarPartition(
        str(tmp_path), {}, "persistent://public/default/t", (-1, -1, WHOLE), (0, last, WHOLE)
    )
    with pytest.raises(CorruptDataError) as info:
        list(read_partition(part))
    _assert_located(info.value)


def test_a_blob_the_os_cannot_open_is_a_storage_error_naming_the_entries(tmp_path: Path) -> None:
    store, path = _topic_with_data(tmp_path)
    os.unlink(path)
    os.symlink(path, path)  # a symlink to itself: open() fails with ELOOP
    with pytest.raises(StorageError) as info:
        _read_all_storage(store)
    err = info.value
    _assert_located(err)
    assert not isinstance(err, CorruptDataError | BlobNotFound)
    assert err.topic == "persistent://public/default/t" and err.ledger_id == 0
    # It may be transient: a reader that skips lost data does not skip it.
    ml = ManagedLedger(store, TopicName.parse("t"))
    with pytest.raises(StorageError):
        ml.read_entries(ml.state(), EARLIEST, on_error=lambda e: None)


ACK_ON_FULL_DISK = textwrap.dedent(
    """
    import resource, signal, sys
    from filepulsar.connector.client import Client, InitialPosition, PulsarException
    client = Client(sys.argv[1])
    consumer = client.subscribe(
        "t", "billing", initial_position=InitialPosition.Earliest, ack_grouping_time_ms=0
    )
    msg = consumer.receive(timeout_millis=5000)
    # From here the OS refuses to write files over 64 bytes (EFBIG), as a full disk would.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
    try:
        consumer.acknowledge(msg)
    except PulsarException as e:
        print(type(e).__name__, e)
        sys.exit(0)
    print("acknowledged")
    sys.exit(1)
    """
)


@pytest.mark.procs
def test_an_acknowledgement_the_disk_refuses_is_a_pulsar_exception_naming_the_subscription(
    tmp_path: Path,
) -> None:
    _topic_with_data(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run(
        [sys.executable, "-c", ACK_ON_FULL_DISK, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    line = out.stdout.strip()
    assert line.startswith("StorageError ") and "\n" not in line
    assert "subscription 'billing' on persistent://public/default/t" in line
    assert "File too large" in line
    assert "Traceback" not in out.stderr


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    ("root", "options", "says"),
    [
        ("{tmp}", '{"key": "x"}', "do not apply"),
        ("", None, "must not be empty"),
        ("memory://", None, "needs a name"),
        ("nosuchscheme://bucket/x", None, "unknown scheme 'nosuchscheme'"),
        ("s3://", None, "needs a bucket"),
        ("s3://bucket/x", '{"no_such_option": 1}', "no_such_option"),
        ("{tmp}", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("{tmp}", '{"a": ' * 5000 + "1" + "}" * 5000, "nested too deeply"),
    ],
    ids=[
        "options-on-local",
        "empty",
        "memory-no-name",
        "unknown-scheme",
        "s3-no-bucket",
        "bad-s3-option",
        "deep-array",
        "deep-object",
    ],
)
def test_cli_reports_a_root_it_cannot_open_in_one_line(
    tmp_path: Path, capsys: Any, root: str, options: str | None, says: str
) -> None:
    args = ["--root", root.format(tmp=tmp_path)]
    if options is not None:
        args += ["--storage-options", options]
    assert main([*args, "topics", "list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err[:500]
    assert says in err and len(err) < 400


def test_deeply_nested_json_options_are_invalid_configuration() -> None:
    from filepulsar.connector.options import OptionReader, storage_options

    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(storage.InvalidConfiguration, match="nested too deeply") as info:
        storage_options(OptionReader({"storageOptions": deep}, "filepulsar source"))
    assert len(str(info.value)) < 300
    from filepulsar.connector.source.options import _parse_offsets_option

    with pytest.raises(storage.InvalidConfiguration):
        _parse_offsets_option(
            OptionReader({"startingOffsets": deep}, "src"), "startingOffsets", "x"
        )


def test_policy_values_from_the_cli_that_nest_too_deeply_are_one_line(
    tmp_path: Path, capsys: Any
) -> None:
    value = "[" * 100_000 + "]" * 100_000
    args = ["--root", str(tmp_path), "policies", "set", "public/default"]
    assert main([*args, f"retention_time_minutes={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and len(err) < 400
    json.loads("[]")  # the json module still works afterwards
