"""The streaming source with ``subscriptionMode=NonDurable`` under retention (issue #31,
defect 5). A non-durable subscription holds back no retention, so retention may delete what
the query has not read yet: with ``failOnDataLoss=true`` (the default) the batch that meets
it fails with DataLossError naming the topic and the lost range; with ``false`` the query
logs it and reads on at the first message that remains. Both for the offset-ranged types
(Exclusive, Failover) and the claimed ones (Shared, Key_Shared, whose consumer counts the
loss: ``SubscriptionConsumer.skipped_by_retention``).

Driver-side: the stream reader is called as Spark calls it (no Spark needed), on real files
with a real retention run.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from filepulsar.connector.source.stream import FilePulsarStreamReader
from filepulsar.storage import Producer, open_blob_store, set_topic_policies
from filepulsar.storage.errors import DataLossError
from filepulsar.storage.retention import enforce_retention

pytestmark = pytest.mark.spark

TYPES = ["Exclusive", "Failover", "Shared", "Key_Shared"]


def _send(root: str, lo: int, hi: int) -> None:
    with Producer(open_blob_store(root), "nd", batching_enabled=False) as p:
        for i in range(lo, hi):
            p.send(b"v%d" % i)  # one commit each: ledgers of 2 entries


def _read(r: FilePulsarStreamReader, start: dict[str, Any]) -> tuple[list[int], Any]:
    end = r.latestOffset(start, ReadAllAvailable())
    out = []
    for part in r.partitions(start, end):
        for b in r.read(part):
            out.extend(int(v[1:]) for v in b.column("value").to_pylist())
    return sorted(out), end


def _query(root: str, sub_type: str, fail: str) -> FilePulsarStreamReader:
    opts = {
        "path": root,
        "topic": "nd",
        "subscription": "q",
        "subscriptionType": sub_type,
        "subscriptionMode": "NonDurable",
        "startingOffsets": "earliest",
        "failOnDataLoss": fail,
    }
    return FilePulsarStreamReader(opts, None)  # type: ignore[arg-type]


def _first_batch_then_retention(root: str, r: FilePulsarStreamReader) -> Any:
    set_topic_policies(open_blob_store(root), "nd", ledger_max_entries=2)  # retention 0/0
    _send(root, 0, 3)
    got, end = _read(r, r.initialOffset())
    assert got == [0, 1, 2]
    r.commit(end)
    _send(root, 3, 11)
    report = enforce_retention(open_blob_store(root), "nd")  # nothing holds it back
    assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1, 2, 3, 4]
    return end


@pytest.mark.parametrize("sub_type", TYPES)
def test_non_durable_query_fails_on_what_retention_deleted_unread(
    tmp_path: Any, sub_type: str
) -> None:
    """Messages 3-9 were deleted before the query read them: the next batch fails, naming
    the topic and what was lost, and says how to read on."""
    root = str(tmp_path)
    r = _query(root, sub_type, "true")
    end = _first_batch_then_retention(root, r)
    with pytest.raises(DataLossError, match=r"nd.*(after 1:0 up to 4:1).*failOnDataLoss=false"):
        _read(r, end)
    r.stop()


@pytest.mark.parametrize("sub_type", TYPES)
def test_non_durable_query_without_fail_on_data_loss_logs_and_reads_on(
    tmp_path: Any, sub_type: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With failOnDataLoss=false the same batch logs the loss once and reads what remains
    (10); the next messages come as usual, with no further warning."""
    root = str(tmp_path)
    r = _query(root, sub_type, "false")
    end = _first_batch_then_retention(root, r)
    caplog.set_level(logging.WARNING, logger="filepulsar")
    got, end = _read(r, end)
    assert got == [10]
    lost = [m for m in caplog.messages if "after 1:0 up to 4:1" in m]
    assert len(lost) == 1 and "failOnDataLoss=false" in lost[0]
    if sub_type in ("Shared", "Key_Shared"):
        assert "retention deleted 7 messages" in lost[0]
    r.commit(end)
    _send(root, 11, 13)
    caplog.clear()
    got, end = _read(r, end)
    assert got == [11, 12] and not [m for m in caplog.messages if "retention" in m]
    r.stop()
