"""What a keeping-up Key_Shared application costs in our storage format with no layers (issue #27).

Run: ``python -m bench.bench_lean_look [consumers] [seconds] [topics] [rate] [--writers W]
[--window MS] [--compare]`` (issue #27's application profile: ``10 20 30 1000 --writers 10``).

A ceiling of our own format, between ``bench_iot_floor`` (no format at all) and
``bench_live_app`` (the client): the producer process is ``bench_live_app``'s (KeyBased
batching, explicit sequence ids, named producers, ``W`` writers a topic in turn, each entry a
commit of its own), and this process consumes what it writes as a Key_Shared application must,
reading the bytes the format stores, with none of the client's or the managed ledger's
machinery. One poller thread, every ``--window`` ms (default 90, about the push dispatcher's
round under this traffic), for each topic:

- reads the manifest journal's new records (one ``pread`` from where it stopped), checks each
  record's magic, CRC32C and mark, parses its JSON payload, and takes the fragments its delta
  appends to the open ledger (a full record: the open ledger's fragments past those known);
- reads each new fragment's bytes from its blob (one ``pread`` through a descriptor kept open),
  verifies the entries as a reader must (``iter_records``: framing, CRC32C, header), decodes
  the key of each (``single_row_of``) and its Key_Shared slot (``sticky_key_hash``,
  ``hash_slot``), and queues it for the slot's owner (10 consumers, equal ranges).

Each consumer thread takes its messages one at a time (``receive``) and records each as
acknowledged (``acknowledge``) in a group written to a file with an ``fdatasync`` every 100 ms.
Not done, and so not counted: subscription states, leases, claims, redelivery, dead letters,
the Message objects the client builds, a ledger's rollover into a closed one (a new ledger is
followed from its full record: the entries a rollover moved into the closed ledger's index
before a look saw them are not read, about 0.5% of the messages with ``--writers 10``, and
the wait for the rest ends 1 s after the last arrival; ``sent`` and ``received`` say how
many), deleted topics. It is therefore a ceiling of the format's own per-message work, not a
consumer. ``--compare`` runs ``bench_live_app`` with the same
arguments after it, so both figures come from the same minutes of the host.

``--filter`` puts one part of the client back: each topic's look is the push dispatcher's
(a :class:`~filepulsar.storage.delivery.KeySharedFilter` of a real Key_Shared subscription,
its 10 consumers registered over every topic: the manifest's state, the entry cache's read,
the subscription state's stamp and view, the entries' owners), the process's queued events
read once a round as the dispatcher does; its entries go to their owners' lean queues as
above. The consumers' leases are long (no renewal in the run) and nothing is acknowledged to
the subscription, so every look is steady (a look that cannot tell would hand out nothing:
``looks_none`` counts them, and ``received`` then falls short of ``sent``). The phases are
then the look and the handing out.

It prints the CPU per delivered message (this process; and by thread: poller, consumers,
acknowledgement writer), the phases of the poller's looks (thread CPU: the manifest's
records, the entries' read and verification, keys and slots, handing out), and the
send-to-receipt p50 and p99.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import crc32c
import numpy as np
import orjson

from bench.bench_live_app import _PRODUCER, cpu_by_kind, thread_cpu
from filepulsar.connector.client import Client
from filepulsar.dispatch.hashing import hash_slot, sticky_key_hash
from filepulsar.dispatch.modes import ConsumerType
from filepulsar.storage.delivery import KeySharedFilter
from filepulsar.storage.entry import R_FLAGS, R_PAYLOAD, iter_records, single_row_of
from filepulsar.storage.subscription import InitialPosition
from filepulsar.storage.versioned.watch import drain_events

_REC = struct.Struct("<4sqIII")  # magic, version, D, P, CRC
_MARK = 0xA5
_RANGE = 65536  # Key_Shared hash range


class _Topic:
    """One topic's journal position and the open ledger's fragments known."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.segment = os.path.join(folder, "manifest", "0".zfill(20) + ".journal")
        self.fd = os.open(self.segment, os.O_RDONLY)
        self.offset = 0
        self.version = 0
        self.ledger = -1
        self.entries = 0  # entries of the open ledger located so far
        self.blobs: dict[str, int] = {}

    def blob_fd(self, blob: str) -> int:
        fd = self.blobs.get(blob)
        if fd is None:
            fd = self.blobs[blob] = os.open(
                os.path.join(self.folder, "data", blob + ".entries"), os.O_RDONLY
            )
        return fd

    def new_records(self) -> list[dict[str, Any]]:
        """The marked records after the last one read (a segment's end: the next one)."""
        out = []
        want = 4096
        while True:
            buf = os.pread(self.fd, want, self.offset)
            want = 4096
            pos = 0
            while pos + 24 <= len(buf):
                magic, version, d, p, crc = _REC.unpack_from(buf, pos)
                end = pos + 24 + d + p
                if magic != b"FPJ3":
                    break
                if end >= len(buf):
                    want = end - pos + 1 + 4096  # (longer than the read: read it whole)
                    break
                if buf[end] != _MARK:
                    break  # in flight
                got = crc32c.crc32c(buf[pos + 24 : end], crc32c.crc32c(buf[pos + 4 : pos + 20]))
                if got != crc:
                    raise RuntimeError(f"{self.segment}: record at {self.offset + pos} damaged")
                out.append(orjson.loads(buf[pos + 24 + d : end].split(b"\n", 1)[0]))
                self.version = version + 1
                pos = end + 1
            self.offset += pos
            if want > 4096 or (pos and len(buf) == 4096):
                continue  # (more than one read's worth)
            if buf[pos : pos + 4] in (b"\0\0\0\0", b"") and not out:
                name = str(self.version).zfill(20) + ".journal"
                nxt = os.path.join(self.folder, "manifest", name)
                if os.path.exists(nxt):
                    os.close(self.fd)
                    self.segment, self.fd, self.offset = nxt, os.open(nxt, os.O_RDONLY), 0
                    continue
            return out

    def new_fragments(self, records: list[dict[str, Any]]) -> list[tuple[list[Any], int]]:
        """The fragments of the open ledger the records add past the entries known, each
        with how many of its first entries are known (a fragment grows when its writer
        commits again next): a delta's ``open`` (its id and the fragments it appends), a
        full record's last ledger."""
        frags: list[tuple[list[Any], int]] = []
        for r in records:
            if "delta" in r:
                if "open" not in r:
                    continue
                lid, listed = r["open"][0], r["open"][7]
            elif r.get("ledgers"):
                lg = r["ledgers"][-1]
                lid, listed = lg["id"], lg.get("fragments") or []
            else:
                continue
            if lid != self.ledger:
                self.ledger, self.entries = lid, 0
            for f in listed:
                if f[1] + f[2] > self.entries:
                    frags.append((f, max(0, self.entries - f[1])))
                    self.entries = f[1] + f[2]
        return frags


class _Consumer:
    def __init__(self) -> None:
        self.queue: collections.deque[tuple[int, int, bytes]] = collections.deque()
        self.cond = threading.Condition()


def run(
    consumers: int,
    seconds: float,
    topics: int,
    rate: int,
    writers: int,
    window_s: float,
    work_s: float = 0.0,
    use_filter: bool = False,
) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="fp-bench-lean-")
    names = [f"live-{i}" for i in range(topics)]
    phases: collections.defaultdict[str, float] = collections.defaultdict(float)
    try:
        client = Client(root)
        for t in names:
            client.create_producer(t, batching_enabled=False).close()
        client.close()
        base = os.path.join(root, "topics", "persistent", "public", "default")
        tops = [_Topic(os.path.join(base, t)) for t in names]
        for top in tops:
            top.new_fragments(top.new_records())
        cons = [_Consumer() for _ in range(consumers)]
        width = _RANGE // consumers
        filters: list[KeySharedFilter] = []
        by_cid: dict[str, int] = {}
        subs: list[Any] = []
        app: Client | None = None
        if use_filter:
            # Not served by a dispatcher thread (the poller looks, as the dispatcher would):
            # read when a consumer is made, and put back at once (``--compare`` runs the
            # client after this, in this process, with its dispatcher).
            was = os.environ.get("FILEPULSAR_PUSH")
            os.environ["FILEPULSAR_PUSH"] = "0"
            try:
                app = Client(root)
                subs = [
                    app.subscribe(
                        names,
                        "app",
                        consumer_type=ConsumerType.KeyShared,
                        initial_position=InitialPosition.Latest,
                        consumer_name=f"c{i}",
                        consumer_lease_ms=3_600_000,
                    )
                    for i in range(consumers)
                ]
            finally:
                if was is None:
                    del os.environ["FILEPULSAR_PUSH"]
                else:
                    os.environ["FILEPULSAR_PUSH"] = was
            for i, c in enumerate(subs):
                by_cid.update({p.sc.cid: i for p in c._topics.parts})
            for part in subs[0]._topics.parts:  # (one filter a topic, as the dispatcher's)
                sc = part.sc
                f = KeySharedFilter(
                    sc.ml,
                    functools.partial(sc.state, drain=False),
                    sc.lapsed,
                    functools.partial(sc.state_stamp, drain=False),
                    drained=True,
                )
                f.look()  # (the first look cannot tell: from here on)
                filters.append(f)
        stop = threading.Event()
        received = [0]
        count_lock = threading.Lock()
        e2e: list[float] = []
        acks: list[tuple[int, int]] = []
        ack_lock = threading.Lock()

        def round_end(woke: set[int], start: float, cpu0: float) -> None:
            """A poller's round ends: the owners it queued for woken, then its pause."""
            tt = time.thread_time
            a = tt()
            for o in woke:
                c = cons[o]
                with c.cond:
                    c.cond.notify()
            phases["wake"] += tt() - a
            phases["poller_cpu"] = tt() - cpu0
            stop.wait(max(0.0, window_s - (time.monotonic() - start)))

        def poll_filters() -> None:
            tt = time.thread_time
            cpu0 = tt()
            while not stop.is_set():
                start = time.monotonic()
                woke = set()
                a = tt()
                drain_events()
                phases["events"] += tt() - a
                for f in filters:
                    a = tt()
                    new = f.look()
                    b = tt()
                    phases["look"] += b - a
                    phases["looks"] += 1
                    if new is None or not new.entries:
                        if new is None:
                            phases["looks_none"] += 1
                        continue
                    phases["looks_found"] += 1
                    phases["entry_count"] += len(new.entries)
                    for e, o in zip(new.entries, new.owners, strict=True):
                        row = e.single_row()
                        assert row is not None and o is not None
                        owner = by_cid[o]
                        cons[owner].queue.append((e.ledger_id, e.entry_id, row["value"]))
                        woke.add(owner)
                    phases["hand"] += tt() - b
                round_end(woke, start, cpu0)

        def poll() -> None:
            tt = time.thread_time
            cpu0 = tt()
            while not stop.is_set():
                start = time.monotonic()
                woke = set()
                for t in tops:
                    a = tt()
                    frags = t.new_fragments(t.new_records())
                    b = tt()
                    phases["manifest"] += b - a
                    phases["looks"] += 1
                    if not frags:
                        continue
                    phases["looks_found"] += 1
                    for f, skip in frags:
                        blob, first, count, offset, length = f[0], f[1], f[2], f[3], f[4]
                        c0 = tt()
                        # (A fragment that grew is read whole, its entries known skipped:
                        # where they end is in their framing.)
                        data = os.pread(t.blob_fd(blob), length, offset)
                        recs = list(iter_records(data, count, offset))[skip:]
                        c1 = tt()
                        phases["entries"] += c1 - c0
                        phases["entry_count"] += len(recs)
                        for i, rec in enumerate(recs, skip):
                            row = single_row_of(
                                rec[R_FLAGS], rec[4], rec[5], rec[6], rec[R_PAYLOAD]
                            )
                            assert row is not None
                            h = sticky_key_hash(row.get("ordering_key"), row.get("key"))
                            owner = min(hash_slot(h, 0, _RANGE) // width, consumers - 1)
                            c2 = tt()
                            phases["slots"] += c2 - c1
                            c = cons[owner]
                            c.queue.append((t.ledger, first + i, row["value"]))
                            woke.add(owner)
                            c1 = tt()
                            phases["hand"] += c1 - c2
                round_end(woke, start, cpu0)

        def consume(c: _Consumer) -> None:
            while not stop.is_set():
                with c.cond:
                    while not c.queue and not stop.is_set():
                        c.cond.wait(0.5)
                    if not c.queue:
                        continue
                    ledger, entry, value = c.queue.popleft()  # receive
                if work_s:  # (a consumer's own work per message, pure Python)
                    until = time.thread_time() + work_s
                    while time.thread_time() < until:
                        pass
                now = time.time_ns()
                with ack_lock:  # acknowledge (grouped)
                    acks.append((ledger, entry))
                with count_lock:
                    received[0] += 1
                    e2e.append((now - int.from_bytes(value[:8], "little")) / 1e6)

        ack_path = os.path.join(root, "acks")

        def write_acks() -> None:
            fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                while not stop.wait(0.1):
                    with ack_lock:
                        group = acks[:]
                        acks.clear()
                    if group:
                        os.write(fd, json.dumps(group[-1]).encode() + b"\n")
                        os.fdatasync(fd)
            finally:
                os.close(fd)

        threads = [
            threading.Thread(target=poll_filters if use_filter else poll, name="lean-poller")
        ]
        threads += [
            threading.Thread(target=consume, args=(c,), name=f"lean-{i} (consume)")
            for i, c in enumerate(cons)
        ]
        threads.append(threading.Thread(target=write_acks, name="lean-acks"))
        for th in threads:
            th.start()
        c0 = time.process_time()
        t0 = thread_cpu()
        argv = [root, ",".join(names), str(rate), str(seconds), "1", str(writers)]
        producer = subprocess.Popen(
            [sys.executable, "-c", _PRODUCER, *argv], stdout=subprocess.PIPE, text=True
        )
        sent = int(producer.communicate()[0])
        # (Entries a rollover closed into a ledger index before a look saw them are not
        # followed: the wait ends 1 s after the last arrival.)
        last, at = -1, time.monotonic()
        while received[0] < sent and time.monotonic() - at < 1.0:
            if received[0] != last:
                last, at = received[0], time.monotonic()
            time.sleep(0.05)
        cpu = time.process_time() - c0
        t1 = thread_cpu()
        stop.set()
        for th in threads:
            th.join()
        n = received[0]
        for c in subs:
            c.close()
        if app is not None:
            app.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    kinds = cpu_by_kind(t0, t1)
    lat = np.asarray(e2e)
    looks = max(phases["looks_found"], 1)
    return {
        "sent": sent,
        "received": n,
        "cpu_us_per_msg": cpu / max(n, 1) * 1e6,
        **{f"{k}_us": v[0] / max(n, 1) / 1e3 for k, v in kinds.items()},
        "poller_us": phases["poller_cpu"] / max(n, 1) * 1e6,
        "looks_found": phases["looks_found"],
        "entries_per_look": phases["entry_count"] / looks,
        "look_us": {
            k: round(phases[k] / looks * 1e6, 1)
            for k in ("manifest", "entries", "slots", "look", "hand", "wake", "events")
        },
        "looks_none": phases["looks_none"],
        "manifest_us_per_look_incl_empty": phases["manifest"] / max(phases["looks"], 1) * 1e6,
        "e2e_p50_ms": float(np.percentile(lat, 50)) if n else -1.0,
        "e2e_p99_ms": float(np.percentile(lat, 99)) if n else -1.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("consumers", type=int, nargs="?", default=10)
    ap.add_argument("seconds", type=float, nargs="?", default=20.0)
    ap.add_argument("topics", type=int, nargs="?", default=30)
    ap.add_argument("rate", type=int, nargs="?", default=1000)
    ap.add_argument("--writers", type=int, default=10)
    ap.add_argument("--window", type=float, default=90.0, help="the poller's round, ms")
    ap.add_argument("--work", type=float, default=0.0, help="each consumer's CPU a message, us")
    ap.add_argument("--compare", action="store_true", help="then bench_live_app, same args")
    ap.add_argument(
        "--filter", action="store_true", help="each look the dispatcher's KeySharedFilter"
    )
    a = ap.parse_args()
    r = run(
        a.consumers,
        a.seconds,
        a.topics,
        a.rate,
        a.writers,
        a.window / 1000,
        a.work / 1e6,
        use_filter=a.filter,
    )
    print("filter" if a.filter else "lean", json.dumps(r))
    if a.compare:
        from bench import bench_live_app

        live = bench_live_app.run(
            a.consumers, a.seconds, a.topics, a.rate, keybased=True, writers=a.writers
        )
        print("client", json.dumps({k: round(v, 1) for k, v in live.items()}))


if __name__ == "__main__":
    main()
