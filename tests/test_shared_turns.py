"""Shared consumers of one subscription in one process take turns to fetch (issue #27, point
4: the work per entry does not grow with the consumers of a subscription in a process).

Each Shared fetch reads the entries after the subscription's ``dispatched`` position and
claims them in a commit. Consumers of a process that fetched at once all read the same
entries, and every claim but the first found them taken: a read and a commit attempt for
nothing, for each consumer beyond the first. They now fetch in turn (the lease group's
``fetching`` lock), so a fetch reads what the one before it left."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from filepulsar.connector.client import Client, ConsumerType, InitialPosition, Timeout
from filepulsar.storage import claims

pytestmark = pytest.mark.unit


def test_shared_consumers_of_a_process_read_what_the_last_fetch_left_not_the_same_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four Shared consumers of one subscription, threads of one process, each ``receive``
    + ``acknowledge`` per message, drain 400 single-message entries: every message arrives
    once, and no claim looked at entries read after another consumer had claimed them all
    (the spy only counts: it calls the real claim). Before the turns, most fetches did."""
    n = 400
    real = claims.claim_shared
    stale: list[int] = []

    def counting(state: Any, *, candidates: Any, **kw: Any) -> Any:
        if candidates and candidates[-1] <= state.dispatched:
            stale.append(len(candidates))  # read entries another consumer had claimed
        return real(state, candidates=candidates, **kw)

    monkeypatch.setattr(claims, "claim_shared", counting)
    with Client(str(tmp_path)) as client:
        producer = client.create_producer("t", batching_enabled=False)
        for i in range(n):
            producer.send_async(b"%d" % i, None)
        producer.flush()
        consumers = [
            client.subscribe(
                "t",
                "s",
                consumer_type=ConsumerType.Shared,
                consumer_name=f"c{k}",
                initial_position=InitialPosition.Earliest,
                receiver_queue_size=20,
            )
            for k in range(4)
        ]
        got: list[bytes] = []
        lock = threading.Lock()

        def drain(c: Any) -> None:
            while True:
                with lock:
                    if len(got) >= n:
                        return
                try:
                    m = c.receive(100)
                except Timeout:
                    continue
                c.acknowledge(m)
                with lock:
                    got.append(m.data())

        threads = [threading.Thread(target=drain, args=(c,)) for c in consumers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(got, key=int) == [b"%d" % i for i in range(n)]
        assert stale == []
