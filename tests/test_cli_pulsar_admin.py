"""pulsar-admin's verbs as its users type them, and what they print: in-process ``main()`` on
real files (issue #30, USER-REPORT-2 §6)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from filepulsar import Client, InitialPosition, NotAllowedError
from filepulsar.admin import Admin
from filepulsar.jobs.cli import main

pytestmark = pytest.mark.unit


def _cli(root: str, capsys: Any, *args: str) -> tuple[int, str, str]:
    code = main(["--url", root, *args])
    out, err = capsys.readouterr()
    return code, out, err


def _ok(root: str, capsys: Any, *args: str) -> str:
    code, out, err = _cli(root, capsys, *args)
    assert code == 0 and err == "", (args, err)
    return out


def _send(root: str, topic: str, values: list[str], key: str | None = None) -> None:
    with Client(root) as c:
        p = c.create_producer(topic, batching_enabled=False)
        for v in values:
            p.send(v.encode(), partition_key=key)
        p.close()


def test_topics_compact_and_compaction_status(tmp_path: Any, capsys: Any) -> None:
    root = str(tmp_path)
    _send(root, "prices", ["1", "2", "3"], key="k")
    name = "persistent://public/default/prices"
    assert (
        _ok(root, capsys, "topics", "compaction-status", "prices")
        == f"Compaction has not been run for {name}\n"
    )
    assert _ok(root, capsys, "topics", "compact", "prices") == (
        f"Topic compaction requested for {name}\n"
    )
    assert _ok(root, capsys, "topics", "compaction-status", "prices", "-w") == (
        "Compaction was a success\n"
    )
    status = json.loads(
        _ok(root, capsys, "topics", "compaction-status", "prices", "--output", "json")
    )
    assert status["status"] == "SUCCESS"


def test_schemas_upload_get_delete(tmp_path: Any, capsys: Any) -> None:
    root = str(tmp_path / "root")
    _ok(root, capsys, "topics", "create", "users")
    avro = {
        "type": "record",
        "name": "User",
        "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}],
    }
    f = tmp_path / "user-schema.json"
    f.write_text(json.dumps({"type": "AVRO", "schema": json.dumps(avro), "properties": {}}))
    out = _ok(root, capsys, "schemas", "upload", "users", "-f", str(f))
    assert out == "uploaded a AVRO schema to users: version 0\n"
    got = json.loads(_ok(root, capsys, "schemas", "get", "users"))
    assert got["type"] == "AVRO" and json.loads(got["schema"]) == avro and got["version"] == 0
    assert [
        v["version"] for v in json.loads(_ok(root, capsys, "schemas", "get", "users", "-a"))
    ] == [0]
    _ok(root, capsys, "schemas", "delete", "users", "-f")
    code, out, err = _cli(root, capsys, "schemas", "get", "users")
    assert code == 1 and out == "" and "has no schema" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "x"}')
    code, _, err = _cli(root, capsys, "schemas", "upload", "users", "-f", str(bad))
    assert code == 2 and err.count("\n") == 1 and '"type": "AVRO"' in err


def test_delete_partitioned_topic(tmp_path: Any, capsys: Any) -> None:
    root = str(tmp_path)
    _ok(root, capsys, "topics", "create-partitioned-topic", "orders", "-p", "2")
    _ok(root, capsys, "topics", "create", "single")
    _send(root, "orders", ["a", "b", "c"])
    code, _, err = _cli(root, capsys, "topics", "delete-partitioned-topic", "single")
    assert code == 1 and "partitioned topic persistent://public/default/single does not" in err
    assert "topics delete" in err
    _ok(root, capsys, "topics", "delete-partitioned-topic", "orders", "-f")
    assert (
        _ok(root, capsys, "topics", "list") == "persistent://public/default/single\tpartitions=0\n"
    )


def test_topics_delete_refuses_a_partitioned_topic(tmp_path: Any, capsys: Any) -> None:
    """pulsar-admin's ``topics delete`` on a partitioned topic fails (HTTP 409, "please call
    delete-partitioned-topic") and deletes nothing; the Python admin API says the same."""
    root = str(tmp_path)
    _ok(root, capsys, "topics", "create-partitioned-topic", "orders", "-p", "2")
    _send(root, "orders", ["a", "b"])
    code, out, err = _cli(root, capsys, "topics", "delete", "orders", "-f")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "persistent://public/default/orders is a partitioned topic" in err
    assert "please call delete-partitioned-topic" in err
    listed = _ok(root, capsys, "topics", "list")
    assert listed == "persistent://public/default/orders\tpartitions=2\n"
    stats = json.loads(_ok(root, capsys, "topics", "partitioned-stats", "orders"))
    assert stats["msgInCounter"] == 2
    with pytest.raises(NotAllowedError, match="please call delete-partitioned-topic"):
        Admin(root).topics().delete("orders", force=True)
    _ok(root, capsys, "topics", "delete-partitioned-topic", "orders", "-f")
    _ok(root, capsys, "topics", "create", "single")
    _ok(root, capsys, "topics", "delete", "single")
    assert _ok(root, capsys, "topics", "list") == ""


def test_tenants_and_namespaces_on_a_fresh_root(tmp_path: Any, capsys: Any) -> None:
    """A fresh Pulsar cluster lists the tenants ``public`` and ``pulsar``."""
    root = str(tmp_path)
    assert _ok(root, capsys, "tenants", "list") == "public\npulsar\n"
    assert _ok(root, capsys, "namespaces", "list", "public") == "public/default\n"
    _ok(root, capsys, "tenants", "create", "acme")
    assert _ok(root, capsys, "tenants", "list") == "acme\npublic\npulsar\n"
    code, _, err = _cli(root, capsys, "tenants", "create", "public")
    assert code == 1 and "tenant public already exists" in err


def test_namespace_policies_print_pulsar_admins_json(tmp_path: Any, capsys: Any) -> None:
    root = str(tmp_path)
    ns = "public/default"
    out = _ok(root, capsys, "namespaces", "set-retention", ns, "--time", "3d", "--size", "10G")
    assert out == "set retention of public/default: 4320 minutes, 10240 MB\n"
    out = _ok(root, capsys, "namespaces", "set-retention", ns, "-t", "-1", "-s", "-1")
    assert out == "set retention of public/default: unlimited time, unlimited size\n"
    _ok(root, capsys, "namespaces", "set-message-ttl", ns, "--ttl", "1h")
    _ok(root, capsys, "namespaces", "set-deduplication", ns, "--enable")
    _ok(root, capsys, "namespaces", "set-delayed-delivery", ns, "-e", "-t", "2s")
    pol = json.loads(_ok(root, capsys, "namespaces", "policies", ns))
    assert pol["retention_policies"] == {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    assert pol["message_ttl_in_seconds"] == 3600 and pol["deduplicationEnabled"] is True
    assert pol["delayed_delivery_policies"]["tickTime"] == 2000
    assert pol["delayed_delivery_policies"]["active"] is True
    assert pol["deleted"] is False and "autoTopicCreationOverride" not in pol
    code, out, err = _cli(root, capsys, "namespaces", "policies", "acme/nope")
    assert (code, out, err) == (1, "", "error: namespace acme/nope does not exist\n")


def test_skip_on_a_partitioned_topic_is_refused_as_pulsar_does(tmp_path: Any, capsys: Any) -> None:
    root = str(tmp_path)
    _ok(root, capsys, "topics", "create-partitioned-topic", "orders", "-p", "2")
    _send(root, "orders", [str(i) for i in range(6)])
    _ok(root, capsys, "topics", "create-subscription", "orders", "-s", "audit", "-m", "earliest")
    code, out, err = _cli(root, capsys, "topics", "skip", "orders", "-s", "audit", "-n", "1")
    assert code == 1 and out == ""
    assert err == (
        "error: skip messages on a partitioned topic is not allowed (persistent://public/default"
        "/orders has 2 partitions): skip on one partition, persistent://public/default/orders-"
        "partition-0 to persistent://public/default/orders-partition-1\n"
    )
    got = _ok(root, capsys, "topics", "skip", "orders-partition-0", "-s", "audit", "-n", "1")
    assert got.startswith("skipped 1 entries")
    stats = json.loads(_ok(root, capsys, "topics", "stats", "orders"))
    assert stats["subscriptions"]["audit"]["msgBacklog"] == 5


def test_topic_stats_carry_rates_sizes_and_times(tmp_path: Any, capsys: Any) -> None:
    """The fields pulsar-admin users graph: rates in, backlog size, the earliest publish time in
    the backlog and (PIP-431) the last publish time."""
    root = str(tmp_path)
    with Client(root) as c:
        consumer = c.subscribe("metrics", "dash", initial_position=InitialPosition.Earliest)
        _send(root, "metrics", [f"m{i}" for i in range(10)])
        first = consumer.receive(5000)
        consumer.close()
    stats = json.loads(_ok(root, capsys, "topics", "stats", "metrics"))
    assert stats["msgRateIn"] > 0 and stats["msgThroughputIn"] > stats["msgRateIn"]
    sub = stats["subscriptions"]["dash"]
    assert sub["msgBacklog"] == 10 and sub["backlogSize"] > 0
    assert stats["backlogSize"] == sub["backlogSize"]
    assert sub["earliestMsgPublishTimeInBacklog"] == first.publish_timestamp()
    assert stats["earliestMsgPublishTimeInBacklogs"] == first.publish_timestamp()
    assert stats["lastPublishTimeStamp"] >= first.publish_timestamp()
    _ok(root, capsys, "topics", "clear-backlog", "metrics", "-s", "dash")
    stats = json.loads(_ok(root, capsys, "topics", "stats", "metrics"))
    assert stats["backlogSize"] == 0 and stats["earliestMsgPublishTimeInBacklogs"] == 0
    assert stats["subscriptions"]["dash"]["earliestMsgPublishTimeInBacklog"] == 0


def test_topic_stats_carry_the_creation_time(tmp_path: Any, capsys: Any) -> None:
    """PIP-431's ``topicCreationTimeStamp``: when the topic was created (epoch ms), unchanged by
    what is published later; for a partitioned topic its partitions' (created together)."""
    root = str(tmp_path / "root")
    before = int(time.time() * 1000)
    _ok(root, capsys, "topics", "create", "audit-log")
    _ok(root, capsys, "topics", "create-partitioned-topic", "orders", "-p", "2")
    after = int(time.time() * 1000)
    created = json.loads(_ok(root, capsys, "topics", "stats", "audit-log"))
    assert before <= created["topicCreationTimeStamp"] <= after
    _send(root, "audit-log", ["a", "b"])
    stats = json.loads(_ok(root, capsys, "topics", "stats", "audit-log"))
    assert stats["topicCreationTimeStamp"] == created["topicCreationTimeStamp"]
    assert stats["lastPublishTimeStamp"] >= stats["topicCreationTimeStamp"]
    per = json.loads(_ok(root, capsys, "topics", "partitioned-stats", "orders", "--per-partition"))
    times = [p["topicCreationTimeStamp"] for p in per["partitions"].values()]
    assert len(times) == 2 and all(before <= t <= after for t in times)
    assert per["topicCreationTimeStamp"] == min(times)
    assert json.loads(_ok(root, capsys, "topics", "stats", "orders"))[
        "topicCreationTimeStamp"
    ] == min(times)


def test_a_topic_written_before_creation_times_reports_null(tmp_path: Any, capsys: Any) -> None:
    """A topic whose manifest predates the recorded creation time (the golden format-2 topic)
    reports ``topicCreationTimeStamp: null``, also after new messages: no time is made up."""
    root = tmp_path / "root"
    shutil.copytree(Path(__file__).parent / "golden" / "v2topic", root)
    stats = json.loads(_ok(str(root), capsys, "topics", "stats", "golden-v2"))
    assert stats["topicCreationTimeStamp"] is None and stats["msgInCounter"] > 0
    _send(str(root), "golden-v2", ["new"])
    stats = json.loads(_ok(str(root), capsys, "topics", "stats", "golden-v2"))
    assert stats["topicCreationTimeStamp"] is None


def test_consume_between_start_and_end_timestamps(tmp_path: Any, capsys: Any) -> None:
    """PIP-435: ``consume --start-timestamp`` moves the subscription to the first message
    published then; ``--end-timestamp`` stops before the first one published after it (it
    stays in the backlog)."""
    from filepulsar.dispatch.clock import ManualClock
    from filepulsar.storage import Producer, open_blob_store

    root = str(tmp_path)
    clock = ManualClock(1_700_000_000_000)
    with Producer(open_blob_store(root), "ticks", batching_enabled=False, clock=clock.now_ms) as p:
        for i in range(10):
            p.send(f"t{i}".encode())  # published at 1_700_000_000_000 + i * 1000
            clock.advance(1000)
    _ok(root, capsys, "topics", "create-subscription", "ticks", "-s", "audit", "-m", "latest")
    start, end = 1_700_000_003_000, 1_700_000_006_000
    out = _ok(
        root,
        capsys,
        *("consume", "ticks", "-s", "audit", "-n", "0"),
        *("--start-timestamp", str(start), "--end-timestamp", str(end)),
    )
    assert out == "t3\nt4\nt5\nt6\n"
    backlog = json.loads(_ok(root, capsys, "topics", "stats", "ticks"))["subscriptions"]["audit"]
    assert backlog["msgBacklog"] == 3  # t7..t9 were not acknowledged
    code, _, err = _cli(root, capsys, "consume", "ticks", "-s", "audit", "--end-timestamp", "x")
    assert code == 2 and "--end-timestamp must be an integer, got 'x'" in err


def test_backlog_size_over_many_ledgers(tmp_path: Any, capsys: Any) -> None:
    """``backlogSize`` counts whole ledgers after the cursor from the manifest and the cursor's
    own ledger by fragment: from the start it is the whole storage size; after a skip it
    shrinks by what was skipped."""
    from filepulsar.storage import open_blob_store, set_namespace_policies

    root = str(tmp_path)
    set_namespace_policies(open_blob_store(root), "public", "default", ledger_max_entries=2)
    _send(root, "many", [f"m{i}" for i in range(7)])  # ledgers of 2 entries each
    _ok(root, capsys, "topics", "create-subscription", "many", "-s", "s", "-m", "earliest")
    stats = json.loads(_ok(root, capsys, "topics", "stats", "many"))
    assert stats["backlogSize"] == stats["storageSize"] > 0
    _ok(root, capsys, "topics", "skip", "many", "-s", "s", "-n", "3")
    after = json.loads(_ok(root, capsys, "topics", "stats", "many"))
    assert after["subscriptions"]["s"]["msgBacklog"] == 4
    assert after["backlogSize"] == pytest.approx(stats["backlogSize"] * 4 / 7, rel=0.05)
    assert after["earliestMsgPublishTimeInBacklogs"] >= stats["earliestMsgPublishTimeInBacklogs"]
