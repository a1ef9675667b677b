"""The source tells the truth (issue #11): data loss, empty ranges, topics that change under a
query, partitions added, offsets that must mean what they say, batch re-runs.

Driver-side tests call the readers directly (as Spark does, no Spark needed); the Spark ones use
the session SparkSession, Trigger.AvailableNow and no sleeps.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from filepulsar.connector.source.batch import FilePulsarBatchReader
from filepulsar.connector.source.stream import FilePulsarStreamReader
from filepulsar.jobs.cli import main as cli
from filepulsar.storage import (
    ManagedLedger,
    Producer,
    TopicName,
    create_topic,
    delete_topic,
    open_blob_store,
    set_namespace_policies,
    set_topic_policies,
)
from filepulsar.storage.errors import (
    CorruptDataError,
    DataLossError,
    InvalidConfiguration,
    TopicNotFound,
)
from filepulsar.storage.retention import enforce_retention
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.topics import partitions_of, update_partitioned_topic
from tests.test_source import produce, run_stream

pytestmark = pytest.mark.spark

P = "persistent://public/default/"


def _stream(root: str, **opts: Any) -> FilePulsarStreamReader:
    return FilePulsarStreamReader({"path": root, **opts}, None)  # type: ignore[arg-type]


def _batch(root: str, **opts: Any) -> FilePulsarBatchReader:
    return FilePulsarBatchReader({"path": root, **opts}, None)  # type: ignore[arg-type]


def _values(reader: Any, parts: list[Any]) -> list[int]:
    out = []
    for p in parts:
        for b in reader.read(p):
            out.extend(int(v[1:]) for v in b.column("value").to_pylist())
    return sorted(out)


def _stream_read(r: FilePulsarStreamReader, start: dict[str, Any]) -> tuple[list[int], Any]:
    end = r.latestOffset(start, ReadAllAvailable())
    return _values(r, r.partitions(start, end)), end


# --------------------------------------------------------------------------- 1. data loss


def _trimmed_topic(root: str, name: str) -> tuple[Any, Any]:
    """A topic of 2-entry ledgers whose first ledgers retention deleted after the durable
    subscription 'etl' acknowledged 5 of its 10 messages."""
    store = open_blob_store(root)
    set_topic_policies(store, name, ledger_max_entries=2)
    create_topic(store, name)
    c = SubscriptionConsumer(store, TopicName.parse(name), "etl", initial_position="Earliest")
    with Producer(store, name, batching_enabled=False) as p:
        for i in range(10):
            p.send(b"v%d" % i)  # one commit each: ledgers of 2 entries
    for d in c.fetch(5):
        c.acknowledge([(d.position, -1, 1)])
    c.close()
    report = enforce_retention(store, name)
    return store, report


def test_retention_records_what_it_trimmed(tmp_path: Any) -> None:
    store, report = _trimmed_topic(str(tmp_path), "rec")
    assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1]
    m = ManagedLedger(store, TopicName.parse("rec")).state()
    assert m.trimmed_last == (1, 1)  # the last entry retention deleted


def test_batch_start_in_a_deleted_ledger_fails_or_skips(tmp_path: Any) -> None:
    root = str(tmp_path)
    _trimmed_topic(root, "gone")
    start = json.dumps({P + "gone": "0:1:-1"})  # message 1, deleted unread
    with pytest.raises(DataLossError, match=r"gone: messages after 0:0 up to 1:1 were deleted"):
        _batch(root, topic="gone", startingOffsets=start).partitions()
    r = _batch(root, topic="gone", startingOffsets=start, failOnDataLoss="false")
    assert _values(r, r.partitions()) == list(range(4, 10))
    r = _batch(root, topic="gone")  # earliest: what is left, no loss
    assert _values(r, r.partitions()) == list(range(4, 10))


# --------------------------------------------------------------------------- 2. empty ranges


def test_empty_ranges_are_empty_dataframes(spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    create_topic(open_blob_store(root), "void")
    produce(root, "some", 5)
    read = spark.read.format("filepulsar")
    assert read.option("topic", "void").load(root).collect() == []
    assert read.option("topic", "some").option("startingOffsets", "latest").load(root).count() == 0
    after_end = json.dumps({P + "some": "9:0:-1"})
    df = read.option("topic", "some").option("startingOffsets", after_end).load(root)
    assert df.count() == 0 and df.schema == read.option("topic", "some").load(root).schema
    rows, _ = run_stream(spark, root, str(tmp_path / "ck"), topic="void")
    assert rows == []


# --------------------------------------------------------------------------- 3. topics change


def test_pattern_topic_deleted_between_listing_and_reading(tmp_path: Any) -> None:
    root = str(tmp_path)
    store = open_blob_store(root)
    produce(root, "del-a", 3)
    produce(root, "del-b", 3, start=10)
    opts = {"topicsPattern": P + "del-.*", "startingOffsets": "earliest"}
    # Planned with del-b listed, then del-b is deleted before the tasks read it.
    planned = _batch(root, failOnDataLoss="false", **opts)
    parts = planned.partitions()
    strict = _batch(root, **opts)
    strict_parts = strict.partitions()
    delete_topic(store, "del-b")
    assert _values(planned, parts) == [0, 1, 2]
    with pytest.raises(DataLossError, match="del-b was deleted before this task read it"):
        _values(strict, strict_parts)
    # A stream that listed del-b before it was deleted.
    produce(root, "del-b", 3, start=20)
    r = _stream(root, failOnDataLoss="false", patternAutoDiscoveryPeriodMs="60000", **opts)
    s0 = r.initialOffset()
    delete_topic(store, "del-b")
    got, e = _stream_read(r, s0)
    assert got == [0, 1, 2] and P + "del-b" not in e
    strict_stream = _stream(root, patternAutoDiscoveryPeriodMs="60000", **opts)
    produce(root, "del-b", 1, start=30)
    s0 = strict_stream.initialOffset()
    delete_topic(store, "del-b")
    with pytest.raises(DataLossError, match="del-b was deleted"):
        _stream_read(strict_stream, s0)


def test_topic_recreated_between_runs_is_data_loss_then_read_from_its_start(
    tmp_path: Any,
) -> None:
    root = str(tmp_path)
    store = open_blob_store(root)
    produce(root, "again", 30, batching_enabled=False)
    ckpt = _stream(root, topic="again", startingOffsets="earliest").initialOffset()
    got, ckpt = _stream_read(_stream(root, topic="again"), ckpt)
    assert got == list(range(30))
    delete_topic(store, "again")
    produce(root, "again", 3, start=100, batching_enabled=False)  # ledger ids restart at 0
    with pytest.raises(DataLossError, match="again was deleted and created again"):
        _stream_read(_stream(root, topic="again"), ckpt)
    got, _ = _stream_read(_stream(root, topic="again", failOnDataLoss="false"), ckpt)
    assert got == [100, 101, 102]


def test_topic_recreated_mid_run_is_not_read_through_a_stale_manifest(tmp_path: Any) -> None:
    root = str(tmp_path)
    store = open_blob_store(root)
    create_topic(store, "mid")
    produce(root, "mid", 4, batching_enabled=False)
    r = _stream(
        root,
        topic="mid",
        startingOffsets="earliest",
        failOnDataLoss="false",
        patternAutoDiscoveryPeriodMs="0",
    )
    got, s1 = _stream_read(r, r.initialOffset())
    assert got == [0, 1, 2, 3]
    # The same commands again: the new topic reaches exactly the old manifest version.
    delete_topic(store, "mid")
    create_topic(store, "mid")
    produce(root, "mid", 4, start=50, batching_enabled=False)
    got, _ = _stream_read(r, s1)
    assert got == [50, 51, 52, 53]


# --------------------------------------------------------------------------- 4. partitions added


def test_update_partitioned_topic_storage_and_cli(tmp_path: Any, capsys: Any) -> None:
    root = str(tmp_path)
    store = open_blob_store(root)
    create_topic(store, "grow", partitions=2)
    assert update_partitioned_topic(store, "grow", 3) == (2, 3)
    assert partitions_of(store, "grow") == 3
    assert ManagedLedger(store, TopicName.parse("grow").partition(2)).state().incarnation
    with pytest.raises(InvalidConfiguration, match=r"from 4 to 10000.*only be added"):
        update_partitioned_topic(store, "grow", 2)
    create_topic(store, "flat")
    with pytest.raises(InvalidConfiguration, match="not partitioned"):
        update_partitioned_topic(store, "flat", 4)
    assert cli(["--root", root, "topics", "update-partitioned-topic", "grow", "-p", "5"]) == 0
    assert "3 -> 5 partitions" in capsys.readouterr().out
    assert cli(["--root", root, "topics", "update-partitioned-topic", "grow", "-p", "5"]) == 2
    assert "only be added" in capsys.readouterr().err


def test_running_topic_query_reads_added_partitions_from_their_start(tmp_path: Any) -> None:
    root = str(tmp_path)
    store = open_blob_store(root)
    create_topic(store, "more", partitions=2)
    produce(root, "more", 10)
    r = _stream(root, topic="more", startingOffsets="earliest", patternAutoDiscoveryPeriodMs="0")
    got, s1 = _stream_read(r, r.initialOffset())
    assert got == list(range(10))
    update_partitioned_topic(store, "more", 3)
    produce(root, P + "more-partition-2", 4, start=100)
    s2 = r.latestOffset(s1, ReadAllAvailable())  # joins at its start
    assert s2[P + "more-partition-2"][:3] == [-1, -1, -1]
    got, _ = _stream_read(r, s2)
    assert got == [100, 101, 102, 103]


# --------------------------------------------------------------------------- 5. offsets


def test_json_offsets_name_every_partition_and_take_kafka_sentinels(tmp_path: Any) -> None:
    root = str(tmp_path)
    create_topic(open_blob_store(root), "js", partitions=2)
    produce(root, "js", 20)
    some = json.dumps({P + "js-partition-0": -2})
    with pytest.raises(InvalidConfiguration, match=r"name every partition.*js-partition-1"):
        _batch(root, topic="js", startingOffsets=some).partitions()
    with pytest.raises(InvalidConfiguration, match=r"name every partition.*js-partition-1"):
        _stream(root, topic="js", startingOffsets=some).initialOffset()
    both = json.dumps({P + "js-partition-0": -2, P + "js-partition-1": -1})
    r = _batch(root, topic="js", startingOffsets=both)
    mine = _values(r, r.partitions())
    p0 = _values(*(lambda b: (b, b.partitions()))(_batch(root, topic=P + "js-partition-0")))
    assert mine == p0 and 0 < len(mine) < 20
    with pytest.raises(InvalidConfiguration, match=r"earliest .-2., which is not allowed"):
        _batch(root, topic="js", endingOffsets=both.replace("-1", "-2")).partitions()


def test_starting_offsets_with_a_subscription_follow_one_rule(tmp_path: Any) -> None:
    root = str(tmp_path)
    produce(root, "rule", 10)
    # A new subscription is created where startingOffsets says.
    r = _stream(root, topic="rule", subscription="s1", startingOffsets="earliest")
    got, _ = _stream_read(r, r.initialOffset())
    r.stop()
    assert got == list(range(10))
    with pytest.raises(InvalidConfiguration, match="give one of them"):
        _stream(
            root,
            topic="rule",
            subscription="s2",
            startingOffsets="earliest",
            subscriptionInitialPosition="Latest",
        )


def test_checkpoint_of_other_topics_is_refused(tmp_path: Any) -> None:
    root = str(tmp_path)
    produce(root, "ck-a", 3)
    produce(root, "ck-b", 3)
    ckpt = _stream(root, topic="ck-a", startingOffsets="earliest").initialOffset()
    with pytest.raises(InvalidConfiguration, match=r"checkpoint's offsets are for.*ck-a.*ck-b"):
        _stream(root, topic="ck-b").latestOffset(ckpt, ReadAllAvailable())
    with pytest.raises(InvalidConfiguration, match="checkpoint's offsets"):
        _stream(root, topics="ck-a,ck-b").partitions(ckpt, ckpt)


def test_stream_on_a_topic_not_created_yet(tmp_path: Any) -> None:
    root = str(tmp_path)
    store = open_blob_store(root)
    create_topic(store, "orders")  # a store in use: it holds a topic
    # Auto-creation allowed (the default policy): the stream creates it, as a consumer would.
    assert _stream(root, topic="auto").initialOffset() == {
        P + "auto": [-1, -1, -1, ManagedLedger(store, TopicName.parse("auto")).state().incarnation]
    }
    set_namespace_policies(store, "public", "strict", allow_auto_topic_creation=False)
    t = "persistent://public/strict/later"
    with pytest.raises(TopicNotFound, match=rf"{t} does not exist under root .*{root}"):
        _stream(root, topic=t).initialOffset()
    r = _stream(root, topic=t, waitingForNonExistedTopic="true", patternAutoDiscoveryPeriodMs="0")
    s0 = r.initialOffset()
    assert s0 == {}
    create_topic(store, t)
    produce(root, t, 3)
    s1 = r.latestOffset(s0, ReadAllAvailable())  # joins at its start
    got, _ = _stream_read(r, s1)
    assert got == [0, 1, 2]


def test_a_stream_never_creates_the_first_topic_of_a_root(tmp_path: Any) -> None:
    """A mistyped root is an empty store: a stream refuses to make it one (it would wait for
    ever on a topic nobody writes), naming the root; nothing is written there."""
    real, typo = tmp_path / "lake", tmp_path / "laek"
    create_topic(open_blob_store(str(real)), "orders")
    with pytest.raises(TopicNotFound) as e:
        _stream(str(typo), topic="orders").initialOffset()
    message = str(e.value)
    assert "\n" not in message and str(typo) in message
    assert "holds no topics" in message and "waitingForNonExistedTopic" in message
    assert not typo.exists() or not any(typo.rglob("*"))
    # Topic names in a root that holds topics are still created on demand.
    assert _stream(str(real), topic="fresh").initialOffset()


# --------------------------------------------------------------------------- 6. batch re-runs


def test_rerun_batch_dataframe_reads_the_topic_as_it_is(spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    produce(root, "rerun", 10)
    df = spark.read.format("filepulsar").option("topic", "rerun").load(root)
    assert df.count() == 10
    produce(root, "rerun", 5, start=10)
    assert df.count() == 15
    assert sorted(int(r.value[1:]) for r in df.collect()) == list(range(15))


# --------------------------------------------------------------------------- partitioned.json


def test_partitioned_json_is_checked_and_framed(tmp_path: Any) -> None:
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    create_topic(store, "pj", partitions=2)
    f = root / "topics/persistent/public/default/pj/partitioned.json"
    assert f.read_bytes().splitlines()[1].startswith(b"crc32c=")
    for bad in (b'{"partitions": -3}', b'{"partitions": 10000000}'):
        f.write_bytes(bad)
        with pytest.raises(CorruptDataError, match=rf"{f}.*from 1 to 10000"):
            partitions_of(store, "pj")
    f.write_bytes(b'{"partitions": 2}')  # the older form still reads
    assert partitions_of(store, "pj") == 2
    good = b'{"partitions":2,"incarnation":"x"}\ncrc32c=00000000\n'
    f.write_bytes(good)
    with pytest.raises(CorruptDataError, match="fails its checksum"):
        partitions_of(store, "pj")
    f.unlink()  # lost: the partitions are still there
    with pytest.raises(CorruptDataError, match=r"is missing but partitions of .*pj exist"):
        Producer(store, "pj")
    assert not (root / "topics/persistent/public/default/pj/manifest").exists()
