"""pulsar-client's behaviour where filepulsar used to differ silently (issue 13), and the
producer's limits and failure reporting (issue 10, defect 6; issue 14, prompt async sends).

Each test states the pulsar-client behaviour it checks.
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import filepulsar as fp
from filepulsar.connector.client import (
    Client,
    ConsumerDeadLetterPolicy,
    ConsumerType,
    InitialPosition,
    Interrupted,
    MessageId,
    PartitionsRoutingMode,
    ProducerAccessMode,
    ProducerFenced,
    RegexSubscriptionMode,
    Result,
    Timeout,
    TopicNotFound,
)
from filepulsar.storage import set_namespace_policies, set_topic_policies
from filepulsar.storage.errors import FilePulsarError, InvalidConfiguration, MessageTooBig
from filepulsar.storage.topics import create_topic

pytestmark = pytest.mark.unit

E = InitialPosition.Earliest
#: Generous: only a wedged producer takes this long (no latency is asserted here).
WAIT_S = 60


@pytest.fixture
def root(store_root: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any] | None]:
    r, options = store_root
    return r, options or None


@pytest.fixture
def client(root: tuple[str, dict[str, Any] | None]) -> Any:
    c = Client(root[0], storage_options=root[1])
    yield c
    c.close()


# ---------------------------------------------------------------------- prompt async sends
@pytest.mark.parametrize("batching", [False, True])
def test_idle_send_async_is_stored_without_flush(
    root: tuple[str, dict[str, Any] | None], client: Client, batching: bool
) -> None:
    """send_async on an idle producer is written after the publish delay (batching) or at
    once (no batching), not when the producer next renews its lease (here: an hour away)."""
    create_topic(client.store, "idle")
    set_topic_policies(client.store, "idle", producer_lease_ms=3_600_000)
    producer = client.create_producer(
        "idle", batching_enabled=batching, batching_max_publish_delay_ms=10
    )
    producer.send(b"first")  # the producer is up and idle after this
    done = threading.Event()
    got: list[Any] = []

    def callback(res: Result, mid: MessageId | None) -> None:
        got.append((res, mid))
        done.set()

    producer.send_async(b"idle", callback)
    assert done.wait(WAIT_S), "send_async's callback was not called without flush()"
    assert got[0][0] is Result.Ok
    # Durable and visible to another client before any flush() or close().
    other = Client(root[0], storage_options=root[1])
    reader = other.create_reader("idle", MessageId.earliest)
    assert [reader.read_next(1000).data() for _ in range(2)] == [b"first", b"idle"]
    other.close()
    producer.close()


def test_batches_opened_while_another_is_timed_are_each_stored_after_the_delay(
    root: tuple[str, dict[str, Any] | None], client: Client
) -> None:
    """Opening a batch wakes the I/O thread only when no batch was open; a batch opened while
    the thread times an older one (here on other partitions, and a second one on the first
    partition after its first batch was written) is still written after its delay, with no
    flush()."""
    create_topic(client.store, "idle-parts", partitions=3)
    set_topic_policies(client.store, "idle-parts", producer_lease_ms=3_600_000)
    producer = client.create_producer(
        "idle-parts",
        batching_enabled=True,
        batching_max_publish_delay_ms=20,
        message_routing_mode=PartitionsRoutingMode.RoundRobinDistribution,
        batching_max_messages=1000,
    )
    producer.send(b"first")
    n = 6
    done = threading.Semaphore(0)
    got: list[Any] = []

    def callback(res: Result, mid: MessageId | None) -> None:
        got.append((res, mid))
        done.release()

    for i in range(n):
        producer.send_async(f"m{i}".encode(), callback, partition_key=f"key-{i}")
    for _ in range(n):
        assert done.acquire(timeout=WAIT_S), "a batch was not written without flush()"
    assert all(res is Result.Ok for res, _ in got)
    assert len({mid.partition() for _, mid in got}) > 1
    producer.close()


# ---------------------------------------------------------------------- producer limits
def test_properties_count_towards_the_max_message_size(client: Client) -> None:
    """Pulsar counts the whole message, metadata included: 1 byte of payload with more than
    the max message size of properties is refused (and so is its bulk form), nothing stored."""
    create_topic(client.store, "props")
    set_topic_policies(client.store, "props", max_message_size=1024)
    producer = client.create_producer("props")
    big = {"k": "v" * 2000}
    with pytest.raises(MessageTooBig, match="properties"):
        producer.send(b"x", properties=big)
    with pytest.raises(MessageTooBig, match="properties"):
        producer.send(b"x", partition_key="k" * 2000)
    with pytest.raises(MessageTooBig):
        producer.send_table(
            pa.table(
                {"value": [b"a", b"x"], "properties": [None, list(big.items())]},
                schema=pa.schema(
                    [("value", pa.binary()), ("properties", pa.map_(pa.string(), pa.string()))]
                ),
            )
        )
    # Chunking splits the payload, never the metadata.
    chunker = client.create_producer("props", chunking_enabled=True)
    with pytest.raises(MessageTooBig, match="alone"):
        chunker.send(b"x", properties=big)
    # Fitting metadata leaves less room per chunk; the message arrives whole.
    payload = bytes(range(256)) * 12
    chunker.send(payload, properties={"k": "v" * 500})
    consumer = client.subscribe("props", "s", initial_position=E)
    msg = consumer.receive(1000)
    assert msg.data() == payload and msg.properties() == {"k": "v" * 500}
    with pytest.raises(Timeout):
        consumer.receive(100)


def test_producer_name_over_65535_bytes_is_refused_at_creation(client: Client) -> None:
    """The entry header holds the producer name with a 16-bit length: a longer name is a
    ValueError at creation, not a producer whose every send fails."""
    with pytest.raises(ValueError, match="producer_name of 65536 bytes is too long"):
        client.create_producer("names", producer_name="n" * 65536)
    assert isinstance(InvalidConfiguration("x"), ValueError)
    p = client.create_producer("names", producer_name="é" * 1000)
    p.send(b"ok")


def test_a_failed_write_answers_every_pending_callback(
    root: tuple[str, dict[str, Any] | None],
) -> None:
    """When the I/O path fails (here: the producer was fenced by an exclusive producer), every
    pending send_async callback is called with an error, also of messages batched while the
    failure was being reported, and close() returns."""
    now = [1_000_000]
    client = Client(root[0], storage_options=root[1], clock=lambda: now[0])
    create_topic(client.store, "fence")
    set_topic_policies(client.store, "fence", producer_lease_ms=60_000)
    old = client.create_producer(
        "fence",
        producer_name="old",
        batching_enabled=True,
        batching_max_messages=2,
        batching_max_publish_delay_ms=3_600_000,
    )
    old.send(b"0")
    # old's lease lapses: it renews every lease/3 of real time (20 s), so no renewal lands
    # while the test runs, even on a loaded machine or S3; the clock's jump is a producer
    # that stopped renewing (e.g. a long GC pause). A 1 s lease raced real renewals.
    now[0] += 120_000
    new = client.create_producer(
        "fence", producer_name="new", access_mode=ProducerAccessMode.Exclusive
    )
    results: dict[bytes, Result] = {}
    answered = threading.Event()

    def cb_for(data: bytes) -> Any:
        def cb(res: Result, mid: MessageId | None) -> None:
            results[data] = res
            if data == b"1":
                # Sent while the failure is being reported: it opens a new batch.
                old.send_async(b"3", cb_for(b"3"))
            if data == b"3":
                answered.set()

        return cb

    old.send_async(b"1", cb_for(b"1"))
    old.send_async(b"2", cb_for(b"2"))  # fills the batch: its write is fenced
    with pytest.raises(ProducerFenced):
        old.flush()
    old.close()
    assert answered.wait(WAIT_S), "a send_async callback was never called"
    assert set(results) == {b"1", b"2", b"3"}
    assert results[b"1"] is results[b"2"] is Result.ProducerFenced
    assert results[b"3"] is not Result.Ok
    new.close()
    client.close()


def test_a_callback_that_raises_does_not_stop_the_others(client: Client) -> None:
    """Whatever a send_async callback raises (even SystemExit) is logged; the callbacks of the
    other messages still run and flush() returns."""
    producer = client.create_producer("cb", batching_enabled=True, batching_max_messages=2)
    got: list[Result] = []

    def bad(res: Result, mid: MessageId | None) -> None:
        raise SystemExit("a callback gave up")

    producer.send_async(b"1", bad)
    producer.send_async(b"2", lambda res, mid: got.append(res))  # same entry as b"1"
    flusher = threading.Thread(target=producer.flush, daemon=True)
    flusher.start()
    flusher.join(WAIT_S)
    assert not flusher.is_alive(), "flush() never returned"
    assert got == [Result.Ok]
    producer.send(b"3")  # the producer still works


def test_last_sequence_id_follows_explicit_sequence_ids(client: Client) -> None:
    """pulsar-client: last_sequence_id() is the highest sequence id published, explicit ones
    included; a duplicate id below it leaves it unchanged."""
    producer = client.create_producer("seq")
    assert producer.last_sequence_id() == -1
    producer.send(b"a", sequence_id=5)
    assert producer.last_sequence_id() == 5
    producer.send(b"b", sequence_id=2)
    assert producer.last_sequence_id() == 5
    producer.send(b"c", sequence_id=9)
    assert producer.last_sequence_id() == 9


# ---------------------------------------------------------------------- readers
def test_reader_seek_honours_start_message_id_inclusive(client: Client) -> None:
    """Reader.seek(id) re-reads the message at id only with start_message_id_inclusive."""
    producer = client.create_producer("seek")
    ids = [producer.send(b"%d" % i) for i in range(5)]
    exclusive = client.create_reader("seek", MessageId.earliest)
    exclusive.seek(ids[2])
    assert exclusive.read_next(1000).data() == b"3"
    # A user-built id (partition -1, no batch index), as pulsar-client's tests build them.
    exclusive.seek(MessageId(ledger_id=ids[1].ledger_id(), entry_id=ids[1].entry_id()))
    assert exclusive.read_next(1000).data() == b"2"
    inclusive = client.create_reader("seek", MessageId.earliest, start_message_id_inclusive=True)
    inclusive.seek(ids[2])
    assert inclusive.read_next(1000).data() == b"2"
    with pytest.raises(ValueError, match="seek needs"):
        inclusive.seek(1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("batching", [False, True])
def test_reader_at_latest_inclusive_reads_the_last_message(client: Client, batching: bool) -> None:
    """pulsar-client: a reader at latest reads nothing old; with start_message_id_inclusive it
    reads the last message (of the last batch, when batched)."""
    producer = client.create_producer("last", batching_enabled=batching)
    for i in range(3):
        producer.send_async(b"%d" % i, None)
    producer.flush()
    latest = client.create_reader("last", MessageId.latest)
    assert not latest.has_message_available()
    with pytest.raises(Timeout):
        latest.read_next(50)
    reader = client.create_reader("last", MessageId.latest, start_message_id_inclusive=True)
    assert reader.has_message_available()
    assert reader.read_next(1000).data() == b"2"
    producer.send(b"3")
    assert reader.read_next(1000).data() == b"3"


def test_readers_producers_and_partition_lookup_auto_create(client: Client) -> None:
    """Pulsar auto-creates a missing topic (per the namespace policy) for readers and
    partition lookups too, and accepts 'tenant/namespace/topic' short names."""
    assert client.get_topic_partitions("new-a") == ["persistent://public/default/new-a"]
    reader = client.create_reader("new-b", MessageId.earliest)
    with pytest.raises(Timeout):
        reader.read_next(10)
    producer = client.create_producer("public/default/new-c")
    assert producer.topic() == "persistent://public/default/new-c"
    producer.send(b"x")
    short = client.create_reader("public/default/new-c", MessageId.earliest)
    assert short.read_next(1000).data() == b"x"
    set_namespace_policies(client.store, "public", "default", allow_auto_topic_creation=False)
    with pytest.raises(TopicNotFound):
        client.create_reader("new-d", MessageId.earliest)
    with pytest.raises(TopicNotFound):
        client.get_topic_partitions("new-e")


# ---------------------------------------------------------------------- consumers
def test_redeliver_unacknowledged_messages_honours_the_dead_letter_policy(client: Client) -> None:
    """Messages come back at most max_redeliver_count times; then they go to the DLQ."""
    client.create_producer("dl").send(b"poison")
    consumer = client.subscribe(
        "dl",
        "s",
        consumer_type=ConsumerType.Shared,
        initial_position=E,
        dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=2),
    )
    dlq = client.subscribe("dl-s-DLQ", "check", initial_position=E)
    counts = []
    for _ in range(3):
        msg = consumer.receive(1000)
        counts.append(msg.redelivery_count())
        consumer.redeliver_unacknowledged_messages()
    assert counts == [0, 1, 2]
    with pytest.raises(Timeout):
        consumer.receive(50)
    dead = dlq.receive(1000)
    assert dead.data() == b"poison"


def test_regex_subscription_matches_as_pulsar_client(client: Client) -> None:
    """The pattern's domain is ignored, the regex subscription mode picks the domains, and a
    pattern without a domain means persistent topics (the default mode)."""
    for t in (
        "persistent://public/default/rx-1",
        "non-persistent://public/default/rx-2",
        "persistent://public/default/no-rx-3",
    ):
        create_topic(client.store, t)
    modes = {
        RegexSubscriptionMode.PersistentOnly: {"persistent://public/default/rx-1"},
        RegexSubscriptionMode.NonPersistentOnly: {"non-persistent://public/default/rx-2"},
        RegexSubscriptionMode.AllTopics: {
            "persistent://public/default/rx-1",
            "non-persistent://public/default/rx-2",
        },
    }
    for i, (mode, want) in enumerate(modes.items()):
        for j, pattern in enumerate(("public/default/rx-.*", "persistent://public/default/rx-.*")):
            c = client.subscribe(
                re.compile(pattern), f"s{i}{j}", regex_subscription_mode=mode, initial_position=E
            )
            assert {p.topic_str for p in c._topics.parts} == want, (mode, pattern)
            c.close()
    bare = client.subscribe(re.compile("rx-.*"), "bare", initial_position=E)
    assert {p.topic_str for p in bare._topics.parts} == {"persistent://public/default/rx-1"}


def test_message_router_is_called_in_every_routing_mode(client: Client) -> None:
    """pulsar-client: a message_router decides every message's partition, whatever the
    routing mode, and gets the message (value(), properties(), partition_key())."""
    create_topic(client.store, "routed", partitions=3)
    seen: list[tuple[bytes, dict[str, str], str]] = []

    def router(msg: Any, n: int) -> int:
        seen.append((msg.value(), msg.properties(), msg.partition_key()))
        return int(msg.value()) % n

    for mode in PartitionsRoutingMode:
        producer = client.create_producer(
            "routed", message_routing_mode=mode, message_router=router
        )
        ids = [producer.send(b"%d" % i, properties={"m": mode.name}) for i in range(3)]
        assert [m.partition() for m in ids] == [0, 1, 2]
        producer.send(b"4", partition_key="k")
        producer.close()
    assert len(seen) == 4 * len(PartitionsRoutingMode)
    assert seen[0] == (b"0", {"m": "UseSinglePartition"}, "")
    assert seen[3] == (b"4", {}, "k")


def test_interrupted_receive_raises_interrupted(client: Client) -> None:
    """Ctrl-C during a blocking receive raises pulsar-client's Interrupted."""
    # Python's own Ctrl-C handler, as in a terminal: a test run started in the background
    # inherits SIGINT ignored (POSIX, for jobs without job control), and the receive below,
    # with nothing to receive, then waited for pytest's 600 s timeout.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    consumer = client.subscribe("intr", "s")
    main = threading.get_ident()
    stop = threading.Event()

    def interrupt_when_waiting() -> None:
        # Send SIGINT once the main thread is inside receive(), never before.
        while not stop.is_set():
            frame = sys._current_frames().get(main)
            names = set()
            while frame is not None:
                names.add(frame.f_code.co_name)
                frame = frame.f_back
            if "_receive" in names:
                signal.raise_signal(signal.SIGINT)
                return
            stop.wait(0.001)

    t = threading.Thread(target=interrupt_when_waiting, daemon=True)
    t.start()
    try:
        with pytest.raises(Interrupted):
            consumer.receive()
    finally:
        stop.set()
        t.join()
        signal.signal(signal.SIGINT, previous)


# ---------------------------------------------------------------------- defaults and names
def test_defaults_are_pulsar_clients(client: Client) -> None:
    """batching off, block_if_queue_full off, chunking alone works, DLQ names ''."""
    producer = client.create_producer("defaults")
    producer.send_async(b"a", None)
    producer.send_async(b"b", None)
    producer.flush()
    consumer = client.subscribe("defaults", "s", initial_position=E)
    ids = [consumer.receive(1000).message_id() for _ in range(2)]
    assert [m.batch_index() for m in ids] == [-1, -1]  # one entry per message
    assert ids[0].entry_id() != ids[1].entry_id()
    assert not producer._inner.block_if_queue_full
    big = client.create_producer("defaults", chunking_enabled=True)
    big.send(b"x" * (6 * 1024 * 1024))
    assert len(consumer.receive(5000).data()) == 6 * 1024 * 1024
    policy = ConsumerDeadLetterPolicy(3)
    assert policy.dead_letter_topic == "" and policy.initial_subscription_name == ""
    with pytest.raises(ValueError, match="max_redeliver_count"):
        ConsumerDeadLetterPolicy(0)
    with pytest.raises(ValueError, match="Batching and chunking"):
        client.create_producer("defaults", batching_enabled=True, chunking_enabled=True)


def test_message_id_and_message_as_pulsar_client(client: Client) -> None:
    """MessageId(partition, ledger_id, entry_id, batch_index); wrap; deserialize(topic=);
    ordering_key() is str; encryption_context() None; has_null_value()."""
    mid = MessageId(2, 10, 20, 3)
    assert (mid.partition(), mid.ledger_id(), mid.entry_id(), mid.batch_index()) == (2, 10, 20, 3)
    assert MessageId(ledger_id=10, entry_id=20) == MessageId(-1, 10, 20, -1)
    assert MessageId() == MessageId.earliest
    assert MessageId(0, 1, 5) < MessageId(1, 2, 0) < MessageId.latest  # ledger, entry order
    assert MessageId.wrap(mid) is mid
    assert MessageId.deserialize(mid.serialize()) == mid
    create_topic(client.store, "ids", partitions=2)
    producer = client.create_producer("ids", message_routing_mode=_single())
    sent = producer.send(b"v", ordering_key="ok", partition_key="pk")
    consumer = client.subscribe("ids", "s", initial_position=E)
    msg = consumer.receive(1000)
    assert msg.ordering_key() == "ok" and msg.partition_key() == "pk"
    assert msg.encryption_context() is None and msg.has_null_value() is False
    again = MessageId.deserialize(sent.serialize(), topic=msg.topic_name())
    consumer.acknowledge(again)  # a multi-topic consumer finds the partition by the topic


def test_exception_names_and_client_arguments(root: tuple[str, dict[str, Any] | None]) -> None:
    """Every name of pulsar-client's exceptions module exists, rooted at PulsarException;
    Client accepts pulsar-client's keyword arguments; bad arguments are ValueError."""
    from filepulsar.connector import client as fp

    names = [
        "PulsarException",
        "UnknownError",
        "InvalidConfiguration",
        "Timeout",
        "LookupError",
        "ConnectError",
        "ReadError",
        "AuthenticationError",
        "AuthorizationError",
        "ErrorGettingAuthenticationData",
        "BrokerMetadataError",
        "BrokerPersistenceError",
        "ChecksumError",
        "ConsumerBusy",
        "NotConnected",
        "AlreadyClosed",
        "InvalidMessage",
        "ConsumerNotInitialized",
        "ProducerNotInitialized",
        "ProducerBusy",
        "TooManyLookupRequestException",
        "InvalidTopicName",
        "InvalidUrl",
        "ServiceUnitNotReady",
        "OperationNotSupported",
        "ProducerBlockedQuotaExceededError",
        "ProducerBlockedQuotaExceededException",
        "ProducerQueueIsFull",
        "MessageTooBig",
        "TopicNotFound",
        "SubscriptionNotFound",
        "ConsumerNotFound",
        "UnsupportedVersionError",
        "TopicTerminated",
        "CryptoError",
        "IncompatibleSchema",
        "ConsumerAssignError",
        "CumulativeAcknowledgementNotAllowedError",
        "TransactionCoordinatorNotFoundError",
        "InvalidTxnStatusError",
        "NotAllowedError",
        "TransactionConflict",
        "TransactionNotFound",
        "ProducerFenced",
        "MemoryBufferIsFull",
        "Interrupted",
    ]
    for name in names:
        assert issubclass(getattr(fp, name), fp.PulsarException), name
    assert fp.PulsarException is FilePulsarError
    with pytest.raises(fp.InvalidUrl):
        Client("pulsar://localhost:6650")
    c = Client(
        root[0],
        authentication=None,
        operation_timeout_seconds=30,
        io_threads=4,
        message_listener_threads=2,
        concurrent_lookup_requests=10,
        log_conf_file_path=None,
        stats_interval_in_seconds=60,
        use_tls=False,
        tls_trust_certs_file_path=None,
        tls_allow_insecure_connection=False,
        tls_validate_hostname=False,
        logger=logging.getLogger("x"),
        connection_timeout_ms=1000,
        listener_name=None,
        storage_options=root[1],
    )
    with pytest.raises(ValueError, match="io_threads"):
        Client(root[0], io_threads="4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="topic"):
        c.create_producer(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batching_enabled"):
        c.create_producer("t", batching_enabled="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_millis"):
        c.subscribe("t", "s").receive(1.5)  # type: ignore[arg-type]
    with pytest.raises(fp.OperationNotSupported):
        c.create_producer("t", encryption_key="k")
    c.close()


def _single() -> Any:
    return PartitionsRoutingMode.UseSinglePartition


def test_crypto_key_reader_is_made_and_refused_where_pulsar_client_would_use_it(
    tmp_path: Any,
) -> None:
    """Issue 30: ``pulsar.CryptoKeyReader`` exists and type-checks its paths as
    pulsar-client does; end-to-end encryption is refused at create_producer / subscribe /
    create_reader with OperationNotSupported, and a wrong type with ValueError."""
    reader = fp.CryptoKeyReader("pub.pem", "priv.pem")
    assert (reader.public_key_path, reader.private_key_path) == ("pub.pem", "priv.pem")
    with pytest.raises(ValueError, match="public_key_path"):
        fp.CryptoKeyReader(1, "priv.pem")  # type: ignore[arg-type]
    c = Client(str(tmp_path / "root"))
    with pytest.raises(fp.OperationNotSupported, match="crypto_key_reader"):
        c.create_producer("t", crypto_key_reader=reader)
    with pytest.raises(fp.OperationNotSupported, match="crypto_key_reader"):
        c.subscribe("t", "s", crypto_key_reader=reader)
    with pytest.raises(fp.OperationNotSupported, match="crypto_key_reader"):
        c.create_reader("t", fp.MessageId.earliest, crypto_key_reader=reader)
    with pytest.raises(ValueError, match="crypto_key_reader"):
        c.create_producer("t", crypto_key_reader="not a reader")
    c.close()


@pytest.mark.parametrize("kind", ["console", "file"])
def test_console_and_file_loggers_carry_the_clients_log(
    tmp_path: Any, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 30: ``Client(url, logger=ConsoleLogger(...) | FileLogger(...))`` as in
    pulsar-client; the client's warnings reach stdout or the file at the logger's level,
    and stop when the client is closed."""
    log_file = str(tmp_path / "client.log")
    logger = (
        fp.ConsoleLogger(fp.LoggerLevel.Warn)
        if kind == "console"
        else fp.FileLogger(fp.LoggerLevel.Warn, log_file)
    )
    c = Client(str(tmp_path / "root"), logger=logger)
    logging.getLogger("filepulsar.connector.client.consumer").warning("seen while open")
    logging.getLogger("filepulsar.connector.client.consumer").debug("below the level")
    c.close()
    logging.getLogger("filepulsar.connector.client.consumer").warning("after close")
    text = capsys.readouterr().out if kind == "console" else Path(log_file).read_text()
    assert "WARNING filepulsar.connector.client.consumer: seen while open" in text
    assert "below the level" not in text and "after close" not in text
    with pytest.raises(ValueError, match="log_level"):
        fp.ConsoleLogger("INFO")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Logger is expected"):
        Client(str(tmp_path / "root"), logger="stdout")
