"""Multi-process concurrency suite (issue 10, "Proving it"): real processes, real storage.

Every producer, consumer and housekeeper is a separate Python process running
:mod:`tests.procs_worker`; they meet only through the storage root (local disk, or S3 on the
moto server of ``tests/conftest.py``). Processes are synchronised by pipe barriers (``ready``,
``paused`` lines on their stdout; ``start``/``go``/``stop`` on their stdin), never by sleeps.

What is checked, from the processes' own logs and a read-back of the topic from Earliest:

- producers: every acknowledged message is stored exactly once, under exactly the message id
  its send returned, and each producer's messages keep their send order within a partition;
  messages whose send failed may be present or not (they are not counted as lost);
- consumers (Shared, Key_Shared, one slow and one idle consumer among fast ones): every message
  is consumed, none is delivered again after its acknowledgement returned (counted during the
  run and by a fresh consumer after everyone closed: the subscription's backlog must be 0), and
  on Key_Shared each key's messages are first delivered in topic order;
- retention and the orphan sweep, run in a loop by another process, never delete what a live
  producer or consumer still needs;
- writers with skewed clocks (the bound is derived in ``test_skewed_clocks_within_bound``), and
  consumers whose machines' wall clocks are off by far more than their lease (6 s and 60 s).

Each case prints a figures line (processes, acknowledged, lost, duplicated, order violations...)
at the end of the module and, when ``FILEPULSAR_CONCURRENCY_REPORT`` names a file, writes the
figures there as JSON. The quick default (``-m "not slow"``) runs every case once on local
disk; the S3 variants and the other two producer combinations are marked ``slow`` (CI runs
them). ``FILEPULSAR_LONG=1`` runs more processes, messages and runs (by hand).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from filepulsar.connector.admin import Admin
from filepulsar.connector.client import Client, ConsumerType, InitialPosition, Timeout
from filepulsar.storage.errors import FilePulsarError
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.policies import set_topic_policies
from filepulsar.storage.topics import create_topic
from tests.procs_forks import fork_worker

pytestmark = pytest.mark.procs

LONG = os.environ.get("FILEPULSAR_LONG") == "1"
RUNS = 4 if LONG else 1
PRODUCERS = 12 if LONG else 8
# Messages per producer. On S3 every commit is several requests to the one moto server of
# the test process (8 producers at 150 each took 58-123 s per case in CI, at 60 each 25-45 s);
# 40 still give each of the 8 about 22 racing commits (20 single sends, 2 batches): ~176
# entries, so 5-entry ledgers roll over ~35 times on one topic and ~8 times on each of 4
# partitions, while the others commit (the test asserts the rollovers happened).
MESSAGES = {"local": 400 if LONG else 150, "s3": 400 if LONG else 40}
REPO = Path(__file__).resolve().parents[1]
# The orphan sweep's age limit in the retention race, per backend: above the longest send (a
# send on the moto server in this process, under 8 processes, has taken 13 s).
ORPHAN_MIN_AGE_MS = {"local": 10_000, "s3": 40_000}
DEFAULT_LEASE_MS = 30_000  # producer_lease_ms and the client's consumer_lease_ms defaults

FIGURES: list[dict[str, Any]] = []


# --------------------------------------------------------------------------- the harness
class Group:
    """Worker processes sharing one condition, notified by every line any of them prints."""

    def __init__(self, tmp: Path, root: str, opts: dict[str, Any]) -> None:
        self.tmp = tmp
        self.root = root
        self.opts = opts
        self.cond = threading.Condition()
        self.procs: list[Proc] = []

    def start(self, name: str, role: str, *, wall_skew_ms: int = 0, **cfg: Any) -> Proc:
        """Start a worker; ``wall_skew_ms`` shifts its whole wall clock (its machine's clock
        is off by that much: ``FILEPULSAR_TEST_WALL_SKEW_MS``, see tests/procs_worker.py)."""
        full = {
            "role": role,
            "root": self.root,
            "opts": self.opts,
            "result": str(self.tmp / f"{name}.json"),
            **cfg,
        }
        p = Proc(self, name, full, wall_skew_ms=wall_skew_ms)
        self.procs.append(p)
        return p

    def wait(
        self, pred: Callable[[], bool], what: str, stall: float = 60, *, soft: bool = False
    ) -> bool:
        """Wait until ``pred()`` holds, woken by every line a worker prints.

        Gives up when no worker printed anything for ``stall`` seconds (progress stopped: a
        failure, not a synchronisation) or a worker died before finishing: raises, or returns
        False when ``soft``.
        """
        with self.cond:
            seen, last = -1, time.monotonic()
            while not pred():
                dead = [p for p in self.procs if p.exited and not p.count("done")]
                if dead:
                    raise AssertionError(f"{dead[0].name} died: {dead[0].stderr()[-3000:]}")
                n = sum(len(p.events) for p in self.procs)
                if n != seen:
                    seen, last = n, time.monotonic()
                left = last + stall - time.monotonic()
                if left <= 0:
                    if soft:
                        return False
                    detail = "; ".join(
                        f"{p.name}: {p.events[-2:]} {p.stderr()[-800:]}{p.errors_if_done()}"
                        for p in self.procs
                    )
                    raise AssertionError(f"no progress waiting for {what} ({detail})")
                self.cond.wait(left)
        return True

    def wait_all(self, procs: list[Proc], kind: str, what: str) -> None:
        """Wait until every one of ``procs`` printed a ``kind`` line."""
        self.wait(lambda: all(p.count(kind) for p in procs), what)

    def close(self) -> None:
        for p in self.procs:
            p.kill()


class Proc:
    """One worker process and the events it printed so far."""

    def __init__(
        self, group: Group, name: str, cfg: dict[str, Any], *, wall_skew_ms: int = 0
    ) -> None:
        self.group = group
        self.name = name
        self.cfg = cfg
        self.events: list[dict[str, Any]] = []
        self.exited = False
        self._err: list[str] = []
        # The caller's import path first (a worktree's import shim), then this checkout.
        path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)
        env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1")
        env["FILEPULSAR_TEST_WALL_SKEW_MS"] = str(wall_skew_ms)
        # Forked from a process that imported the client once (tests/procs_zygote.py): a
        # process of its own all the same, without 0.6-1.0 s of CPU importing it again.
        self.p = fork_worker(cfg, env, str(REPO))
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_stderr, daemon=True).start()

    def _pump(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            with self.group.cond:
                self.events.append(json.loads(line))
                self.group.cond.notify_all()
        self.p.wait()
        with self.group.cond:
            self.exited = True
            self.group.cond.notify_all()

    def _pump_stderr(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:  # drained so a chatty worker never blocks on the pipe
            self._err.append(line)

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e["ev"] == kind)

    def values(self, kind: str) -> list[str]:
        return [e["v"] for e in self.events if e["ev"] == kind]

    def send(self, command: str) -> None:
        """Write a command line; a worker that already finished (an error ended it, which
        its result file reports) is left alone."""
        assert self.p.stdin is not None
        try:
            self.p.stdin.write(command + "\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            if self.p.poll() is None:
                raise

    def stderr(self) -> str:
        return "".join(self._err)

    def result(self) -> dict[str, Any]:
        """The result file (written atomically before ``done``)."""
        data: dict[str, Any] = json.loads(Path(self.cfg["result"]).read_text())
        return data

    def errors_if_done(self) -> str:
        """The errors in the result file of a worker that finished (an error may have ended
        it early: its ``done`` then says nothing of why), for a failure's message."""
        if not self.count("done"):
            return ""
        try:
            errors = self.result().get("errors")
        except (OSError, ValueError) as e:
            return f" (result unreadable: {e})"
        return f" errors: {str(errors)[-1500:]}" if errors else ""

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


@pytest.fixture
def group_for(tmp_path: Path) -> Iterator[Callable[[str, dict[str, Any]], Group]]:
    groups: list[Group] = []

    def make(root: str, opts: dict[str, Any]) -> Group:
        g = Group(tmp_path, root, opts)
        groups.append(g)
        return g

    yield make
    for g in groups:
        g.close()


@pytest.fixture(params=["local", pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.slow])])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(name, root, storage options)`` of a fresh root on local disk or S3 (moto server)."""
    if request.param == "local":
        yield "local", str(tmp_path / "root"), {}
    else:
        root, opts = request.getfixturevalue("s3_root")
        yield "s3", root, opts


@pytest.fixture(scope="module", autouse=True)
def figures_report(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print every case's figures at the end of the module (and write them as JSON)."""
    yield
    if not FIGURES:
        return
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    lines = ["", "concurrency figures:"] + [_figures_line(f) for f in FIGURES]
    for line in lines:
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line)
    out = os.environ.get("FILEPULSAR_CONCURRENCY_REPORT")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(FIGURES, indent=1))


def _figures_line(f: dict[str, Any]) -> str:
    return "  " + " ".join(f"{k}={v}" for k, v in f.items())


def record(case: str, **figures: Any) -> dict[str, Any]:
    entry = {"case": case, **figures}
    FIGURES.append(entry)
    print(_figures_line(entry))
    return entry


# --------------------------------------------------------------------------- checking
def _mid_key(mid: str) -> tuple[int, ...]:
    """A message id's text as a sortable tuple (ledger, entry, partition, batch index)."""
    parts = [int(x) for x in mid.split(":")]
    return tuple(parts + [-1] * (4 - len(parts)))


def read_back(root: str, opts: dict[str, Any], topic: str) -> list[tuple[str, str]]:
    """Every stored message of ``topic`` as ``(value, message id)``, partition by partition,
    in stored order (a reader from Earliest, as a user would read it)."""
    out: list[tuple[str, str]] = []
    with Client(root, storage_options=opts or None) as client:
        for part in client.get_topic_partitions(topic):
            reader = client.create_reader(part, MessageId.earliest)
            while reader.has_message_available():
                msg = reader.read_next(10_000)
                out.append((msg.data().decode(), str(msg.message_id())))
            reader.close()
    return out


def check_produced(results: list[dict[str, Any]], stored: list[tuple[str, str]]) -> dict[str, int]:
    """Compare what producers were told (acknowledged ids) with what is stored.

    ``lost``: acknowledged, not stored. ``duplicated``: extra stored copies of acknowledged
    messages. ``wrong_id``: acknowledged ids that do not hold their message (another message or
    nothing is stored there; a lost message counts here too). ``order``: per producer and
    partition, messages stored before one sent earlier. ``unacked_stored``: stored messages
    whose send failed or was never acknowledged (allowed).
    """
    acked: dict[str, str] = {}
    for pid, res in enumerate(results):
        for seq, mid in res.get("acked", []):
            acked[f"{pid}:{seq}"] = mid
    where: dict[str, list[str]] = defaultdict(list)
    at: dict[str, str] = {}
    for value, mid in stored:
        where[value].append(mid)
        at[mid] = value
    lost = sum(1 for v in acked if v not in where)
    duplicated = sum(len(where[v]) - 1 for v in acked if len(where.get(v, ())) > 1)
    wrong_id = sum(1 for v, mid in acked.items() if at.get(mid) != v)
    last: dict[tuple[str, int], int] = {}
    order = 0
    for value, mid in stored:
        producer, seq_text = value.split(":")
        k = (producer, _mid_key(mid)[2])
        if k in last and int(seq_text) < last[k]:
            order += 1
        last[k] = max(last.get(k, -1), int(seq_text))
    return {
        "acked": len(acked),
        "lost": lost,
        "duplicated": duplicated,
        "wrong_id": wrong_id,
        "order": order,
        "unacked_stored": sum(1 for v in where if v not in acked),
        "send_errors": sum(
            len(r.get("errors", [])) + len(r.get("close_errors", [])) for r in results
        ),
        "error_texts": [
            e for r in results for e in r.get("errors", []) + r.get("close_errors", [])
        ],
    }


def check_consumed(
    logs: list[list[list[Any]]], *, key_order: bool
) -> tuple[dict[str, int], set[str]]:
    """Check consumers' logs ``[message id, key, value, redelivery count, recv ns, ack ns]``.

    ``acked_redelivered``: deliveries of a message after an acknowledgement of it had returned
    (in any consumer). ``key_order``: on Key_Shared, a key's first deliveries out of topic
    order (a message first received after a later message of the same key).
    """
    recs = sorted((r for log in logs for r in log), key=lambda r: r[4])
    first_ack: dict[str, int] = {}
    for _mid, _k, value, _rc, _t_recv, t_ack in recs:
        first_ack[value] = min(first_ack.get(value, t_ack), t_ack)
    acked_redelivered = sum(1 for r in recs if r[4] > first_ack[r[2]])
    deliveries = Counter(r[2] for r in recs)
    order = 0
    if key_order:
        seen: set[str] = set()
        newest: dict[str, tuple[int, ...]] = {}
        for mid, key, value, _rc, _t_recv, _t_ack in recs:
            if value in seen:
                continue
            seen.add(value)
            pos = _mid_key(mid)
            if key in newest and pos < newest[key]:
                order += 1
            newest[key] = max(newest.get(key, pos), pos)
    figures = {
        "deliveries": len(recs),
        "redelivered": sum(c - 1 for c in deliveries.values()),
        "acked_redelivered": acked_redelivered,
        "key_order": order,
    }
    return figures, set(deliveries)


def backlog(root: str, opts: dict[str, Any], topic: str, sub: str) -> int:
    """Unacknowledged messages of ``sub`` per the stored cursor (as ``topics stats`` shows)."""
    with Client(root, storage_options=opts or None) as client:
        stats = Admin(store=client.store).topics().get_stats(topic)
    return int(stats["subscriptions"][sub]["msgBacklog"])


def drain(root: str, opts: dict[str, Any], topic: str, sub: str, want: int) -> list[str]:
    """Receive (and acknowledge) what ``sub`` still delivers, up to ``want`` messages."""
    got: list[str] = []
    with Client(root, storage_options=opts or None) as client:
        c = client.subscribe(
            topic, sub, consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest
        )
        while len(got) < want:
            try:
                msg = c.receive(5000)
            except Timeout:
                break
            got.append(msg.data().decode())
            c.acknowledge(msg)
    return got


# --------------------------------------------------------------------------- scenarios
def run_producers(
    g: Group,
    topic: str,
    *,
    producers: int,
    messages: int,
    tag: str,
    keys: int = 0,
    batching: bool = True,
) -> list[Proc]:
    """Start producers, release them together (start barrier), return them (not yet done)."""
    procs = [
        g.start(
            f"{tag}-p{i}",
            "produce",
            topic=topic,
            pid=i,
            n=messages,
            keys=keys,
            batching=batching,
            start_barrier=True,
        )
        for i in range(producers)
    ]
    g.wait(lambda: all(p.count("ready") for p in procs), "producers ready")
    for p in procs:
        p.send("start")
    return procs


def setup_topic(
    root: str, opts: dict[str, Any], topic: str, partitions: int, ledger: int, **policies: Any
) -> None:
    with Client(root, storage_options=opts or None) as client:
        if ledger:
            policies["ledger_max_entries"] = ledger
        if policies:
            set_topic_policies(client.store, topic, **policies)
        create_topic(client.store, topic, partitions)


@pytest.mark.parametrize(
    ("partitions", "ledger"),
    [
        pytest.param(0, 0, id="1-topic-default-ledgers"),
        pytest.param(0, 5, id="1-topic-5-entry-ledgers", marks=pytest.mark.slow),
        pytest.param(4, 0, id="4-partitions-default-ledgers", marks=pytest.mark.slow),
        pytest.param(4, 5, id="4-partitions-5-entry-ledgers"),
    ],
)
def test_producers_every_acked_message_once_under_its_id(
    backend: tuple[str, str, dict[str, Any]],
    group_for: Callable[[str, dict[str, Any]], Group],
    partitions: int,
    ledger: int,
) -> None:
    """8 producer processes on one topic (or 4 partitions), default or 5-entry ledgers
    (rollovers race), ``send()`` and ``send_async()`` + ``flush()`` mixed, on local disk and
    on S3 (moto server). A producer that keeps losing commit races takes a commit turn
    (FORMAT.md, "Commit protocol"), so none fails its send with CommitConflict (with 8 on
    one S3 topic one used to lose every race for 30 s). ``FILEPULSAR_LONG=1`` runs 12.
    """
    name, root, opts = backend
    producers = PRODUCERS
    totals: Counter[str] = Counter()
    fewest_ledgers = sys.maxsize  # distinct ledgers holding a partition's stored messages
    for run in range(RUNS):
        topic = f"race-{run}"
        setup_topic(root, opts, topic, partitions, ledger)
        g = group_for(root, opts)
        procs = run_producers(g, topic, producers=producers, messages=MESSAGES[name], tag=f"r{run}")
        g.wait_all(procs, "done", "producers done")
        results = [p.result() for p in procs]
        stored = read_back(root, opts, topic)
        totals.update(check_produced(results, stored))
        keys = [_mid_key(mid) for _, mid in stored]  # (ledger, entry, partition, index)
        ledgers = Counter(part for part, _ in {(k[2], k[0]) for k in keys})
        fewest_ledgers = min(fewest_ledgers, min(ledgers.values()))
    f = record(
        f"producers/{name}/{'4 partitions' if partitions else '1 topic'}/"
        f"{'5-entry' if ledger else 'default'} ledgers",
        processes=producers,
        runs=RUNS,
        **totals,
        fewest_ledgers_per_partition=fewest_ledgers,
    )
    assert (f["lost"], f["duplicated"], f["wrong_id"], f["order"], f["send_errors"]) == (
        0,
        0,
        0,
        0,
        0,
    ), f
    if ledger:  # the 5-entry cases' point: rollovers raced, on every partition
        assert fewest_ledgers >= 4, f


def test_idle_producer_behind_the_kept_versions(
    backend: tuple[str, str, dict[str, Any]],
    group_for: Callable[[str, dict[str, Any]], Group],
) -> None:
    """A producer sends, waits (pipe barrier) while others commit far more than
    KEEP_VERSIONS (64) manifest versions, then sends again: all its messages are stored."""
    name, root, opts = backend
    topic = "idle"
    # A lease far longer than the test: no idle renewal refreshes the waiting producer's view.
    setup_topic(root, opts, topic, 0, 0, producer_lease_ms=600_000)
    g = group_for(root, opts)
    idle = g.start("idle", "produce", topic=topic, pid=0, n=4, mode="send", pause_after=1)
    g.wait(lambda: idle.count("paused") > 0, "idle producer paused")
    fast = [
        g.start(f"fast{i}", "produce", topic=topic, pid=i, n=50, mode="send") for i in (1, 2, 3)
    ]
    g.wait(lambda: all(p.count("done") for p in fast), "fast producers done")  # >150 commits
    idle.send("go")
    g.wait(lambda: idle.count("done") > 0, "idle producer done")
    results = [idle.result()] + [p.result() for p in fast]
    f = record(
        f"idle producer/{name}",
        processes=4,
        **check_produced(results, read_back(root, opts, topic)),
        idle_acked=len(results[0]["acked"]),
    )
    assert f["idle_acked"] == 4 and f["send_errors"] == 0, f
    assert (f["lost"], f["duplicated"], f["wrong_id"], f["order"]) == (0, 0, 0, 0), f


@pytest.mark.parametrize("sub_type", ["Shared", "KeyShared"])
def test_slow_and_idle_consumers_among_fast_ones(
    backend: tuple[str, str, dict[str, Any]],
    group_for: Callable[[str, dict[str, Any]], Group],
    sub_type: str,
) -> None:
    """Four consumer processes on one subscription: one slow (per-message work), one that
    stops before acknowledging its first message until the others acknowledged well over
    KEEP_VERSIONS messages, two fast. No acknowledged message is delivered again, every message
    is consumed, and on Key_Shared every key is delivered in order."""
    name, root, opts = backend
    topic, sub = "keyed", "s"
    # On S3 (every acknowledgement a commit to the moto server) 50 each still leave the
    # others well over 100 acknowledgements to make while the idle consumer holds its message.
    n_prod, n_msg = (6, 200) if LONG else (4, 75 if name == "local" else 50)
    total = n_prod * n_msg
    setup_topic(root, opts, topic, 0, 0)
    g = group_for(root, opts)
    common = {"topic": topic, "sub": sub, "type": sub_type}
    consumers = [
        g.start("slow", "consume", cname="slow", delay_ms=10, **common),
        # A lease far longer than the test: no renewal refreshes its view while it waits.
        g.start("idle", "consume", cname="idle", pause_after=1, lease_ms=600_000, **common),
        g.start("fast1", "consume", cname="fast1", **common),
        g.start("fast2", "consume", cname="fast2", **common),
    ]
    slow, idle, fast1, fast2 = consumers
    g.wait(lambda: all(c.count("ready") for c in consumers), "consumers subscribed")
    producers = run_producers(
        g, topic, producers=n_prod, messages=n_msg, tag="kp", keys=16, batching=False
    )

    def acked_by(cs: list[Proc]) -> set[str]:
        return {v for c in cs for v in c.values("a")}

    g.wait(lambda: idle.count("paused") > 0, "idle consumer holding a message")
    others = [slow, fast1, fast2]
    base = len(acked_by(others))
    # Each acknowledgement is one subscription commit: 100 of them put the idle consumer's
    # cached state well over KEEP_VERSIONS (64) versions behind.
    g.wait(lambda: len(acked_by(others)) >= base + 100, "others acking", 20, soft=True)
    idle_behind = len(acked_by(others)) - base
    idle.send("go")
    g.wait(lambda: all(p.count("done") for p in producers), "producers done")
    # Progress stopping (no worker prints for 20 s) is a finding, reported in the figures.
    complete = g.wait(lambda: len(acked_by(consumers)) >= total, "all acked", 20, soft=True)
    for c in consumers:
        c.send("stop")
    g.wait(lambda: all(c.count("done") for c in consumers), "consumers closed")
    produced = check_produced([p.result() for p in producers], read_back(root, opts, topic))
    results = [c.result() for c in consumers]
    figures, consumed = check_consumed([r["log"] for r in results], key_order=sub_type != "Shared")
    left = backlog(root, opts, topic, sub)
    again = drain(root, opts, topic, sub, left) if left else []
    f = record(
        f"consumers/{name}/{sub_type}",
        processes=n_prod + len(consumers),
        acked=produced["acked"],
        lost=produced["lost"],
        send_errors=produced["send_errors"],
        consumed=len(consumed),
        stalled=not complete,
        **figures,
        backlog_after=left,
        acked_redelivered_after=sum(1 for v in again if v in consumed),
        consumer_errors=sum(len(r["errors"]) for r in results),
        idle_behind_acks=idle_behind,
    )
    assert f["consumer_errors"] == 0, [r["errors"] for r in results]
    assert f["consumed"] == total and f["lost"] == 0 and f["send_errors"] == 0, f
    assert f["acked_redelivered"] == 0 and f["acked_redelivered_after"] == 0, f
    assert f["backlog_after"] == 0 and f["key_order"] == 0, f
    assert idle_behind > 64, f"the idle consumer did not fall behind: case not exercised {f}"


def test_retention_and_orphan_sweep_racing_producers_and_consumers(
    backend: tuple[str, str, dict[str, Any]],
    group_for: Callable[[str, dict[str, Any]], Group],
) -> None:
    """Retention (0/0: consumed closed ledgers go at once) and the orphan sweep run in a loop
    in another process while producers roll 5-entry ledgers and Shared consumers consume:
    nothing acknowledged is lost and nothing still needed is deleted."""
    name, root, opts = backend
    topic, sub = "retained", "s"
    n_prod, n_msg = (6, 200) if LONG else (4, 60 if name == "local" else 40)
    total = n_prod * n_msg
    setup_topic(root, opts, topic, 0, 5)
    g = group_for(root, opts)
    common = {"topic": topic, "sub": sub, "type": "Shared"}
    consumers = [g.start(f"c{i}", "consume", cname=f"c{i}", **common) for i in range(3)]
    g.wait(lambda: all(c.count("ready") for c in consumers), "consumers subscribed")
    # Orphans must be older than the age limit to go: above the longest send (checked
    # below, as the sweep's documentation requires), far below the default 24 h so that the
    # sweep does delete files during the run.
    age = ORPHAN_MIN_AGE_MS[name]
    keeper = g.start("keeper", "housekeep", topic=topic, orphan_min_age_ms=age)
    g.wait(lambda: keeper.count("ran") > 0, "housekeeper running")
    producers = run_producers(g, topic, producers=n_prod, messages=n_msg, tag="rp", keys=8)
    g.wait_all(producers, "done", "producers done")
    complete = g.wait(
        lambda: len({v for c in consumers for v in c.values("a")}) >= total,
        "every message acknowledged",
        20,
        soft=True,
    )
    # One whole housekeeping run after the last acknowledgement: the consumed ledgers must go
    # while the consumers' processes are still open.
    keeper.send("go")
    g.wait(lambda: keeper.count("synced") > 0, "housekeeping after the last ack")
    for c in consumers:
        c.send("stop")
    keeper.send("stop")
    g.wait(lambda: all(p.count("done") for p in [*consumers, keeper]), "consumers closed")
    results = [c.result() for c in consumers]
    figures, consumed = check_consumed([r["log"] for r in results], key_order=False)
    acked = {f"{pid}:{seq}" for pid, p in enumerate(producers) for seq, _ in p.result()["acked"]}
    try:  # what retention kept must still be readable
        stored_after: list[tuple[str, str]] | str = read_back(root, opts, topic)
    except FilePulsarError as e:
        stored_after = f"{type(e).__name__}: {e}"
    kept = keeper.result()
    f = record(
        f"retention racing/{name}",
        processes=n_prod + len(consumers) + 1,
        acked=len(acked),
        lost=len(acked - consumed),
        stalled=not complete,
        **figures,
        send_errors=sum(len(p.result()["errors"]) for p in producers),
        max_send_ms=max(p.result()["max_send_ms"] for p in producers),
        consumer_errors=sum(len(r["errors"]) for r in results),
        housekeeping_runs=kept["runs"],
        deleted_ledgers=kept["deleted_ledgers"],
        deleted_orphans=kept["deleted_orphans"],
        housekeeping_errors=len(kept["errors"]),
        stored_after=len(stored_after) if isinstance(stored_after, list) else stored_after,
        backlog_after=backlog(root, opts, topic, sub),
    )
    assert f["max_send_ms"] < age, f"a send outlasted the sweep's age: {f}"
    assert f["consumer_errors"] == 0, [r["errors"] for r in results]
    assert f["housekeeping_errors"] == 0, kept["errors"]
    assert f["send_errors"] == 0 and f["lost"] == 0 and len(acked) == total, f
    assert f["acked_redelivered"] == 0 and f["backlog_after"] == 0, f
    assert isinstance(stored_after, list), f  # no referenced file deleted
    assert f["deleted_ledgers"] > 0, f  # retention did run against live writers


# --------------------------------------------------------------------------- clocks
def test_skewed_clocks_within_bound(
    group_for: Callable[[str, dict[str, Any]], Group], tmp_path: Path
) -> None:
    """Writers and consumers whose clocks are off by up to a third of the lease work.

    The bound is the producers' (consumer leases do not depend on wall clocks: the tests
    below). It follows from the code: a producer lease is written as ``own clock + lease`` and
    renewed at least every third of the lease (on every commit and when idle), and another
    process drops it once ``its clock >= expiry``. So a lease survives while the pairwise skew
    ``other - owner`` stays below two thirds of the lease (20 s of the default 30 s), minus the
    owner's pauses. Here producers and consumers run at -10 s and +5 s (a
    pairwise skew of 15 s): every acknowledged message is stored once and consumed once.
    """
    root = str(tmp_path / "root")
    topic, sub = "skewed", "s"
    setup_topic(root, {}, topic, 0, 0)
    g = group_for(root, {})
    common = {"topic": topic, "sub": sub, "type": "Shared"}
    consumers = [
        g.start("c-behind", "consume", cname="behind", clock_skew_ms=-10_000, **common),
        g.start("c-ahead", "consume", cname="ahead", clock_skew_ms=5_000, **common),
    ]
    g.wait(lambda: all(c.count("ready") for c in consumers), "consumers subscribed")
    behind = g.start("p-behind", "produce", topic=topic, pid=0, n=60, clock_skew_ms=-10_000)
    ahead = g.start("p-ahead", "produce", topic=topic, pid=1, n=60, clock_skew_ms=5_000)
    g.wait(lambda: behind.count("done") > 0 and ahead.count("done") > 0, "producers done")
    g.wait(lambda: len({v for c in consumers for v in c.values("a")}) >= 120, "all consumed")
    for c in consumers:
        c.send("stop")
    g.wait(lambda: all(c.count("done") for c in consumers), "consumers closed")
    produced = check_produced([behind.result(), ahead.result()], read_back(root, {}, topic))
    results = [c.result() for c in consumers]
    figures, consumed = check_consumed([r["log"] for r in results], key_order=False)
    f = record(
        "skewed clocks -10 s/+5 s",
        processes=4,
        **produced,
        consumed=len(consumed),
        **figures,
        consumer_errors=sum(len(r["errors"]) for r in results),
    )
    assert f["acked"] == 120 and f["send_errors"] == 0 and f["consumer_errors"] == 0, f
    assert (f["lost"], f["duplicated"], f["wrong_id"], f["order"]) == (0, 0, 0, 0), f
    assert f["consumed"] == 120 and f["redelivered"] == 0, f


def test_producer_skewed_beyond_the_lease_is_fenced(
    group_for: Callable[[str, dict[str, Any]], Group], tmp_path: Path
) -> None:
    """A producer whose clock is behind by more than the lease writes leases that are already
    expired for everyone else: the next producer to register drops it, and its next send fails
    with ProducerFenced (FORMAT.md: a commit whose lease is missing fails). What it had
    acknowledged before stays stored; the failed send is not acknowledged."""
    root = str(tmp_path / "root")
    topic = "fenced"
    setup_topic(root, {}, topic, 0, 0)
    g = group_for(root, {})
    late = g.start(
        "late",
        "produce",
        topic=topic,
        pid=0,
        n=3,
        mode="send",
        pause_after=1,
        clock_skew_ms=-(DEFAULT_LEASE_MS + 1_000),
    )
    g.wait(lambda: late.count("paused") > 0, "skewed producer sent one message")
    other = g.start("other", "produce", topic=topic, pid=1, n=2, mode="send")
    g.wait(lambda: other.count("done") > 0, "a producer with a right clock registered")
    late.send("go")
    g.wait(lambda: late.count("done") > 0, "skewed producer finished")
    res = late.result()
    produced = check_produced([res, other.result()], read_back(root, {}, topic))
    record("skewed clock -31 s (beyond the lease)", processes=2, **produced)
    assert [seq for seq, _ in res["acked"]] == [0]
    assert len(res["errors"]) == 1 and res["errors"][0].startswith("ProducerFenced"), res
    assert "lost its registration" in res["errors"][0]
    assert produced["lost"] == 0 and produced["duplicated"] == 0 and produced["wrong_id"] == 0


# Consumer leases judged by the observer's monotonic clock (issue #31, defect 3): consumers
# whose machines' wall clocks are off by far more than the lease hold what they were given.
SKEWED_LEASE_MS = 3_000


def produce_here(root: str, topic: str, n: int) -> None:
    """``n`` messages ``0:<seq>`` with 16 keys, from this (unskewed) process."""
    with Client(root) as client:
        p = client.create_producer(topic, batching_enabled=False)
        for seq in range(n):
            p.send_async(f"0:{seq}".encode(), None, partition_key=f"k{seq % 16}")
        p.flush()


@pytest.mark.parametrize("skew_ms", [6_000, 60_000])
@pytest.mark.parametrize("typ", ["Shared", "KeyShared"])
def test_consumers_hold_their_messages_whatever_the_wall_clocks(
    group_for: Callable[[str, dict[str, Any]], Group], tmp_path: Path, typ: str, skew_ms: int
) -> None:
    """Two consumer processes whose whole wall clocks are ``-skew`` and ``+skew`` off (2x the
    lease and more, 3 s lease), both alive and renewing for several leases: no message is
    handed to the second while the first holds it, none acknowledged is delivered again, each
    is delivered once. (Leases judged by wall clocks: the one ahead took everything the one
    behind held at each of its commits, hundreds of messages delivered twice.)"""
    root = str(tmp_path / "root")
    topic, total = "skewed-consumers", 200
    setup_topic(root, {}, topic, 0, 0)
    g = group_for(root, {})
    common = {"topic": topic, "sub": "s", "type": typ, "lease_ms": SKEWED_LEASE_MS}
    # 40 ms of work per message: the run spans several leases (renewals under skew).
    consumers = [
        g.start(name, "consume", cname=name, wall_skew_ms=skew, delay_ms=40, **common)
        for name, skew in (("behind", -skew_ms), ("ahead", skew_ms))
    ]
    g.wait(lambda: all(c.count("ready") for c in consumers), "consumers subscribed")
    produce_here(root, topic, total)
    g.wait(lambda: len({v for c in consumers for v in c.values("a")}) >= total, "all consumed")
    for c in consumers:
        c.send("stop")
    g.wait(lambda: all(c.count("done") for c in consumers), "consumers closed")
    results = [c.result() for c in consumers]
    figures, consumed = check_consumed([r["log"] for r in results], key_order=typ == "KeyShared")
    f = record(
        f"{typ} consumers at -{skew_ms // 1000} s/+{skew_ms // 1000} s, lease 3 s",
        processes=2,
        consumed=len(consumed),
        **figures,
        per_consumer=[len(r["log"]) for r in results],
        consumer_errors=sum(len(r["errors"]) for r in results),
    )
    assert f["consumer_errors"] == 0, [r["errors"] for r in results]
    assert f["consumed"] == total and all(f["per_consumer"]), f
    assert (f["redelivered"], f["acked_redelivered"], f["key_order"]) == (0, 0, 0), f


@pytest.mark.parametrize("skew_ms", [6_000, 60_000])
def test_one_active_failover_consumer_and_a_busy_exclusive_whatever_the_wall_clocks(
    group_for: Callable[[str, dict[str, Any]], Group], tmp_path: Path, skew_ms: int
) -> None:
    """Failover: the active consumer's clock is ``-skew`` off, the standby's ``+skew``; the
    standby stays standby (wall-clock leases made both active: messages delivered twice).
    Exclusive: a second consumer whose clock is ahead is refused with ConsumerBusy while the
    first, whose clock is behind, is alive (wall-clock leases let it in)."""
    from filepulsar.dispatch.failover import active_consumer

    root = str(tmp_path / "root")
    topic, total = "skewed-failover", 150
    setup_topic(root, {}, topic, 0, 0)
    g = group_for(root, {})
    winner = active_consumer([("c1", 0), ("c2", 0)], -1, f"persistent://public/default/{topic}")
    names = [winner, "c2" if winner == "c1" else "c1"]  # the active one first, behind
    common = {"topic": topic, "sub": "s", "type": "Failover", "lease_ms": SKEWED_LEASE_MS}
    active = g.start("active", "consume", cname=names[0], wall_skew_ms=-skew_ms, **common)
    g.wait(lambda: active.count("ready") > 0, "the active consumer subscribed")
    standby = g.start(
        "standby", "consume", cname=names[1], wall_skew_ms=skew_ms, delay_ms=0, **common
    )
    g.wait(lambda: standby.count("ready") > 0, "the standby subscribed")
    produce_here(root, topic, total)
    g.wait(lambda: len(set(active.values("a")) | set(standby.values("a"))) >= total, "consumed")
    for c in (active, standby):
        c.send("stop")
    g.wait(lambda: all(c.count("done") for c in (active, standby)), "consumers closed")
    results = [c.result() for c in (active, standby)]
    figures, consumed = check_consumed([r["log"] for r in results], key_order=False)
    ex = {"topic": topic, "sub": "x", "type": "Exclusive", "lease_ms": SKEWED_LEASE_MS}
    first = g.start("first", "consume", cname="first", wall_skew_ms=-skew_ms, **ex)
    g.wait(lambda: first.count("ready") > 0, "the Exclusive consumer subscribed")
    second = g.start("second", "consume", cname="second", wall_skew_ms=skew_ms, **ex)
    g.wait(lambda: second.count("ready") + second.count("done") > 0, "the second one's answer")
    for c in (first, second):
        c.send("stop")
    g.wait(lambda: all(c.count("done") for c in (first, second)), "Exclusive consumers closed")
    refused = second.result()["errors"]
    f = record(
        f"Failover/Exclusive consumers at -{skew_ms // 1000} s/+{skew_ms // 1000} s, lease 3 s",
        processes=4,
        consumed=len(consumed),
        **figures,
        standby_received=len(results[1]["log"]),
        exclusive_refused=len(refused),
    )
    assert not results[0]["errors"] and not results[1]["errors"], results
    assert f["consumed"] == total and f["standby_received"] == 0, f
    assert f["redelivered"] == 0 and f["acked_redelivered"] == 0, f
    assert len(refused) == 1 and refused[0].startswith("ConsumerBusy"), refused
