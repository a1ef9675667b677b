"""Pulsar 4.1 / 5.0 policies as their users meet them (issue #30): PIP-315's max delivery
delay refused at send with pulsar-client's ``NotAllowedError``, and PIP-422's ``remove-*``
topic-policy verbs letting the namespace's policy apply again."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

import filepulsar as pulsar
from filepulsar.admin import Admin
from filepulsar.jobs.cli import main

pytestmark = pytest.mark.unit


def _ok(root: str, capsys: Any, *args: str) -> str:
    code = main(["--url", root, *args])
    out, err = capsys.readouterr()
    assert code == 0 and err == "", (args, err)
    return out


def test_a_delay_beyond_the_max_is_refused_at_send(tmp_path: Any, capsys: Any) -> None:
    """PIP-315: ``set-delayed-delivery -md``; the broker answers a longer delay with
    NotAllowedError "Exceeds max allowed delivery delay of ... milliseconds"."""
    root = str(tmp_path)
    _ok(root, capsys, "namespaces", "set-delayed-delivery", "public/default", "-e", "-md", "10s")
    pol = json.loads(_ok(root, capsys, "namespaces", "policies", "public/default"))
    assert pol["delayed_delivery_policies"]["maxDeliveryDelayInMillis"] == 10_000
    client = pulsar.Client(root)
    producer = client.create_producer("reminders", batching_enabled=False)
    producer.send(b"soon", deliver_after=timedelta(seconds=5))
    with pytest.raises(
        pulsar.NotAllowedError, match="Exceeds max allowed delivery delay of 10000 milliseconds"
    ):
        producer.send(b"later", deliver_after=timedelta(minutes=1))
    with pytest.raises(pulsar.NotAllowedError, match="at most 10000 ms"):
        producer.send(b"later", deliver_at=int(producer_now_ms()) + 3_600_000)
    import pyarrow as pa

    far = producer_now_ms() + 3_600_000
    table = pa.table({"value": [b"a", b"b"], "deliver_at": pa.array([0, far], pa.int64())})
    with pytest.raises(pulsar.NotAllowedError, match="Exceeds max allowed delivery delay"):
        producer.send_table(table)  # the bulk path checks too; nothing is written
    producer.close()
    stats = Admin(root).topics().get_stats("reminders")
    assert stats["msgInCounter"] == 1  # only "soon"
    # A topic's own policy wins over its namespace's (here: a longer limit).
    _ok(root, capsys, "topicPolicies", "set-delayed-delivery", "reminders", "-e", "-md", "2m")
    producer = client.create_producer("reminders", batching_enabled=False)
    producer.send(b"later", deliver_after=timedelta(minutes=1))
    producer.close()
    client.close()


def test_send_async_hands_a_too_long_delay_to_its_callback(tmp_path: Any, capsys: Any) -> None:
    """pulsar-client's ``send_async`` does not raise for a delay beyond the max: the callback
    gets ``Result.NotAllowedError`` (and no message id); the messages around it are stored."""
    root = str(tmp_path)
    _ok(root, capsys, "namespaces", "set-delayed-delivery", "public/default", "-e", "-md", "10s")
    results: list[tuple[str, pulsar.Result, Any]] = []

    def on(name: str) -> Any:
        return lambda res, msg_id: results.append((name, res, msg_id))

    with pulsar.Client(root) as client:
        producer = client.create_producer("reminders", batching_enabled=False)
        producer.send_async(b"soon", on("soon"), deliver_after=timedelta(seconds=5))
        producer.send_async(b"later", on("later"), deliver_after=timedelta(minutes=1))
        producer.send_async(b"now", on("now"))
        producer.flush()
        with pytest.raises(pulsar.NotAllowedError, match="Exceeds max allowed delivery delay"):
            producer.send(b"later", deliver_after=timedelta(minutes=1))
        producer.close()
    by_name = {name: (res, msg_id) for name, res, msg_id in results}
    assert sorted(by_name) == ["later", "now", "soon"] and len(results) == 3
    assert by_name["later"] == (pulsar.Result.NotAllowedError, None)
    assert by_name["soon"][0] is pulsar.Result.Ok and by_name["now"][0] is pulsar.Result.Ok
    assert Admin(root).topics().get_stats("reminders")["msgInCounter"] == 2


def producer_now_ms() -> int:
    import time

    return int(time.time() * 1000)


def test_removing_a_topic_policy_lets_the_namespace_apply_again(tmp_path: Any, capsys: Any) -> None:
    """PIP-422: ``topicPolicies remove-*``; ``get-*`` prints null for a topic with no value
    of its own, ``-ap`` the value in force."""
    root = str(tmp_path)
    _ok(root, capsys, "topics", "create", "orders")
    _ok(root, capsys, "namespaces", "set-message-ttl", "public/default", "--ttl", "1h")
    assert _ok(root, capsys, "topicPolicies", "get-message-ttl", "orders") == "null\n"
    assert _ok(root, capsys, "topicPolicies", "get-message-ttl", "orders", "-ap") == "3600\n"
    _ok(root, capsys, "topicPolicies", "set-message-ttl", "orders", "-t", "10m")
    _ok(root, capsys, "topicPolicies", "set-retention", "orders", "-t", "1d", "-s", "-1")
    assert _ok(root, capsys, "topicPolicies", "get-message-ttl", "orders", "-ap") == "600\n"
    assert json.loads(_ok(root, capsys, "topicPolicies", "get-retention", "orders")) == {
        "retentionTimeInMinutes": 1440,
        "retentionSizeInMB": -1,
    }
    assert _ok(root, capsys, "topicPolicies", "remove-message-ttl", "orders") == (
        "removed the message-ttl of orders: its namespace's applies\n"
    )
    assert _ok(root, capsys, "topicPolicies", "get-message-ttl", "orders") == "null\n"
    assert _ok(root, capsys, "topicPolicies", "get-message-ttl", "orders", "-ap") == "3600\n"
    tp = Admin(root).topic_policies()
    assert tp.get_retention("orders") == {"retentionTimeInMinutes": 1440, "retentionSizeInMB": -1}
    tp.remove_retention("orders")
    assert tp.get_retention("orders") is None
    assert tp.get_retention("orders", applied=True) == {
        "retentionTimeInMinutes": 0,
        "retentionSizeInMB": 0,
    }
    code = main(["--url", root, "topicPolicies", "get-retention", "nope"])
    _, err = capsys.readouterr()
    assert code == 1 and err == "error: topic persistent://public/default/nope does not exist\n"
