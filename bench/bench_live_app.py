"""Live Key_Shared traffic, the consuming process alone (issue #27).

Run: ``python -m bench.bench_live_app [consumers] [seconds] [topics] [rate]`` (default 4
consumers, 8 s, 10 topics, 300 msg/s; issue #27's application profile is ``1 20 30 1000``). A
producer process sends ``rate`` keyed messages a second over ``topics`` topics, one message per
entry (as
one send per device in flight leaves nothing to batch); this process runs ``consumers``
Key_Shared consumers of one subscription over all the topics, each ``receive`` +
``acknowledge`` per message on its own thread, until every message arrived. It prints this
process's CPU per delivered message and, per delivered message, the commits it made and the
stored states (manifests and subscription states) it decoded, counted by wrapping
``VersionedStore.commit`` and ``JournalEngine._decode_record``. bench_client's live case
times the same with the producer in the process.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.bench_client import LiveConsumers
from filepulsar.connector.client import Client
from filepulsar.storage.versioned import VersionedStore
from filepulsar.storage.versioned.journaled import JournalEngine

TOPICS = [f"live-{i}" for i in range(10)]
RATE = 300

_PRODUCER = """
import sys, time
from filepulsar.connector.client import Client
root, topics = sys.argv[1], sys.argv[2].split(",")
rate, seconds = int(sys.argv[3]), float(sys.argv[4])
client = Client(root)
producers = [client.create_producer(t, batching_enabled=False) for t in topics]
sent, t0 = 0, time.perf_counter()
while (elapsed := time.perf_counter() - t0) < seconds:
    while sent < int(elapsed * rate):
        producers[sent % len(topics)].send_async(b"x" * 64, None, partition_key=f"d{sent % 1000}")
        sent += 1
    time.sleep(0.002)  # paces the producer: load, not synchronisation
for p in producers:
    p.flush()
client.close()
print(sent)
"""


def _counting() -> dict[str, int]:
    counts = {"commits": 0, "decodes": 0}
    commit, decode = VersionedStore.commit, JournalEngine._decode_record

    def counted_commit(self: Any, *a: Any, **k: Any) -> Any:
        counts["commits"] += 1
        return commit(self, *a, **k)

    def counted_decode(self: Any, *a: Any, **k: Any) -> Any:
        counts["decodes"] += 1
        return decode(self, *a, **k)

    VersionedStore.commit = counted_commit  # type: ignore[method-assign]
    JournalEngine._decode_record = counted_decode  # type: ignore[method-assign]
    return counts


def run(
    consumers: int = 4, seconds: float = 8.0, topics: int = len(TOPICS), rate: int = RATE
) -> dict[str, float]:
    counts = _counting()
    root = tempfile.mkdtemp(prefix="fp-bench-live-app-")
    names = [f"live-{i}" for i in range(topics)]
    try:
        client = Client(root)
        for t in names:
            client.create_producer(t, batching_enabled=False).close()
        live = LiveConsumers(client, names, consumers)
        counts.update(commits=0, decodes=0)  # from the first message on
        c0 = time.process_time()
        producer = subprocess.Popen(
            [sys.executable, "-c", _PRODUCER, root, ",".join(names), str(rate), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        sent = int(producer.communicate()[0])
        live.wait_for(sent)
        cpu = time.process_time() - c0
        n = live.finish(sent)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "cpu_us_per_msg": cpu / n * 1e6,
        "commits_per_msg": counts["commits"] / n,
        "decodes_per_msg": counts["decodes"] / n,
    }


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    secs = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
    topics = int(sys.argv[3]) if len(sys.argv) > 3 else len(TOPICS)
    rate = int(sys.argv[4]) if len(sys.argv) > 4 else RATE
    r = run(n, secs, topics, rate)
    print(
        f"{n} Key_Shared consumers, {rate} msg/s over {topics} topics: "
        f"{r['cpu_us_per_msg']:.0f} us CPU, {r['commits_per_msg']:.3f} commits, "
        f"{r['decodes_per_msg']:.2f} decoded states per delivered message"
    )
