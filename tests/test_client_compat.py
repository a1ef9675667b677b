"""pulsar-client's behaviour where filepulsar used to differ silently (issue 13), and the
producer's limits and failure reporting (issue 10, defect 6; issue 14, prompt async sends).

Each test states the pulsar-client behaviour it checks.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest

from connector.client import (
    Client,
    InitialPosition,
    MessageId,
    ProducerAccessMode,
    ProducerFenced,
    Result,
    Timeout,
)
from storage import set_topic_policies
from storage.errors import InvalidConfiguration, MessageTooBig
from storage.topics import create_topic

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
    set_topic_policies(client.store, "fence", producer_lease_ms=1000)
    old = client.create_producer(
        "fence",
        producer_name="old",
        batching_enabled=True,
        batching_max_messages=2,
        batching_max_publish_delay_ms=3_600_000,
    )
    old.send(b"0")
    now[0] += 5000  # old's lease lapsed
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
