"""Write tests/golden/v1topic: a topic in manifest format 1 (run with the pre-format-2 code).

Kept for the record; the files it wrote are committed and must not be regenerated with newer
code (they pin what format-1 topics on disk look like). Usage, from a checkout at or before the
commit that introduced manifest format 2, with that checkout's package importable::

    python tests/golden/make_v1_topic.py tests/golden/v1topic
"""

from __future__ import annotations

import sys

from filepulsar.connector.client import Client, ConsumerType, InitialPosition
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.manifest import MANIFEST_FORMAT
from filepulsar.storage.policies import set_namespace_policies

assert MANIFEST_FORMAT == 1, "run with the format-1 code"
root = sys.argv[1]
store = open_blob_store(root)
client = Client(root)
set_namespace_policies(
    store,
    "public",
    "default",
    ledger_max_entries=3,
    deduplication_enabled=True,
    retention_time_minutes=-1,
)
consumer = client.subscribe(
    "golden-v1",
    "audit",
    consumer_type=ConsumerType.Shared,
    initial_position=InitialPosition.Earliest,
)
producer = client.create_producer("golden-v1", producer_name="gold", batching_enabled=False)
for i in range(10):
    producer.send(f"m{i}".encode(), partition_key=f"k{i % 3}", sequence_id=i)
producer.close()
for _ in range(4):  # acknowledge m0..m3 (the cursor moves), m5 individually (an ack hole)
    consumer.acknowledge(consumer.receive(timeout_millis=5000))
m4 = consumer.receive(timeout_millis=5000)
consumer.acknowledge(consumer.receive(timeout_millis=5000))
consumer.negative_acknowledge(m4)
consumer.close()
client.close()
