"""Live Key_Shared traffic, the consuming process alone (issue #27).

Run: ``python -m bench.bench_live_app [consumers] [seconds] [topics] [rate] [--keybased]
[--behind S] [--writers W] [--restart S]`` (default 4 consumers, 8 s, 10 topics, 300 msg/s;
issue #27's application profile is ``10 20 30 1000 --keybased``). A producer process sends
``rate`` keyed messages a second over ``topics`` topics, one message per entry (as one send per
device in flight leaves nothing to batch): unbatched, or with ``--keybased`` as bench_iot's
gateways write them (KeyBased batching, explicit sequence ids, named producers: each entry a
batch of one). With ``--behind S`` the consumers start ``S`` seconds after the producer (their
subscription made before it, from the earliest message), so they serve a backlog through the
fetch before they catch up, as bench_iot's applications do after their start-up; the CPU is
counted from their start. With ``--writers W`` each topic has W producers that send its
messages in turn, each entry its own commit: every entry a fragment of its own, the writers'
blobs interleaved, as bench_iot's 10 gateways write each of their 30 topics (one producer a
topic by default). With ``--restart S`` one consumer after another is closed and subscribed
again under its name every ``S`` seconds while the producer sends (its thread stopped first, so
everything it received is acknowledged; each restart is a membership change in every topic, as
in bench_iot's restart variant).
This process runs ``consumers``
Key_Shared consumers of one subscription over all the topics, each ``receive`` +
``acknowledge`` per message on its own thread, until every message arrived. It prints this
process's CPU per delivered message and, per delivered message, the commits it made and the
stored states (manifests and subscription states) it decoded, counted by wrapping
``VersionedStore.commit`` and ``JournalEngine._decode_record``; the send-to-receipt latency's
p50 and p99 (each payload starts with its ``send_async`` instant); and per kind of thread
(the push dispatcher, its housekeeping, the consumers' threads, the rest) the CPU and the
context switches per delivered message (``/proc/self/task``). bench_client's live case
times the same with the producer in the process.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

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
rate, seconds, keybased = int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
writers = int(sys.argv[6]) if len(sys.argv) > 6 else 1
client = Client(root)
# (Message k goes to topic k % T, by its topic's writer (k // T) % writers: with several
# writers each topic's entries come from them in turn, as bench_iot's gateways write them.)
if keybased:  # (as bench_iot's gateways)
    producers = [
        client.create_producer(
            t, producer_name=f"gw-{w}-{i}" if writers > 1 else f"gw-{i}",
            batching_enabled=True, batching_type="KeyBased"
        )
        for w in range(writers)
        for i, t in enumerate(topics)
    ]
else:
    producers = [
        client.create_producer(t, batching_enabled=False) for _ in range(writers) for t in topics
    ]
sent, t0 = 0, time.perf_counter()
while (elapsed := time.perf_counter() - t0) < seconds:
    while sent < int(elapsed * rate):
        payload = time.time_ns().to_bytes(8, "little") + b"x" * 56  # (its send instant)
        ids = {"sequence_id": sent} if keybased else {}
        producers[sent % len(producers)].send_async(
            payload, None, partition_key=f"d{sent % 1000}", **ids
        )
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


def _kind(name: str) -> str:
    """A thread's kind by its name: the push dispatcher's two threads (``dispatcher``,
    ``housekeeping``), a benchmark's consuming threads (their target ``_consume`` or
    ``consume``: ``consumers``), or ``other``."""
    if name.startswith("filepulsar-push-"):
        return name[len("filepulsar-push-") :]
    return "consumers" if name.endswith(("(_consume)", "(consume)")) else "other"


def thread_cpu() -> dict[int, tuple[str, int, int]]:
    """Per live thread (by its native id): its kind (:func:`_kind`), CPU ns, context switches
    (``/proc/self/task``; empty where it cannot be read)."""
    out: dict[int, tuple[str, int, int]] = {}
    for t in threading.enumerate():
        try:
            with open(f"/proc/self/task/{t.native_id}/schedstat") as f:
                cpu = int(f.read().split()[0])
            with open(f"/proc/self/task/{t.native_id}/status") as f:
                switches = sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except OSError:
            continue  # (ended meanwhile)
        if t.native_id is not None:
            out[t.native_id] = (_kind(t.name), cpu, switches)
    return out


def cpu_by_kind(
    t0: dict[int, tuple[str, int, int]], t1: dict[int, tuple[str, int, int]]
) -> dict[str, list[int]]:
    """Per kind: [CPU ns, context switches] between the two samples of the threads alive at
    the second (one started between them counts from 0; one that ended between them is not
    counted at all, rather than subtracted: its end could not be read)."""
    out: dict[str, list[int]] = {}
    for tid, (kind, cpu, switches) in t1.items():
        _, cpu0, switches0 = t0.get(tid, (kind, 0, 0))
        acc = out.setdefault(kind, [0, 0])
        acc[0] += cpu - cpu0
        acc[1] += switches - switches0
    return out


def run(
    consumers: int = 4,
    seconds: float = 8.0,
    topics: int = len(TOPICS),
    rate: int = RATE,
    *,
    keybased: bool = False,
    behind: float = 0.0,
    writers: int = 1,
    restart_s: float = 0.0,
) -> dict[str, float]:
    counts = _counting()
    root = tempfile.mkdtemp(prefix="fp-bench-live-app-")
    names = [f"live-{i}" for i in range(topics)]
    try:
        client = Client(root)
        for t in names:
            client.create_producer(t, batching_enabled=False).close()
        argv = [
            root,
            ",".join(names),
            str(rate),
            str(seconds),
            "1" if keybased else "0",
            str(writers),
        ]
        cmd = [sys.executable, "-c", _PRODUCER, *argv]
        producer = None
        if behind:
            # The subscription exists (from the earliest message) before anything is sent,
            # and the consumers start ``behind`` s after the producer.
            LiveConsumers(Client(root), names, consumers).finish(0)
            producer = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            time.sleep(behind)
        live = LiveConsumers(client, names, consumers, e2e=True)
        counts.update(commits=0, decodes=0)  # from the consumers' start on
        c0 = time.process_time()
        t0 = thread_cpu()
        if producer is None:  # (keeping up: the producer starts once the consumers are in)
            producer = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        done = threading.Event()
        restarter = None
        if restart_s:
            # One consumer after another closed and subscribed again every ``restart_s``
            # seconds while the producer sends (each a membership change in every topic).
            def restarts() -> None:
                k = 0
                while not done.wait(restart_s):
                    live.restart(k % consumers)
                    k += 1

            restarter = threading.Thread(target=restarts)
            restarter.start()
        try:
            sent = int(producer.communicate()[0])
        finally:
            done.set()
            if restarter is not None:
                restarter.join()
        live.wait_for(sent)
        cpu = time.process_time() - c0
        t1 = thread_cpu()
        n = live.finish(sent)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    e2e = np.asarray(live.e2e_ms)
    per_thread = {
        f"{kind}_{what}": v / n / (1e3 if i == 0 else 1)
        for kind, vals in cpu_by_kind(t0, t1).items()
        for i, (what, v) in enumerate(zip(("us", "switches"), vals))
    }
    return {
        **per_thread,
        "cpu_us_per_msg": cpu / n * 1e6,
        "commits_per_msg": counts["commits"] / n,
        "decodes_per_msg": counts["decodes"] / n,
        "e2e_p50_ms": float(np.percentile(e2e, 50)),
        "e2e_p99_ms": float(np.percentile(e2e, 99)),
        "restarts": live.restarts,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.bench_live_app")
    ap.add_argument("consumers", type=int, nargs="?", default=4)
    ap.add_argument("seconds", type=float, nargs="?", default=8.0)
    ap.add_argument("topics", type=int, nargs="?", default=len(TOPICS))
    ap.add_argument("rate", type=int, nargs="?", default=RATE)
    ap.add_argument("--keybased", action="store_true", help="bench_iot's gateway producers")
    ap.add_argument("--behind", type=float, default=0.0, help="consumers start S s late")
    ap.add_argument("--writers", type=int, default=1, help="producers per topic, sending in turn")
    ap.add_argument(
        "--restart", type=float, default=0.0, help="a consumer closed and reopened every S s"
    )
    a = ap.parse_args()
    n, rate, topics = a.consumers, a.rate, a.topics
    r = run(
        n,
        a.seconds,
        topics,
        rate,
        keybased=a.keybased,
        behind=a.behind,
        writers=a.writers,
        restart_s=a.restart,
    )
    entries = "batches of one" if a.keybased else "unbatched entries"
    restarted = f" ({r['restarts']:.0f} restarts)" if a.restart else ""
    if a.writers > 1:
        entries += f", {a.writers} writers a topic in turn"
    print(
        f"{n} Key_Shared consumers{f' started {a.behind:g} s behind' if a.behind else ''}"
        f"{restarted}, "
        f"{rate} msg/s over {topics} topics ({entries}): "
        f"{r['cpu_us_per_msg']:.0f} us CPU, {r['commits_per_msg']:.3f} commits, "
        f"{r['decodes_per_msg']:.2f} decoded states per delivered message; send-to-receipt "
        f"p50 {r['e2e_p50_ms']:.1f} ms, p99 {r['e2e_p99_ms']:.1f} ms"
    )
    kinds = sorted({k.rsplit("_", 1)[0] for k in r if k.endswith("_switches")})
    print(
        "per delivered message, by thread: "
        + ", ".join(f"{k} {r[k + '_us']:.0f} us {r[k + '_switches']:.2f} switches" for k in kinds)
    )
