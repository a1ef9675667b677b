"""Requests sent to S3 (moto server on 127.0.0.1), counted by a botocore hook on the store's
s3fs client: what the store costs at S3's prices (a LIST is priced as a PUT, 12.5 GETs)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from filepulsar.storage import Producer, TopicName, create_topic
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.ledger import ManagedLedger

pytestmark = [pytest.mark.contract, pytest.mark.s3]


@pytest.fixture
def counted(s3_root: tuple[str, dict[str, Any]]) -> Iterator[tuple[BlobStore, Counter[str]]]:
    root, options = s3_root
    store = open_blob_store(root, storage_options=options)
    store.exists("warm-up")  # the client exists once a first request was made
    ops: Counter[str] = Counter()

    def hook(event_name: str, **_: Any) -> None:
        ops[event_name.rsplit(".", 1)[-1]] += 1

    events = store._fs.s3.meta.events  # type: ignore[attr-defined]
    events.register("before-send.s3", hook)
    try:
        yield store, ops
    finally:
        events.unregister("before-send.s3", hook)


def test_existence_check_of_a_missing_blob_is_one_head(
    counted: tuple[BlobStore, Counter[str]],
) -> None:
    """Fails with s3fs's ``info`` (a HEAD, then a LIST of ``<key>/`` after the 404)."""
    store, ops = counted
    store.put("a/b.json", b"x")
    ops.clear()
    assert not store.exists("a/missing.json")
    assert store.exists("a/b.json")
    assert store.size("a/b.json") == 1
    assert store.mtime_ms("a/b.json") > 0
    assert dict(ops) == {"HeadObject": 4}


def test_idle_manifest_refresh_costs_two_heads_and_no_list(
    counted: tuple[BlobStore, Counter[str]],
) -> None:
    """A consumer or reader waiting for data refreshes the manifest in a loop: 2 HEADs each
    (FORMAT.md, "Reading"), no LIST."""
    store, ops = counted
    create_topic(store, "idle")
    with Producer(store, "idle", batching_enabled=False) as p:
        p.send(b"m")
    ml = ManagedLedger(store, TopicName.parse("idle"))
    ml.state()
    ops.clear()
    for _ in range(10):
        ml.manifest.latest()
    assert dict(ops) == {"HeadObject": 20}
