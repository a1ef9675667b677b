"""When a ``Trigger.AvailableNow`` run on a Shared or Key_Shared subscription ends (driver-side
readers, no Spark): only on a claim round that finds nothing while the subscription stands
still and nothing of the run's keys waits on another consumer's acknowledgement
(``FilePulsarStreamReader._settle``). Each test failed before: the run ended on the first
claim round that found nothing."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from filepulsar.connector.source.stream import FilePulsarStreamReader
from filepulsar.dispatch.clock import ManualClock
from filepulsar.dispatch.hashing import hash_slot
from filepulsar.storage import Producer, create_topic, open_blob_store
from filepulsar.storage.delivery import _selector_owner, key_hash_of, selector_of
from tests.test_source import _read_all, _reader, produce

pytestmark = pytest.mark.unit

KEY_SHARED = {
    "subscriptionType": "Key_Shared",
    "subscriptionInitialPosition": "Earliest",
}


def _run(r: FilePulsarStreamReader, start: dict[str, Any], limit: int) -> list[int]:
    """Triggers of ``r`` from ``start`` until its run ends; the values' numbers read."""
    got: list[int] = []
    end = r.latestOffset(start, ReadMaxRows(limit))
    while end != start:
        got += _read_all(r, start, end)
        start = end
        end = r.latestOffset(start, ReadMaxRows(limit))
    return got


def test_a_shared_run_passes_delayed_messages_and_reads_what_follows(tmp_path: Any) -> None:
    """Shared: 30 messages delayed an hour, then 20 plain ones. A fetch whose window holds
    only delayed entries claims nothing but moves the dispatch position past them: the run
    goes on and reads the 20."""
    root = str(tmp_path)
    create_topic(open_blob_store(root), "d")
    later = int(time.time() * 1000) + 3_600_000
    with Producer(open_blob_store(root), "d", batching_enabled=False) as p:
        for i in range(30):
            p.send_async(b"v%d" % i, deliver_at=later)
        for i in range(30, 50):
            p.send_async(b"v%d" % i)
    r = _reader(
        root,
        topic="d",
        subscription="s",
        subscriptionType="Shared",
        subscriptionInitialPosition="Earliest",
    )
    r.prepareForTriggerAvailableNow()
    assert sorted(_run(r, r.initialOffset(), 10)) == list(range(30, 50))
    r.stop()


def _owned_keys(me: FilePulsarStreamReader) -> tuple[str, str]:
    """A key another consumer of ``me``'s (one-partition) Key_Shared subscription owns, and
    one ``me`` owns, under the subscription's selector now."""
    (c,) = me._streams.consumers.values()
    s = c.state()
    sel = selector_of(s.selector)
    of_sel = {x.sel_id: x.cid for x in s.consumers.values()}

    def owner(key: str) -> str:
        return of_sel[_selector_owner(sel, hash_slot(key_hash_of(None, key), *sel.hash_range))]

    keys = [f"key{i}" for i in range(200)]
    return next(k for k in keys if owner(k) != c.cid), next(k for k in keys if owner(k) == c.cid)


def test_a_key_shared_run_scans_past_any_number_of_other_consumers_entries(
    tmp_path: Any,
) -> None:
    """Key_Shared, two queries; the other never fetches. 1,500 entries of a key the other
    owns, then 20 of this query's: its scan moves 64 entries a fetch, and the run scans on
    (progress, not churn) until it reaches its own."""
    root = str(tmp_path)
    store = open_blob_store(root)
    create_topic(store, "k")
    other = _reader(root, consumerName="other", topic="k", subscription="s", **KEY_SHARED)
    me = _reader(root, consumerName="me", topic="k", subscription="s", **KEY_SHARED)
    other.initialOffset()
    me.initialOffset()
    theirs, mine = _owned_keys(me)
    with Producer(store, "k", batching_enabled=False) as p:
        for i in range(1500):
            p.send_async(b"v%d" % i, partition_key=theirs)
        for i in range(1500, 1520):
            p.send_async(b"v%d" % i, partition_key=mine)
    me.prepareForTriggerAvailableNow()
    assert sorted(_run(me, me.initialOffset(), 10)) == list(range(1500, 1520))
    me.stop()
    other.stop()


class _Pausing(ManualClock):
    """A reader's clock whose first wait lets another query run (``during``)."""

    def __init__(self) -> None:
        super().__init__()
        self.during: list[Any] = []

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        while self.during:
            self.during.pop(0)()


def _draining_pair(tmp_path: Any, clock: ManualClock) -> tuple[Any, ...]:
    """Query ``a`` claims the first 1,000 of 1,200 entries alone, then ``b`` joins: ``b``'s
    keys' later entries wait on ``a``'s acknowledgements (draining)."""
    root = str(tmp_path)
    create_topic(open_blob_store(root), "t")
    produce(root, "t", 1200, batching_enabled=False)
    opts = {"topic": "t", "subscription": "t", "consumerBusyTimeoutMs": "2000", **KEY_SHARED}
    a = _reader(root, consumerName="a", **opts)
    b = FilePulsarStreamReader({"path": root, "consumerName": "b", **opts}, None, clock=clock)  # type: ignore[arg-type]
    a.prepareForTriggerAvailableNow()
    sa = a.initialOffset()
    ea = a.latestOffset(sa, ReadMaxRows(1000))
    got_a = _read_all(a, sa, ea)
    assert len(got_a) == 1000
    b.prepareForTriggerAvailableNow()
    return a, b, ea, got_a


def test_a_key_shared_run_waits_for_what_holds_its_keys_back(tmp_path: Any) -> None:
    """``b`` finds nothing while its keys drain: it waits (on its clock) instead of ending,
    and ``a``, running meanwhile, acknowledges, reads the rest of its keys and ends; ``b``
    then reads the rest of its own. Before, ``b`` ended at once and (``a`` ending with ``b``
    still registered) some of ``b``'s keys were read by neither."""
    clock = _Pausing()
    a, b, ea, got_a = _draining_pair(tmp_path, clock)

    def a_runs_to_its_end() -> None:
        got_a.extend(_run(a, ea, 1000))

    clock.during.append(a_runs_to_its_end)
    got_b = _run(b, b.initialOffset(), 1000)
    assert clock.sleeps  # b waited
    assert sorted(got_a + got_b) == list(range(1200))
    a.stop()
    b.stop()


def test_a_key_shared_run_held_back_too_long_ends_with_a_warning(
    tmp_path: Any, caplog: Any
) -> None:
    """Nobody acknowledges what holds ``b``'s keys back: ``b`` waits consumerBusyTimeoutMs
    (2 s here, on its clock: no real waiting) and ends, saying why."""
    clock = ManualClock()
    a, b, _, _ = _draining_pair(tmp_path, clock)
    with caplog.at_level(logging.WARNING):
        assert _run(b, b.initialOffset(), 1000) == []
    assert 2.0 <= sum(clock.sleeps) < 2.2
    assert "Key_Shared draining" in caplog.text
    a.stop()
    b.stop()
