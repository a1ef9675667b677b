"""The floor under ``bench_iot``: the IoT scenario's topology done by bare Python processes.

Issue 27 asks the host-sized IoT variant (10 gateways, 30 topics, 20 applications x 10 clients,
1,000 msg/s) of filepulsar on 2 cores. Before calling that out of reach, this measures what the
same topology costs with no messaging system at all, only the work a broker-less design cannot
avoid in Python:

* a gateway process appends each 64-byte message (a 4-byte length prefix) to its topic's file
  with one ``os.write`` (O_APPEND; what a returned write holds survives a SIGKILL of the
  writer, as filepulsar's sends do), optionally ``fdatasync`` per message (``--sync``);
* an application process has one poller thread that reads every topic file's new bytes
  (``os.pread`` from its last offset) every ``--poll-ms``, cuts the records, and hands each to
  one of its client threads by a hash of the device id (Key_Shared's rule, cheapest form)
  through that thread's ``queue.SimpleQueue``;
* a client thread calls ``get()`` (receive) and records the message as acknowledged
  (acknowledge); one flusher thread per application writes the acknowledged positions to its
  subscription file every 100 ms (grouped acks, Pulsar's default window).

No entry format, no checksums, no dedup, no manifests, no claims, no leases: so this is a floor,
not a peer. Its CPU per delivered message, beside ``bench_iot``'s, says how much of the gap is
ours to close and how much is the shape itself (several processes each reading every message on
2 cores).

Run::

    python -m bench.bench_iot_floor --gateways 10 --topics 30 --apps 20 --clients 10 \\
        --rate 1000 --duration 20
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

_REC = struct.Struct("<I")  # length prefix
_MSG = struct.Struct("<IQd44x")  # device id, counter, publish instant (wall), padding: 64 bytes


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def gateway(
    folder: Path,
    g: int,
    gateways: int,
    topics: int,
    devices: int,
    rate: float,
    duration: float,
    sync: bool,
) -> None:
    """Send this gateway's share of ``rate`` for ``duration`` s, round-robin over its devices."""
    fds = [
        os.open(folder / f"topic-{t}", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for t in range(topics)
    ]
    mine = list(range(g, devices, gateways))
    counters = [0] * len(mine)
    share = rate / gateways
    cpu0, t0 = _cpu_s(), time.monotonic()
    sent = 0
    while True:
        now = time.monotonic() - t0
        if now >= duration:
            break
        due = int(now * share) + 1
        while sent < due:
            i = sent % len(mine)
            dev = mine[i]
            body = _MSG.pack(dev, counters[i], time.time())
            counters[i] += 1
            fd = fds[dev % topics]
            os.write(fd, _REC.pack(len(body)) + body)
            if sync:
                os.fdatasync(fd)
            sent += 1
        time.sleep(max(0.0, (sent / share) - (time.monotonic() - t0)))
    print(json.dumps({"role": "gateway", "sent": sent, "cpu_s": _cpu_s() - cpu0}), flush=True)


def app(folder: Path, a: int, topics: int, clients: int, poll_ms: float, deadline: float) -> None:
    """Receive and acknowledge every message of every topic with ``clients`` threads."""
    fds = [os.open(folder / f"topic-{t}", os.O_RDONLY | os.O_CREAT, 0o644) for t in range(topics)]
    offsets = [0] * topics
    queues: list[queue.SimpleQueue[tuple[int, int, bytes] | None]] = [
        queue.SimpleQueue() for _ in range(clients)
    ]
    acked: list[list[tuple[int, int]]] = [[] for _ in range(clients)]
    lat: list[float] = []
    received = [0] * clients
    stop = threading.Event()
    sub = os.open(folder / f"sub-{a}", os.O_WRONLY | os.O_CREAT, 0o644)
    cpu0 = _cpu_s()

    def poller() -> None:
        carry = [b""] * topics
        while not stop.is_set():
            for t in range(topics):
                data = os.pread(fds[t], 1 << 20, offsets[t])
                if not data:
                    continue
                offsets[t] += len(data)
                buf = carry[t] + data
                pos = 0
                while pos + 4 <= len(buf):
                    (n,) = _REC.unpack_from(buf, pos)
                    if pos + 4 + n > len(buf):
                        break
                    body = buf[pos + 4 : pos + 4 + n]
                    dev = _MSG.unpack_from(body)[0]
                    queues[dev % clients].put((t, offsets[t] - len(buf) + pos, body))
                    pos += 4 + n
                carry[t] = buf[pos:]
            time.sleep(poll_ms / 1000)

    def client(i: int) -> None:
        q = queues[i]
        while True:
            m = q.get()  # receive
            if m is None:
                return
            t, off, body = m
            lat.append(time.time() - _MSG.unpack_from(body)[2])
            received[i] += 1
            acked[i].append((t, off))  # acknowledge (grouped: the flusher writes it)

    def flusher() -> None:
        marks = [-1] * topics
        while not stop.wait(0.1):
            for i in range(clients):
                taken, acked[i] = acked[i], []
                for t, off in taken:
                    if off > marks[t]:
                        marks[t] = off
            os.pwrite(sub, json.dumps(marks).encode(), 0)

    threads = [threading.Thread(target=poller), threading.Thread(target=flusher)]
    threads += [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for th in threads:
        th.start()
    total = folder / "sent"  # the coordinator writes what the gateways really sent
    while time.monotonic() < deadline:
        if total.exists() and sum(received) >= int(total.read_text()):
            break
        time.sleep(0.05)
    stop.set()
    for q in queues:
        q.put(None)
    for th in threads:
        th.join()
    lat.sort()
    n = len(lat)
    print(
        json.dumps(
            {
                "role": "app",
                "received": sum(received),
                "cpu_s": _cpu_s() - cpu0,
                "p50_ms": lat[n // 2] * 1000 if n else None,
                "p99_ms": lat[int(n * 0.99)] * 1000 if n else None,
            }
        ),
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gateways", type=int, default=10)
    ap.add_argument("--topics", type=int, default=30)
    ap.add_argument("--apps", type=int, default=20)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--devices", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--poll-ms", type=float, default=5)
    ap.add_argument("--sync", action="store_true", help="fdatasync every message")
    ap.add_argument("--role", choices=["gateway", "app"], help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0, help=argparse.SUPPRESS)
    o = ap.parse_args()
    if o.role == "gateway":
        gateway(
            Path(o.folder), o.index, o.gateways, o.topics, o.devices, o.rate, o.duration, o.sync
        )
        return
    if o.role == "app":
        app(Path(o.folder), o.index, o.topics, o.clients, o.poll_ms, o.deadline)
        return
    print(json.dumps(measure(o), indent=1))


def measure(o: argparse.Namespace) -> dict[str, Any]:
    """Run the topology ``o`` once; its figures."""
    with tempfile.TemporaryDirectory(prefix="iot-floor-") as folder:
        common = [
            sys.executable,
            "-m",
            "bench.bench_iot_floor",
            "--folder",
            folder,
            "--gateways",
            str(o.gateways),
            "--topics",
            str(o.topics),
            "--clients",
            str(o.clients),
            "--devices",
            str(o.devices),
            "--rate",
            str(o.rate),
            "--duration",
            str(o.duration),
            "--poll-ms",
            str(o.poll_ms),
        ] + (["--sync"] if o.sync else [])
        for t in range(o.topics):
            Path(folder, f"topic-{t}").touch()
        deadline = time.monotonic() + o.duration + 30
        apps = [
            subprocess.Popen(
                [
                    *common,
                    "--role",
                    "app",
                    "--index",
                    str(a),
                    "--deadline",
                    str(deadline),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for a in range(o.apps)
        ]
        t0 = time.monotonic()
        gws = [
            subprocess.Popen(
                [*common, "--role", "gateway", "--index", str(g)], stdout=subprocess.PIPE, text=True
            )
            for g in range(o.gateways)
        ]
        outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in gws]
        publish_s = time.monotonic() - t0
        # Each app stops once it has this many (not the planned count, which pacing may miss).
        tmp = Path(folder, "sent.tmp")
        tmp.write_text(str(sum(x["sent"] for x in outs)))
        tmp.rename(Path(folder, "sent"))
        ins = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in apps]
    sent = sum(x["sent"] for x in outs)
    delivered = sum(x["received"] for x in ins)
    cpu_gw = sum(x["cpu_s"] for x in outs)
    cpu_app = sum(x["cpu_s"] for x in ins)
    return {
        "topology": {
            k: getattr(o, k)
            for k in (
                "gateways",
                "topics",
                "apps",
                "clients",
                "rate",
                "duration",
                "poll_ms",
                "sync",
            )
        },
        "sent": sent,
        "publish_s": round(publish_s, 1),
        "slowest_app_received": min(x["received"] for x in ins),
        "delivered": delivered,
        "e2e_p50_ms_worst_app": max(x["p50_ms"] or 0 for x in ins),
        "e2e_p99_ms_worst_app": max(x["p99_ms"] or 0 for x in ins),
        "cpu_s_gateways": round(cpu_gw, 2),
        "cpu_s_apps": round(cpu_app, 2),
        "cpu_us_per_sent": round(cpu_gw * 1e6 / sent, 1) if sent else None,
        "cpu_us_per_delivered_apps": round(cpu_app * 1e6 / delivered, 1) if delivered else None,
        "cpu_us_per_delivered_all": round((cpu_gw + cpu_app) * 1e6 / delivered, 1)
        if delivered
        else None,
    }


def run() -> list[dict[str, Any]]:
    """``make bench`` rows: the host-sized topology (``iot-telemetry-local-steady``'s shape)."""
    o = argparse.Namespace(
        gateways=10,
        topics=30,
        apps=20,
        clients=10,
        devices=100_000,
        rate=1000.0,
        duration=20.0,
        poll_ms=5.0,
        sync=False,
    )
    f = measure(o)
    print(json.dumps(f, indent=1), file=sys.stderr, flush=True)
    name = "iot floor (bare Python processes, host-sized topology)"
    return [
        {
            "name": f"{name}: CPU per delivered message (gateways + apps)",
            "value": f["cpu_us_per_delivered_all"] / 1000,
            "unit": "ms",
        },
        {
            "name": f"{name}: slowest application's share received",
            "value": f["slowest_app_received"] / f["sent"],
            "unit": "ratio",
        },
        {
            "name": f"{name}: publish-to-receipt p99, worst application",
            "value": f["e2e_p99_ms_worst_app"],
            "unit": "ms",
        },
    ]


if __name__ == "__main__":
    main()
