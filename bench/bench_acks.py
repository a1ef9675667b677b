"""Acknowledgement commits of live Key_Shared traffic, the consuming process alone (issue #27).

Run: ``python -m bench.bench_acks [consumers] [seconds] [rate] [topics] [mark_delete_rate_limit]``
(default 10 consumers, 10 s, 1,000 msg/s, 30 topics, the client's default rate). A producer
process sends ``rate`` keyed messages a second over ``topics`` topics, one message per entry
(as one send per device in flight leaves nothing to batch); this process runs ``consumers``
Key_Shared consumers of one subscription over all the topics, each ``receive`` +
``acknowledge`` per message on its own thread, until every message arrived. It prints, per
delivered message, this process's CPU, its commits (all, and those writing grouped
acknowledgements), and the thread CPU spent in those acknowledgement commits, counted by
wrapping ``VersionedStore.commit`` and ``SubscriptionConsumer.acknowledge``; and the commits
by kind (``renewal``: a lease renewal alone; ``ack``: a group of acknowledgements, which
renews the leases of the process's consumers of its partition too; ``record``: a consumer
recording what it holds for a new membership; ``registration``; ``other``: delayed entries
held, leaving), counted by the method that called the commit. Leases renew every third of
``consumer_lease_ms`` (30 s): a run shorter than 10 s shows none. bench_live_app
times the same shape at 300 msg/s over 10 topics with 4 consumers and counts decoded states.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from filepulsar.connector.client import Client, ConsumerType, InitialPosition, Timeout
from filepulsar.connector.client.ack_grouping import DEFAULT_MARK_DELETE_RATE_LIMIT
from filepulsar.storage.delivery import Dispatcher
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.versioned import VersionedStore

#: The kinds of commits counted, by the method whose call made them (the innermost wins).
KINDS = {
    "renew": "renewal",
    "acknowledge": "ack",
    "sync": "record",
    "_register": "registration",
}


def produce(root: str, topics: list[str], rate: int, seconds: float) -> int:
    """The producer process's work: ``rate`` messages a second for ``seconds``, round robin
    over ``topics``, each keyed by one of 100,000 devices; returns how many it sent."""
    with Client(root) as client:
        out = [client.create_producer(t, batching_enabled=False) for t in topics]
        n, start = 0, time.perf_counter()
        while (now := time.perf_counter() - start) < seconds:
            for k in range(n, int(now * rate)):
                out[k % len(out)].send_async(b"x" * 64, None, partition_key=f"d{k * 7919 % 100000}")
            n = max(n, int(now * rate))
            time.sleep(0.002)  # paces the producer: load, not synchronisation
        for p in out:
            p.flush()
    return n


class _Counts:
    """Commits and acknowledgement commits (with their thread CPU) made in this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.commits = 0
        self.acks = 0
        self.ack_cpu = 0.0
        self.kinds: dict[str, int] = {}
        self._local = threading.local()
        commit, ack = VersionedStore.commit, SubscriptionConsumer.acknowledge

        def counted_commit(store: Any, *a: Any, **k: Any) -> Any:
            kind = getattr(self._local, "kind", None) or "other"
            with self.lock:
                self.commits += 1
                self.kinds[kind] = self.kinds.get(kind, 0) + 1
            return commit(store, *a, **k)

        def counted_ack(sc: SubscriptionConsumer, items: Any) -> None:
            t = time.thread_time()
            try:
                ack(sc, items)
            finally:
                spent = time.thread_time() - t
                with self.lock:
                    self.acks += 1
                    self.ack_cpu += spent

        VersionedStore.commit = counted_commit
        SubscriptionConsumer.acknowledge = counted_ack
        for cls in (SubscriptionConsumer, Dispatcher):
            for name, kind in KINDS.items():
                if hasattr(cls, name):
                    setattr(cls, name, self._kind_of(getattr(cls, name), kind))

    def _kind_of(self, method: Any, kind: str) -> Any:
        local = self._local

        def wrapped(*a: Any, **k: Any) -> Any:
            outer = getattr(local, "kind", None)
            local.kind = kind
            try:
                return method(*a, **k)
            finally:
                local.kind = outer

        return wrapped

    def reset(self) -> None:
        with self.lock:
            self.commits = self.acks = 0
            self.ack_cpu = 0.0
            self.kinds = {}


def run(
    consumers: int = 10,
    seconds: float = 10.0,
    rate: int = 1000,
    topics: int = 30,
    mark_delete_rate_limit: float = DEFAULT_MARK_DELETE_RATE_LIMIT,
) -> dict[str, float]:
    """One run; the figures per delivered message (see the module docstring)."""
    counts = _Counts()
    names = [f"acks-{i}" for i in range(topics)]
    root = tempfile.mkdtemp(prefix="fp-bench-acks-")
    try:
        client = Client(root)
        for t in names:
            client.create_producer(t, batching_enabled=False).close()
        opts: dict[str, Any] = {
            "consumer_type": ConsumerType.KeyShared,
            "initial_position": InitialPosition.Earliest,
            "mark_delete_rate_limit": mark_delete_rate_limit,
        }
        subs = [
            client.subscribe(names, "app", consumer_name=f"c{i}", **opts) for i in range(consumers)
        ]
        got = [0]
        stop = threading.Event()

        def consume(c: Any) -> None:
            while not stop.is_set():
                try:
                    c.acknowledge(c.receive(100))
                except Timeout:
                    continue
                with counts.lock:
                    got[0] += 1

        workers = [threading.Thread(target=consume, args=(c,)) for c in subs]
        for w in workers:
            w.start()
        counts.reset()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        cmd = ["--produce", root, ",".join(names), str(rate), str(seconds)]
        producer = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_acks", *cmd], stdout=subprocess.PIPE, text=True
        )
        sent = int(producer.communicate()[0])
        deadline = time.perf_counter() + 60
        while got[0] < sent and time.perf_counter() < deadline:
            time.sleep(0.01)  # the consumers catch up (their receive wakes on each commit)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        with counts.lock:  # what closing commits (leaving, the last groups) is not counted
            commits, acks, ack_cpu = counts.commits, counts.acks, counts.ack_cpu
            kinds = dict(counts.kinds)
        stop.set()
        for w in workers:
            w.join()
        for c in subs:
            c.close()
        client.close()
        n = got[0]
        if n < sent:
            raise RuntimeError(f"live traffic: {n} of {sent} messages delivered")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    return {
        "cpu_us_per_msg": cpu / n * 1e6,
        "commits_per_msg": commits / n,
        "ack_commits_per_msg": acks / n,
        "ack_cpu_us_per_msg": ack_cpu / n * 1e6,
        "cpu_us_per_ack_commit": ack_cpu / max(1, acks) * 1e6,
        **{f"{kind}_commits_per_msg": kinds.get(kind, 0) / n for kind in _KIND_NAMES},
    }


_KIND_NAMES = ("renewal", "ack", "record", "registration", "other")


def main(args: list[str]) -> None:
    """The command line (see the module docstring)."""
    if args[:1] == ["--produce"]:
        print(produce(args[1], args[2].split(","), int(args[3]), float(args[4])))
        return
    n = int(args[0]) if args else 10
    secs = float(args[1]) if len(args) > 1 else 10.0
    msg_rate = int(args[2]) if len(args) > 2 else 1000
    ntopics = int(args[3]) if len(args) > 3 else 30
    limit = float(args[4]) if len(args) > 4 else DEFAULT_MARK_DELETE_RATE_LIMIT
    r = run(n, secs, msg_rate, ntopics, limit)
    print(
        f"{n} Key_Shared consumers, {msg_rate} msg/s over {ntopics} topics, "
        f"mark_delete_rate_limit {limit}: {r['cpu_us_per_msg']:.0f} us CPU, "
        f"{r['commits_per_msg']:.3f} commits, {r['ack_commits_per_msg']:.3f} acknowledgement "
        f"commits ({r['ack_cpu_us_per_msg']:.0f} us of CPU, {r['cpu_us_per_ack_commit']:.0f} us "
        "each) per delivered message; by kind: "
        + ", ".join(f"{k} {r[k + '_commits_per_msg']:.4f}" for k in _KIND_NAMES)
    )


if __name__ == "__main__":
    main(sys.argv[1:])
