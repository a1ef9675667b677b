"""One rule for topics patterns (issue 12): the client's pattern consumers and the Spark
source's ``topicsPattern`` find their topics through
:class:`filepulsar.storage.topics.TopicPattern`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from filepulsar import InitialPosition, Timeout
from filepulsar.connector.client import Client
from filepulsar.connector.source.options import SourceOptions
from filepulsar.connector.source.plan import resolve_partitions
from filepulsar.storage import TopicName, create_topic, open_blob_store
from filepulsar.storage.errors import InvalidConfiguration
from filepulsar.storage.topics import TopicPattern, match_topics

pytestmark = pytest.mark.unit

TOPICS = [
    "persistent://public/default/a",
    "persistent://public/default/b",
    "persistent://public/default/ab",
    "persistent://public/other/a",
    "non-persistent://public/default/a",
]


@pytest.fixture
def root(tmp_path: Path) -> str:
    r = str(tmp_path / "root")
    store = open_blob_store(r)
    for t in TOPICS:
        create_topic(store, t, partitions=2 if t.endswith("/b") else 0)
    return r


def _found(root: str, pattern: str | re.Pattern[str], **kw: tuple[str, ...]) -> list[str]:
    return [
        str(i.name) for i in match_topics(open_blob_store(root), TopicPattern.parse(pattern, **kw))
    ]


def test_forms_of_a_pattern(root: str) -> None:
    d = "persistent://public/default/"
    assert _found(root, "persistent://public/default/a.*") == [d + "a", d + "ab"]
    assert _found(root, "a.*") == [d + "a", d + "ab"]  # bare: public/default, persistent
    assert _found(root, "a|b") == [d + "a", d + "b"]  # a bare alternation is one group
    assert _found(root, "non-persistent://public/default/a") == [
        "non-persistent://public/default/a"
    ]
    assert _found(
        root, "persistent://public/default/a", domains=("persistent", "non-persistent")
    ) == [
        "non-persistent://public/default/a",
        d + "a",
    ]
    assert _found(root, re.compile("persistent://public/default/A", re.IGNORECASE)) == [d + "a"]


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("persistent://pub.*/default/a", "tenant and namespace literally"),
        ("persistent://public/a", "tenant and namespace literally"),
        ("queue://public/default/a", "tenant and namespace literally"),
        ("persistent://public/default/(a", "not a regular expression"),
    ],
)
def test_a_bad_pattern_is_refused_in_one_line(pattern: str, says: str) -> None:
    with pytest.raises(InvalidConfiguration, match=re.escape(says)) as e:
        TopicPattern.parse(pattern)
    assert "\n" not in str(e.value) and pattern in str(e.value)


def test_the_source_and_a_pattern_consumer_find_the_same_topics(root: str) -> None:
    """The Spark source once compiled a bare pattern unparenthesised after its prefix, so
    ``a|b`` found only ``a``; the consumer had its own rule. Both now use TopicPattern."""
    store = open_blob_store(root)
    with Client(root) as client:
        for t in TOPICS:
            with client.create_producer(t) as p:
                p.send(t.encode())
        for pattern in ("a|b", "persistent://public/default/a.*", "public/default/(a|b)"):
            opts = SourceOptions.parse({"path": root, "topicsPattern": pattern}, streaming=False)
            from_source = sorted({str(t.base) for t in resolve_partitions(store, opts)})
            assert from_source == _found(root, pattern)
            consumer = client.subscribe(
                re.compile(pattern), f"s{len(pattern)}", initial_position=InitialPosition.Earliest
            )
            got = []
            for _ in from_source:
                m = consumer.receive(timeout_millis=10_000)
                got.append(str(TopicName.parse(m.topic_name()).base))
                consumer.acknowledge(m)
            with pytest.raises(Timeout):
                consumer.receive(timeout_millis=100)  # no topic beyond the source's
            consumer.close()
            assert sorted(got) == from_source
