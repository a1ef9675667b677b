"""A non-durable subscription's consumer whose unread messages retention deletes (issue #31,
defect 5): its cursor holds back no retention (as in Pulsar), so it goes on at the first
message that remains, but never silently: each skip is logged once with its range and
counted (``SubscriptionConsumer.skipped_by_retention``), as a reader's are. What it had been
handed and retention then deleted is dropped from its cursor (nothing to redeliver)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from filepulsar.storage import Producer, TopicName, set_namespace_policies
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.ledger import Position
from filepulsar.storage.retention import enforce_retention
from filepulsar.storage.subscription import SubscriptionConsumer

pytestmark = pytest.mark.unit

NAME = "persistent://public/default/nd"
TOPIC = TopicName.parse(NAME)
TYPES = ["Exclusive", "Failover", "Shared", "Key_Shared"]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _topic(root: str, n: int = 11) -> None:
    store = open_blob_store(root)
    set_namespace_policies(store, "public", "default", ledger_max_entries=2)
    with Producer(store, NAME, batching_enabled=False) as p:
        for i in range(n):
            p.send(b"%d" % i)


def _consumer(root: str, sub_type: str = "Exclusive") -> SubscriptionConsumer:
    """A non-durable consumer at the start of a fresh topic of 11 messages in 2-entry ledgers."""
    _topic(root)
    return SubscriptionConsumer(
        open_blob_store(root),
        TOPIC,
        "nd",
        sub_type=sub_type,
        durable=False,
        initial_position="Earliest",
    )


def _values(c: SubscriptionConsumer, n: int) -> list[bytes]:
    return [d.entry.stored(["value"]).column(0)[0].as_py() for d in c.fetch(n)]


@pytest.mark.parametrize("sub_type", TYPES)
def test_a_non_durable_consumer_counts_and_logs_what_retention_deleted_under_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, sub_type: str
) -> None:
    """Eleven messages in ledgers of two; a non-durable consumer gets and acknowledges the
    first three, then a real retention run deletes the closed ledgers 0-4: the next fetch
    gives message 10, the seven after 1:0 up to 4:1 count as skipped, said once."""
    root = str(tmp_path)
    c = _consumer(root, sub_type)
    store = open_blob_store(root)
    got = c.fetch(3)
    assert [(d.entry.ledger_id, d.entry.entry_id) for d in got] == [(0, 0), (0, 1), (1, 0)]
    c.acknowledge([(d.position, -1, 1) for d in got])
    assert c.skipped_by_retention == 0
    report = enforce_retention(store, NAME)
    assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1, 2, 3, 4]
    caplog.set_level(logging.WARNING, logger="filepulsar")
    assert _values(c, 10) == [b"10"]
    assert c.skipped_by_retention == 7
    (warning,) = _warnings(caplog)
    assert "non-durable subscription 'nd'" in warning and str(TOPIC) in warning
    assert "retention deleted 7 messages it had not read" in warning
    assert "after 1:0 up to 4:1" in warning and warning.startswith(str(c.retention_warning))
    with Producer(store, NAME, batching_enabled=False) as p:
        p.send(b"11")
    assert _values(c, 10) == [b"11"]
    assert c.skipped_by_retention == 7 and len(_warnings(caplog)) == 1
    assert c.state().mark_delete >= (4, 1)  # the cursor moved past what is gone
    c.close()


@pytest.mark.parametrize("sub_type", ["Shared", "Key_Shared"])
def test_handed_out_then_deleted_is_not_redelivered_and_not_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, sub_type: str
) -> None:
    """Entries handed out, negatively acknowledged (due again at once) and then deleted by
    retention cannot be delivered again: the consumer drops them (they are not 'unread') and
    reads on; only the never-delivered ones count."""
    root = str(tmp_path)
    c = _consumer(root, sub_type)
    store = open_blob_store(root)
    got = c.fetch(3)
    assert len(got) == 3
    c.negative_acknowledge([d.position for d in got], delay_ms=0)
    enforce_retention(store, NAME)
    caplog.set_level(logging.WARNING, logger="filepulsar")
    assert _values(c, 10) == [b"10"]
    assert c.skipped_by_retention == 7
    assert len(_warnings(caplog)) == 1
    c.close()


def test_a_durable_subscription_holds_retention_back_and_counts_nothing(tmp_path: Path) -> None:
    root = str(tmp_path)
    _topic(root)
    store = open_blob_store(root)
    c = SubscriptionConsumer(store, TOPIC, "d", durable=True, initial_position="Earliest")
    got = c.fetch(3)
    c.acknowledge([(d.position, -1, 1) for d in got])
    report = enforce_retention(store, NAME)
    assert [d.ledger_id for d in report.deleted_ledgers] == [0]
    assert _values(c, 1) == [b"3"] and c.skipped_by_retention == 0
    assert c.retention_warning is None
    c.close()


def test_a_seek_counts_from_the_new_position(tmp_path: Path) -> None:
    """A non-durable Exclusive consumer seeks back to the start after reading two: what
    retention then deletes is counted from the position it seeked to."""
    root = str(tmp_path)
    c = _consumer(root)
    store = open_blob_store(root)
    assert len(c.fetch(2)) == 2
    c.seek(Position(0, 0))
    enforce_retention(store, NAME)
    assert _values(c, 1) == [b"10"]
    assert c.skipped_by_retention == 10
    c.close()
