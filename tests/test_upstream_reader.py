"""pulsar-client-python's ``tests/reader_test.py``, rewritten for filepulsar: both upstream
tests, one function each, named after them. The service URL is a storage root under
``tmp_path``; nothing else changes. Not ported: none.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from filepulsar import Client, MessageId

pytestmark = pytest.mark.unit


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    c = Client(str(tmp_path / "root"))
    yield c
    c.close()


def test_has_message_available_after_seek(client: Client) -> None:
    topic = "test_has_message_available_after_seek"
    producer = client.create_producer(topic)
    reader = client.create_reader(topic, start_message_id=MessageId.earliest)
    producer.send(b"msg-0")
    assert reader.has_message_available()
    reader.seek(MessageId.latest)  # past everything there is
    assert not reader.has_message_available()
    producer.send(b"msg-1")
    assert reader.has_message_available()


def test_seek_latest_message_id(client: Client) -> None:
    topic = "test_seek_latest_message_id"
    producer = client.create_producer(topic)
    msg_id = producer.send(b"msg")
    reader = client.create_reader(topic, start_message_id=MessageId.latest)
    assert not reader.has_message_available()
    reader.close()
    # Inclusive at latest: the last message stored is read.
    reader = client.create_reader(
        topic, start_message_id=MessageId.latest, start_message_id_inclusive=True
    )
    assert reader.has_message_available()
    assert reader.read_next(3000).message_id() == msg_id
    reader.close()
