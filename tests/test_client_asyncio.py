"""The asyncio client, ``filepulsar.asyncio`` (issue 13): pulsar-client's own asyncio suite
(``tests/asyncio_test.py`` of apache/pulsar-client-python) in our words, then what our bridge
to the synchronous client promises on top (cancelled receives lose nothing, close wakes
waiting receives, waiting consumers do not starve others).

Each upstream check is kept; the service URL is a ``tmp_path`` root and the broker's HTTP
admin calls are :class:`filepulsar.admin.Admin` calls. Coroutines run with ``asyncio.run``.

Not ported: ``test_token_auth_supplier_exception`` (token authentication: there is no broker to
authenticate to; ``authentication=`` is accepted and has no effect).
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from filepulsar.admin import Admin
from filepulsar.asyncio import Client, Consumer, Producer, PulsarException, _set_future
from filepulsar.connector.client import (
    ConsumerDeadLetterPolicy,
    ConsumerType,
    InitialPosition,
    MessageId,
    Result,
)
from filepulsar.storage.errors import FilePulsarError

pytestmark = pytest.mark.unit

#: Only a wedged client takes this long; no latency is asserted with it.
WAIT_S = 30
NS = "persistent://public/default/"

Body = Callable[[Client], Awaitable[None]]


def run(root: Path, body: Body, **kwargs: Any) -> None:
    """Run ``body(client)`` on a fresh event loop with a client of ``root``, then close it."""

    async def main() -> None:
        client = Client(str(root), operation_timeout_seconds=5, **kwargs)
        try:
            await asyncio.wait_for(body(client), WAIT_S)
        finally:
            await client.close()

    asyncio.run(main())


async def send_five(producer: Producer) -> list[MessageId]:
    return [await producer.send(f"msg-{i}".encode()) for i in range(5)]


# ---------------------------------------------------------------------- producers
def test_batched_sends_share_an_entry_and_latest_is_the_default_position(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer("batch-e2e", producer_name="my-producer")
        assert producer.topic() == NS + "batch-e2e"
        assert producer.producer_name() == "my-producer"
        tasks = [asyncio.create_task(producer.send(f"msg-{i}".encode())) for i in range(5)]
        ids = await asyncio.gather(*tasks)
        assert producer.last_sequence_id() == 4
        # Batching is on by default in the asyncio API: the five sent together share an entry.
        for i, mid in enumerate(ids):
            assert isinstance(mid, MessageId)
            assert (mid.ledger_id(), mid.entry_id()) == (ids[0].ledger_id(), ids[0].entry_id())
            assert mid.batch_index() == i

        consumer = await client.subscribe(
            "batch-e2e", "sub", initial_position=InitialPosition.Earliest
        )
        for i in range(5):
            assert (await consumer.receive()).data() == f"msg-{i}".encode()
        await consumer.close()

        # A second subscription starts at the end by default.
        consumer = await client.subscribe("batch-e2e", "sub2")
        await producer.send(b"final-message")
        assert (await consumer.receive()).data() == b"final-message"

    run(tmp_path, body)


def test_key_ordering_key_and_properties_arrive(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer("keyed")
        consumer = await client.subscribe("keyed", "sub")
        await producer.send(
            b"msg", partition_key="key0", ordering_key="key1", properties={"my-prop": "my-value"}
        )
        msg = await consumer.receive()
        assert msg.data() == b"msg"
        assert msg.partition_key() == "key0"
        assert msg.ordering_key() == "key1"
        assert msg.properties() == {"my-prop": "my-value"}

    run(tmp_path, body)


def test_flush_completes_sends_waiting_in_an_open_batch(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer(
            "flush", batching_max_messages=3, batching_max_publish_delay_ms=60000
        )
        tasks = [asyncio.create_task(producer.send(f"msg-{i}".encode())) for i in range(2)]
        # The batch is neither full nor due: nothing completes on its own (a negative check).
        done, pending = await asyncio.wait(tasks, timeout=0.3)
        assert not done and len(pending) == 2

        await producer.flush()
        assert all(t.done() for t in tasks)
        a, b = tasks[0].result(), tasks[1].result()
        assert (a.ledger_id(), a.entry_id()) == (b.ledger_id(), b.entry_id())
        assert (a.batch_index(), b.batch_index()) == (0, 1)

    run(tmp_path, body)


def test_get_topic_partitions(tmp_path: Path) -> None:
    Admin(str(tmp_path)).topics().create_partitioned_topic(NS + "parts-async", 3)

    async def body(client: Client) -> None:
        assert await client.get_topic_partitions(NS + "parts-async") == [
            NS + f"parts-async-partition-{i}" for i in range(3)
        ]
        assert await client.get_topic_partitions(NS + "not-partitioned") == [NS + "not-partitioned"]

    run(tmp_path, body)


def test_messages_of_a_partitioned_topic_name_their_partition(tmp_path: Path) -> None:
    Admin(str(tmp_path)).topics().create_partitioned_topic(NS + "pt-name", 3)
    partitions = [NS + f"pt-name-partition-{i}" for i in range(3)]

    async def body(client: Client) -> None:
        assert await client.get_topic_partitions(NS + "pt-name") == partitions
        consumer = await client.subscribe(NS + "pt-name", "sub", consumer_type=ConsumerType.Shared)
        producer = await client.create_producer(NS + "pt-name")
        await producer.send(b"hello")
        msg = await asyncio.wait_for(consumer.receive(), 10)
        assert msg.topic_name() in partitions

    run(tmp_path, body)


def test_create_producer_failure_is_topic_not_found(tmp_path: Path) -> None:
    # The broker refuses a producer on a topic that does not exist and may not be created
    # (upstream: a tenant that does not exist; here tenants are implicit, so the namespace
    # policy forbids auto-creation).
    Admin(str(tmp_path)).namespaces().set_auto_topic_creation("tenant/ns", False)

    async def body(client: Client) -> None:
        with pytest.raises(PulsarException) as info:
            await client.create_producer("tenant/ns/send-failure")
        assert info.value.error() is Result.TopicNotFound

    run(tmp_path, body)


def test_send_failure_is_message_too_big(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer("send-failure")
        with pytest.raises(PulsarException) as info:
            await producer.send(b"x" * (10 * 1024 * 1024))
        assert info.value.error() is Result.MessageTooBig

    run(tmp_path, body)


def test_closing_a_producer_twice_is_already_closed(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer("close-producer")
        await producer.close()
        with pytest.raises(PulsarException) as info:
            await producer.close()
        assert info.value.error() is Result.AlreadyClosed

    run(tmp_path, body)


def test_producer_is_connected_until_closed(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer("is-connected")
        assert producer.is_connected()
        await producer.close()
        assert not producer.is_connected()

    run(tmp_path, body)


def test_send_after_client_shutdown_is_already_closed(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer(NS + "shutdown")
        await producer.send(b"hello")
        client.shutdown()
        with pytest.raises(PulsarException) as info:
            await producer.send(b"hello")
        assert info.value.error() is Result.AlreadyClosed

    run(tmp_path, body)


# ---------------------------------------------------------------------- consumers
def test_cumulative_acknowledge(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        consumer = await client.subscribe("cumulative", "sub")
        producer = await client.create_producer("cumulative")
        await send_five(producer)
        last = None
        for _ in range(5):
            last = await consumer.receive()
        assert last is not None
        await consumer.acknowledge_cumulative(last)
        await consumer.close()

        consumer = await client.subscribe("cumulative", "sub")
        await producer.send(b"final-message")
        assert (await consumer.receive()).data() == b"final-message"

    run(tmp_path, body)


def test_individual_acknowledge(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        shared = ConsumerType.Shared
        consumer = await client.subscribe("individual", "sub", consumer_type=shared)
        producer = await client.create_producer("individual")
        await send_five(producer)
        msgs = [await consumer.receive() for _ in range(5)]
        for i in (0, 2, 4):
            await consumer.acknowledge(msgs[i])
        await consumer.close()

        consumer = await client.subscribe("individual", "sub", consumer_type=shared)
        assert (await consumer.receive()).data() == b"msg-1"
        assert (await consumer.receive()).data() == b"msg-3"

    run(tmp_path, body)


def test_negative_acknowledge_redelivers(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        consumer = await client.subscribe(
            "nack",
            "sub",
            consumer_type=ConsumerType.Shared,
            negative_ack_redelivery_delay_ms=100,
        )
        producer = await client.create_producer("nack")
        await send_five(producer)
        msgs = [await consumer.receive() for _ in range(5)]
        await consumer.acknowledge(msgs[1])
        await consumer.acknowledge(msgs[3])
        for i in (0, 2, 4):
            await consumer.negative_acknowledge(msgs[i])
        # receive waits for the redelivery delay itself (upstream sleeps 0.2 s first).
        again = sorted([(await consumer.receive()).data() for _ in range(3)])
        assert again == [b"msg-0", b"msg-2", b"msg-4"]
        await consumer.close()

    run(tmp_path, body)


def test_multi_topic_and_pattern_consumers(tmp_path: Path) -> None:
    topics = ["multi-topic-1", "multi-topic-2"]

    async def body(client: Client) -> None:
        producers = [await client.create_producer(t) for t in topics]
        consumer = await client.subscribe(topics, "multi-sub")
        await producers[0].send(b"message-from-topic-1")
        await producers[1].send(b"message-from-topic-2")

        async def receive_both(c: Consumer) -> None:
            got = set()
            for _ in range(2):
                msg = await c.receive()
                got.add(msg.data())
                await c.acknowledge(msg.message_id())
            assert got == {b"message-from-topic-1", b"message-from-topic-2"}

        await receive_both(consumer)
        await consumer.close()

        consumer = await client.subscribe(
            "public/default/multi-topic-.*",
            "multi-sub-2",
            is_pattern_topic=True,
            initial_position=InitialPosition.Earliest,
        )
        await receive_both(consumer)
        await consumer.close()

    run(tmp_path, body)


def test_get_last_message_id_follows_each_send(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        consumer = await client.subscribe("last-id", "sub", consumer_type=ConsumerType.Shared)
        producer = await client.create_producer("last-id")
        for i in range(5):
            await producer.send(f"msg-{i}".encode())
            last = await consumer.get_last_message_id()
            assert isinstance(last, MessageId)
            assert last.entry_id() == i
            await consumer.acknowledge(last)
        await consumer.close()

    run(tmp_path, body)


def test_dead_letter_policy_with_redeliver_unacknowledged(tmp_path: Path) -> None:
    topic, dlq_topic, limit, num = "dlq-src", "dlq-of-dlq-src", 5, 10

    async def body(client: Client) -> None:
        shared = ConsumerType.Shared
        dlq_consumer = await client.subscribe(dlq_topic, "my-sub", consumer_type=shared)
        consumer = await client.subscribe(
            topic,
            "my-sub",
            consumer_type=shared,
            dead_letter_policy=ConsumerDeadLetterPolicy(limit, dlq_topic, "init-sub"),
        )
        producer = await client.create_producer(topic)
        for i in range(num):
            await producer.send(b"hello-%d" % i)
        await producer.flush()

        # Every message is delivered 1 + limit times, redelivered after each round.
        for i in range(1, num * limit + num + 1):
            await consumer.receive()
            if i % num == 0:
                consumer.redeliver_unacknowledged_messages()
        # Then they are in the dead-letter topic, not here (negative checks).
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(consumer.receive(), 0.1)
        for i in range(num):
            msg = await dlq_consumer.receive()
            assert msg.data() == b"hello-%d" % i
            await dlq_consumer.acknowledge(msg)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(dlq_consumer.receive(), 0.1)
        await consumer.close()
        await dlq_consumer.close()

    run(tmp_path, body)


def test_unsubscribe_frees_the_subscription(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        consumer = await client.subscribe("unsubscribe", "sub")
        await consumer.unsubscribe()
        consumer = await client.subscribe("unsubscribe", "sub")  # Exclusive, yet allowed
        await consumer.close()

    run(tmp_path, body)


def test_seek_message_id_exclusive_and_inclusive(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer("seek-id")
        ids = await send_five(producer)
        e = InitialPosition.Earliest
        consumer = await client.subscribe("seek-id", "sub", initial_position=e)
        await consumer.seek(ids[2])
        assert (await consumer.receive()).data() == b"msg-3"
        await consumer.close()

        consumer = await client.subscribe(
            "seek-id", "sub", initial_position=e, start_message_id_inclusive=True
        )
        await consumer.seek(ids[2])
        assert (await consumer.receive()).data() == b"msg-2"
        await consumer.close()

    run(tmp_path, body)


def test_seek_timestamp(tmp_path: Path) -> None:
    # Publish times come from the client's clock; it jumps 5 s between the two groups, so the
    # seek time lies strictly between them (upstream relies on the wall clock ticking).
    shift = [0]

    def clock() -> int:
        return int(time.time() * 1000) + shift[0]

    async def body(client: Client) -> None:
        consumer = await client.subscribe(
            "seek-time", "sub", initial_position=InitialPosition.Earliest
        )
        producer = await client.create_producer("seek-time")
        for i in range(3):
            await producer.send(f"msg-{i}".encode())
        shift[0] = 5000
        seek_time = clock() - 2500
        for i in range(3, 5):
            await producer.send(f"msg-{i}".encode())
        for i in range(5):
            assert (await consumer.receive()).data() == f"msg-{i}".encode()
        await consumer.seek(seek_time)
        assert (await consumer.receive()).data() == b"msg-3"

    run(tmp_path, body, clock=clock)


# ---------------------------------------------------------------------- readers
def test_reader_simple(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        reader = await client.create_reader("reader-simple", MessageId.earliest)
        assert reader.is_connected()
        assert reader.topic() == NS + "reader-simple"
        producer = await client.create_producer("reader-simple")
        await producer.send(b"hello")
        assert (await reader.read_next()).data() == b"hello"
        with pytest.raises(asyncio.TimeoutError):  # nothing more (a negative check)
            await asyncio.wait_for(reader.read_next(), 0.3)
        await reader.close()
        assert not reader.is_connected()

    run(tmp_path, body)


def test_reader_at_latest_reads_what_comes_after(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer("reader-latest")
        for i in range(10):
            await producer.send(f"hello-{i}".encode())
        reader = await client.create_reader("reader-latest", MessageId.latest)
        for i in range(10, 20):
            await producer.send(f"hello-{i}".encode())
        for i in range(10, 20):
            assert (await reader.read_next()).data() == f"hello-{i}".encode()
        await reader.close()

    run(tmp_path, body)


def test_reader_on_a_specific_message(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer("reader-specific")
        ids = [await producer.send(f"hello-{i}".encode()) for i in range(10)]
        reader1 = await client.create_reader("reader-specific", MessageId.earliest)
        for i in range(5):
            assert (await reader1.read_next()).data() == f"hello-{i}".encode()
        reader2 = await client.create_reader("reader-specific", ids[4])
        for i in range(5, 10):
            assert (await reader2.read_next()).data() == f"hello-{i}".encode()
        await reader1.close()
        await reader2.close()

    run(tmp_path, body)


def test_reader_has_message_available(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer("reader-available")
        reader = await client.create_reader("reader-available", MessageId.latest)
        assert not await reader.has_message_available()
        for i in range(10):
            await producer.send(f"hello-{i}".encode())
        for _ in range(10):
            assert await reader.has_message_available()
            await reader.read_next()
        assert not await reader.has_message_available()
        await reader.close()

    run(tmp_path, body)


def test_reader_seek_exclusive_and_inclusive(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer("reader-seek")
        ids = [await producer.send(f"msg-{i}".encode()) for i in range(10)]
        reader = await client.create_reader(
            "reader-seek", MessageId.latest, start_message_id_inclusive=False
        )
        await reader.seek(ids[2])
        assert (await reader.read_next()).data() == b"msg-3"
        await reader.close()
        reader = await client.create_reader(
            "reader-seek", MessageId.latest, start_message_id_inclusive=True
        )
        await reader.seek(ids[2])
        assert (await reader.read_next()).data() == b"msg-2"
        await reader.close()

    run(tmp_path, body)


# ---------------------------------------------------------------------- schema
@pytest.mark.skipif(
    importlib.util.find_spec("filepulsar.schema") is None, reason="needs filepulsar.schema"
)
def test_avro_schema_record_round_trip(tmp_path: Path) -> None:
    schema_mod = importlib.import_module("filepulsar.schema")

    class ExampleRecord(schema_mod.Record):  # type: ignore[name-defined,misc]
        str_field = schema_mod.String()
        int_field = schema_mod.Integer()

    async def body(client: Client) -> None:
        avro = schema_mod.AvroSchema
        producer = await client.create_producer("schema", schema=avro(ExampleRecord))
        consumer = await client.subscribe("schema", "sub", schema=avro(ExampleRecord))
        await producer.send(ExampleRecord(str_field="test", int_field=42))
        value = (await consumer.receive()).value()
        assert isinstance(value, ExampleRecord)
        assert (value.str_field, value.int_field) == ("test", 42)

    run(tmp_path, body)


# ---------------------------------------------------------------------- the future helper
def test_set_future_leaves_a_cancelled_future_cancelled() -> None:
    async def body() -> None:
        fut = asyncio.get_running_loop().create_future()
        fut.cancel()
        _set_future(fut, Result.Ok, None)
        await asyncio.sleep(0)  # one loop turn: the helper's callback runs
        assert fut.cancelled()

    asyncio.run(body())


def test_set_future_leaves_a_resolved_future_as_it_was() -> None:
    async def body() -> None:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result("first")
        _set_future(fut, Result.Ok, "late")
        await asyncio.sleep(0)
        assert fut.result() == "first"

    asyncio.run(body())


def test_set_future_fails_with_the_result_code() -> None:
    async def body() -> None:
        fut = asyncio.get_running_loop().create_future()
        _set_future(fut, Result.ProducerFenced, None)
        with pytest.raises(PulsarException) as info:
            await fut
        assert info.value.error() is Result.ProducerFenced

    asyncio.run(body())


# ---------------------------------------------------------------------- our bridge's promises
def test_result_codes_are_pulsar_clients() -> None:
    # pulsar-client's Result names and values (its C++ enum), which error() returns.
    assert Result.Ok.value == 0
    assert Result.AlreadyClosed.value == 15
    assert Result.MessageTooBig.value == 28
    assert Result.TopicNotFound.value == 29
    assert Result.ProducerFenced.value == 43
    assert Result.Interrupted.value == 45
    assert len(Result) == 46


def test_pulsar_exception_reads_like_pulsar_clients() -> None:
    e = PulsarException(Result.TopicNotFound, "no such topic")
    assert isinstance(e, FilePulsarError)
    assert e.error() is Result.TopicNotFound
    assert str(e) == "29 TopicNotFound: no such topic"
    assert str(PulsarException(Result.Timeout)) == "3 Timeout"


def test_bad_arguments_raise_value_error(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        with pytest.raises(ValueError, match="Batching and chunking"):
            await client.create_producer("bad", chunking_enabled=True)
        with pytest.raises(ValueError, match="must be a string"):
            await client.subscribe(["a", "b"], "sub", is_pattern_topic=True)
        with pytest.raises(ValueError, match="start_message_id"):
            await client.create_reader("bad", "earliest")  # type: ignore[arg-type]
        consumer = await client.subscribe("bad", "sub")
        with pytest.raises(ValueError, match="invalid messageid type"):
            await consumer.seek("0:1")  # type: ignore[arg-type]
        # A wrongly typed argument the synchronous client checks: both kinds of except work.
        with pytest.raises(PulsarException) as info:
            await client.subscribe("bad", "sub2", receiver_queue_size="10")  # type: ignore[arg-type]
        assert isinstance(info.value, ValueError)
        assert info.value.error() is Result.InvalidConfiguration

    run(tmp_path, body)


def test_a_message_taken_by_a_cancelled_receive_goes_to_the_next_receive(
    tmp_path: Path,
) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer("cancel", batching_enabled=False)
        consumer = await client.subscribe(
            "cancel", "sub", initial_position=InitialPosition.Earliest
        )
        for i in range(3):
            await producer.send(f"m-{i}".encode())
        # Another thread holds the synchronous consumer's lock: the receive's look starts on
        # a worker and waits there, so cancelling the receive finds it running.
        lock = consumer._consumer._lock
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with lock:
                held.set()
                release.wait()

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait()
        try:
            task = asyncio.create_task(consumer.receive())
            done, _ = await asyncio.wait({task}, timeout=0.2)
            assert not done
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            release.set()  # the orphaned look now takes m-0
            holder.join()
        got = [(await consumer.receive()).data() for _ in range(3)]
        assert got == [b"m-0", b"m-1", b"m-2"]
        with pytest.raises(asyncio.TimeoutError):  # no duplicate (a negative check)
            await asyncio.wait_for(consumer.receive(), 0.2)

    run(tmp_path, body)


def test_receives_cancelled_at_random_points_lose_and_repeat_nothing(tmp_path: Path) -> None:
    n = 200

    async def body(client: Client) -> None:
        producer = await client.create_producer("cancel-many")
        consumer = await client.subscribe(
            "cancel-many", "sub", initial_position=InitialPosition.Earliest
        )
        await asyncio.gather(*(producer.send(b"%d" % i) for i in range(n)))
        got: list[int] = []
        timeouts = [0.0, 0.0001, 0.0003, 0.001, 0.003]
        k = 0
        while len(got) < n:
            k += 1
            try:
                msg = await asyncio.wait_for(consumer.receive(), timeouts[k % len(timeouts)])
            except TimeoutError:
                continue
            got.append(int(msg.data()))
        assert got == list(range(n))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(consumer.receive(), 0.2)

    run(tmp_path, body)


def test_close_wakes_a_waiting_receive_and_read(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        consumer = await client.subscribe("wake", "sub")
        reader = await client.create_reader("wake", MessageId.latest)
        receiving = asyncio.create_task(consumer.receive())
        reading = asyncio.create_task(reader.read_next())
        done, _ = await asyncio.wait({receiving, reading}, timeout=0.2)
        assert not done  # both wait: the topic is empty
        await consumer.close()
        await reader.close()
        for task in (receiving, reading):
            with pytest.raises(PulsarException) as info:
                await task
            assert info.value.error() is Result.AlreadyClosed
        for again in (consumer.close, reader.close, consumer.receive, reader.read_next):
            with pytest.raises(PulsarException) as info:
                await again()
            assert info.value.error() is Result.AlreadyClosed

    run(tmp_path, body)


def test_client_close_wakes_waiting_receives(tmp_path: Path) -> None:
    async def main() -> None:
        client = Client(str(tmp_path))
        consumer = await client.subscribe("wake-client", "sub")
        receiving = asyncio.create_task(consumer.receive())
        done, _ = await asyncio.wait({receiving}, timeout=0.2)
        assert not done
        await client.close()
        with pytest.raises(PulsarException) as info:
            await asyncio.wait_for(receiving, WAIT_S)
        assert info.value.error() is Result.AlreadyClosed
        with pytest.raises(PulsarException) as info:
            await client.subscribe("wake-client", "sub2")
        assert info.value.error() is Result.AlreadyClosed

    asyncio.run(main())


def test_many_waiting_consumers_do_not_starve_the_others(tmp_path: Path) -> None:
    # Twenty consumers wait on empty topics with a pool of two workers; subscribing, sending
    # and receiving elsewhere still goes through (each wait holds no worker).
    async def body(client: Client) -> None:
        idle = [await client.subscribe(f"idle-{i}", "sub") for i in range(20)]
        waiting = [asyncio.create_task(c.receive()) for c in idle]
        done, _ = await asyncio.wait(waiting, timeout=0.2)
        assert not done
        consumer = await client.subscribe("busy", "sub")
        producer = await client.create_producer("busy")
        await producer.send(b"through")
        assert (await asyncio.wait_for(consumer.receive(), 10)).data() == b"through"
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)

    run(tmp_path, body, max_blocking_threads=2)


def test_redeliver_then_receive_brings_the_unacknowledged_back_in_order(
    tmp_path: Path,
) -> None:
    async def body(client: Client) -> None:
        producer = await client.create_producer("redeliver")
        consumer = await client.subscribe(
            "redeliver", "sub", initial_position=InitialPosition.Earliest
        )
        await asyncio.gather(*(producer.send(b"%d" % i) for i in range(5)))
        first = [(await consumer.receive()).data() for _ in range(5)]
        consumer.redeliver_unacknowledged_messages()
        again = [(await consumer.receive()).data() for _ in range(5)]
        assert first == again == [b"%d" % i for i in range(5)]

    run(tmp_path, body)


# ---------------------------------------------------------------------- a defect it surfaced
@pytest.mark.parametrize("batching_type", ["Default", "KeyBased"])
def test_idle_batching_send_async_with_metadata_is_stored_after_the_publish_delay(
    tmp_path: Path, batching_type: str
) -> None:
    """The synchronous producer's send_async with properties or keys on an idle batching
    producer opened a batch without waking the I/O thread: it was written when the producer
    next renewed its lease (a third of producer_lease_ms; here 20 min) instead of after
    batching_max_publish_delay_ms. The asyncio send of upstream's keyed-message test waited
    10 s for it."""
    from filepulsar.connector.client import BatchingType
    from filepulsar.connector.client import Client as SyncClient
    from filepulsar.storage import set_topic_policies
    from filepulsar.storage.topics import create_topic

    client = SyncClient(str(tmp_path))
    create_topic(client.store, "idle-meta")
    set_topic_policies(client.store, "idle-meta", producer_lease_ms=3_600_000)
    producer = client.create_producer(
        "idle-meta",
        batching_enabled=True,
        batching_max_publish_delay_ms=10,
        batching_type=BatchingType[batching_type],
    )
    producer.send(b"first", properties={"k": "v"})  # flushes; the producer is idle after it
    done = threading.Event()
    got: list[Any] = []

    def callback(res: Result, mid: MessageId | None) -> None:
        got.append(res)
        done.set()

    producer.send_async(b"idle", callback, properties={"k": "v"}, partition_key="key")
    assert done.wait(WAIT_S), "send_async with metadata was not stored without flush()"
    assert got == [Result.Ok]
    client.close()
