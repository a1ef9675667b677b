"""Write tests/golden/v2topic: a topic in manifest format 2 kept as one file per version (run
with the code before local journals).

Kept for the record; the files it wrote are committed and must not be regenerated with newer
code (they pin what a format-2 topic on a local disk looks like before journals). Usage, from
a checkout before the commit that introduced journals, with that checkout's package
importable::

    python tests/golden/make_v2_topic.py tests/golden/v2topic
"""

from __future__ import annotations

import sys

import importlib.util

from filepulsar.connector.client import Client, ConsumerType, InitialPosition
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.policies import set_namespace_policies

assert importlib.util.find_spec("filepulsar.storage.journal") is None, "run with the older code"
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
    "golden-v2",
    "audit",
    consumer_type=ConsumerType.Shared,
    initial_position=InitialPosition.Earliest,
)
producer = client.create_producer("golden-v2", producer_name="gold", batching_enabled=False)
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
