"""``filepulsar maintain``: retention, TTL, expiry and orphan sweeps per scope, with real
policies set through the admin API, and several real instances (processes) sharing a lease."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from filepulsar.admin import Admin
from filepulsar.dispatch.clock import ManualClock
from filepulsar.jobs.cli import build_parser, main
from filepulsar.jobs.cli_admin import _reset_time_ms
from filepulsar.jobs.cli_ops import cmd_maintain
from filepulsar.storage import Producer, Reader, TopicName, create_topic, set_namespace_policies
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.commit import PendingEntry
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.subscription import SubscriptionConsumer

pytestmark = pytest.mark.unit

KB = 1024


def _script() -> list[str]:
    exe = Path(sys.executable).with_name("filepulsar")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-P", "-m", "filepulsar.jobs.cli"]


def _env(root: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FILEPULSAR_CONF"}
    env["FILEPULSAR_URL"] = root
    return env


def _fill(root: str, topic: str, n: int, size: int = 100) -> None:
    """``n`` messages of ``size`` bytes, one entry each (ledgers roll over per policy)."""
    store = open_blob_store(root)
    with Producer(store, topic, batching_enabled=False) as p:
        for i in range(n):
            p.send(b"%06d" % i + b"." * (size - 6))


def _ledgers(root: str, topic: str) -> list[dict[str, Any]]:
    return list(Admin(root).topics().get_internal_stats(topic)["ledgers"])


def _values(root: str, topic: str) -> list[int]:
    """The numbers of the messages a reader from the start sees."""
    r = Reader(open_blob_store(root), topic)
    out: list[int] = []
    try:
        while (t := r.read_batch(1000)).num_rows:
            out += [int(v[:6]) for v in t.column("value").to_pylist()]
    finally:
        r.close()
    return out


def _json_run(argv: list[str], capsys: Any) -> dict[str, Any]:
    assert main(["--output", "json", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    return dict(json.loads(lines[0]))


def test_maintain_applies_time_and_size_retention_per_scope(tmp_path: Path, capsys: Any) -> None:
    """Time-based retention 0 deletes every closed ledger (nothing subscribes: all consumed);
    1 h keeps them; size-based 1M keeps the newest ledgers holding at least 1 MiB; a
    namespace outside the scope is untouched until the scope covers it."""
    root = str(tmp_path)
    admin = Admin(root)
    ns = admin.namespaces()
    for name in ("acme/timed", "acme/hour", "acme/sized", "other/timed"):
        tenant, namespace = name.split("/")
        set_namespace_policies(open_blob_store(root), tenant, namespace, ledger_max_entries=2)
    ns.set_retention("acme/timed", time="0", size="-1")
    ns.set_retention("acme/hour", time="1h", size="-1")
    ns.set_retention("acme/sized", time="-1", size="1M")
    ns.set_retention("other/timed", time="0", size="-1")
    for name in ("acme/timed", "acme/hour", "other/timed"):
        _fill(root, f"persistent://{name}/t", 7)
    _fill(root, "persistent://acme/sized/t", 10, size=200 * KB)  # 5 ledgers of ~400 KiB

    rep = _json_run(["--url", root, "maintain", "acme", "--once"], capsys)
    assert rep["status"] == "done" and rep["scope"] == "acme" and rep["topics"] == 3
    deleted = {(d["topic"], d["ledger_id"]) for d in rep["details"]["deleted_ledgers"]}
    # timed: ledgers 0..2 closed (2 entries each) go, the open one (1 entry) stays
    timed = "persistent://acme/timed/t"
    assert {(timed, i) for i in range(3)} <= deleted
    assert [lg["ledgerId"] for lg in _ledgers(root, timed)] == [3]
    assert _values(root, timed) == [6]
    # an hour's retention: nothing goes yet
    hour = "persistent://acme/hour/t"
    assert not any(t == hour for t, _ in deleted)
    assert len(_ledgers(root, hour)) == 4 and _values(root, hour) == list(range(7))
    # size: the oldest ledgers go while what is left is still >= 1 MiB
    sized = "persistent://acme/sized/t"
    kept = _ledgers(root, sized)
    gone = sorted(i for t, i in deleted if t == sized)
    assert gone == list(range(len(gone))) and gone, "the oldest ledgers, in order"
    assert sum(lg["size"] for lg in kept) >= 1 << 20
    assert sum(lg["size"] for lg in kept[1:]) < 1 << 20 or not kept[0]["closed"]
    assert rep["ledgers_deleted"] == len(deleted) == 3 + len(gone)
    assert rep["messages_deleted"] == 6 + 2 * len(gone)
    # other/timed is outside the scope "acme"; the namespace scope then covers it
    assert len(_ledgers(root, "persistent://other/timed/t")) == 4
    rep = _json_run(["--url", root, "maintain", "other/timed", "--once"], capsys)
    assert rep["ledgers_deleted"] == 3 and rep["topics"] == 1
    assert _values(root, "persistent://other/timed/t") == [6]
    # a second run finds nothing more to do; the table output says so for people
    assert main(["--url", root, "maintain", "--once"]) == 0
    out = capsys.readouterr().out
    assert "maintain all: 4 topics, deleted 0 ledgers (0 messages" in out


def test_maintain_table_lists_what_it_deleted(tmp_path: Path, capsys: Any) -> None:
    root = str(tmp_path)
    set_namespace_policies(open_blob_store(root), "public", "default", ledger_max_entries=2)
    _fill(root, "t", 5)
    assert main(["--url", root, "maintain", "public/default", "--once"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [
        f"deleted ledger\tpersistent://public/default/t\tledger {i}: 2 messages, "
        f"{_size_of_ledger_bytes(lines[i])} bytes"
        for i in range(2)
    ]
    assert lines[2].startswith("maintain public/default: 1 topics, deleted 2 ledgers (4 messages")


def _size_of_ledger_bytes(line: str) -> str:
    return line.rsplit(", ", 1)[1].split(" ")[0]


def test_maintain_reads_and_waits_time_on_the_clock_it_is_given(
    tmp_path: Path, capsys: Any
) -> None:
    """Two rounds ten minutes apart on a manual clock: the wait between them is slept on that
    clock (no real waiting), and the reports are dated by it."""
    root = str(tmp_path)
    _fill(root, "t", 3)
    clock = ManualClock(start_ms=1_800_000_000_000)
    argv = ["--url", root, "--output", "json", "maintain", "--interval", "10m", "--runs", "2"]
    assert cmd_maintain(build_parser().parse_args(argv), clock=clock) == 0
    first, second = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert first["status"] == second["status"] == "done"
    assert first["started_ms"] == first["finished_ms"] == 1_800_000_000_000
    assert second["started_ms"] == 1_800_000_000_000 + 10 * 60 * 1000
    assert sum(clock.sleeps) == pytest.approx(600)


class _WritingClock(ManualClock):
    """A manual clock that runs ``between`` once, during the wait after the first round."""

    def __init__(self, start_ms: int, between: Any) -> None:
        super().__init__(start_ms=start_ms)
        self.between = between

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if self.between is not None and sum(self.sleeps) > 1200:  # in the third wait
            self.between, run = None, self.between
            run()


def test_maintain_loop_logs_timed_lines_and_is_quiet_when_idle(tmp_path: Path, capsys: Any) -> None:
    """The daemon (``--interval``): every line starts with its UTC time; the first round
    always reports, later rounds that changed nothing say nothing, a round that deleted
    something reports it again."""
    root = str(tmp_path)
    _fill(root, "t", 3)

    def more_ledgers() -> None:
        set_namespace_policies(open_blob_store(root), "public", "default", ledger_max_entries=2)
        _fill(root, "u", 5)

    clock = _WritingClock(1_800_000_000_000, more_ledgers)
    argv = ["--url", root, "maintain", "public/default", "--interval", "10m", "--runs", "5"]
    assert cmd_maintain(build_parser().parse_args(argv), clock=clock) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        "2027-01-15T08:00:00Z maintain public/default: 1 topics, deleted 0 ledgers"
    )
    # rounds 2 and 3 (08:10, 08:20) were idle; round 4 (08:30) deleted u's closed ledgers
    assert [x.split(" ", 1)[0] for x in lines[1:]] == ["2027-01-15T08:30:00Z"] * 3
    assert lines[1].endswith("2 messages, " + _size_of_ledger_bytes(lines[1]) + " bytes")
    assert "\tpersistent://public/default/u\tledger 0: 2 messages" in lines[1]
    assert " maintain public/default: 2 topics, deleted 2 ledgers (4 messages" in lines[3]
    # round 5 (08:40) was idle again: nothing after round 4's summary
    assert len(lines) == 4


def test_reset_cursor_time_is_back_from_the_clock_it_is_given() -> None:
    clock = ManualClock(start_ms=1_800_000_000_000)
    assert _reset_time_ms("10m", clock) == 1_800_000_000_000 - 600_000
    assert _reset_time_ms("2", clock) == 1_800_000_000_000 - 120_000  # a bare number: minutes


def test_maintain_sweeps_orphans_only_when_old_enough(tmp_path: Path, capsys: Any) -> None:
    """A blob a Spark task staged for a batch that never committed is an orphan: kept while
    younger than --orphan-min-age-hours (default 24), deleted with 0; committed data stays."""
    from filepulsar.storage import paths
    from filepulsar.storage.staged import stage

    root = str(tmp_path)
    store = open_blob_store(root)
    _fill(root, "sw", 3)
    t = TopicName.parse("sw")
    ml = ManagedLedger(store, t)
    raw = ml.read_entries(ml.state(), Position(0, 0))[0].raw
    data = bytes(store.get(paths.data_blob(t, ml.state().ledgers[0].fragments[0].blob)))
    entry = PendingEntry(
        parts=[data[raw.offset : raw.offset + raw.size]],
        size=raw.size,
        num_messages=1,
        publish_time=raw.header.publish_time,
        producer_name="sink",
        sequence_id=0,
        highest_sequence_id=0,
    )
    staged = stage(ml, [entry], "q1-b7-t0-a0")
    orphan = paths.data_blob(t, staged.blob)
    rep = _json_run(["--url", root, "maintain", "--once", "--sweep-orphans"], capsys)
    assert rep["orphans_deleted"] == 0 and store.exists(orphan)
    rep = _json_run(
        ["--url", root, "maintain", "--once", "--sweep-orphans", "--orphan-min-age-hours", "0"],
        capsys,
    )
    assert [d["key"] for d in rep["details"]["deleted_orphans"]] == [orphan]
    assert rep["orphan_bytes"] == rep["details"]["deleted_orphans"][0]["bytes"] > 0
    assert not store.exists(orphan) and _values(root, "sw") == [0, 1, 2]


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["maintain", "a/b/c", "--once"], 2, "scope 'a/b/c' is not valid; give all, a tenant"),
        (["maintain", "bad name", "--once"], 2, "tenant"),
        (["maintain", "nope", "--once"], 1, "tenant nope does not exist"),
        (["maintain", "public/nope", "--once"], 1, "namespace public/nope does not exist"),
        (["maintain", "--interval", "3x"], 2, "--interval: '3x' is not a duration"),
        (["maintain", "--once", "--lease-time", "0s"], 2, "--lease-time must be at least 1 s"),
        (["maintain", "--once", "--interval", "1m"], 2, "give --once or --interval, not both"),
        (["maintain", "--wait", "5s"], 2, "--wait applies to --once"),
        (["maintain", "--once", "--runs", "2"], 2, "--runs counts rounds of --interval"),
        (["maintain", "--once", "--orphan-min-age-hours", "-1"], 2, "must be a number >= 0"),
        (["maintain", "--once", "--runs", "x"], 2, "--runs must be an integer"),
    ],
)
def test_maintain_bad_input_is_one_line_and_nonzero(
    tmp_path: Path, capsys: Any, argv: list[str], code: int, message: str
) -> None:
    root = str(tmp_path)
    _fill(root, "t", 1)
    assert main(["--url", root, *argv]) == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "maintenance").exists() or argv[1:2] == ["nope"]  # no lease taken
    assert _values(root, "t") == [0]


# ---------------------------------------------------------------------------- processes
#: ``filepulsar`` that, once imported, says ``ready`` on stderr and waits for a line on stdin
#: before running its command: a start barrier for processes that must work at the same time.
_AT_THE_BARRIER = (
    "import sys\n"
    "from filepulsar.jobs.cli import main\n"
    "print('ready', file=sys.stderr, flush=True)\n"
    "sys.stdin.readline()\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


class Instance:
    """A ``filepulsar maintain --output json`` process whose JSON lines we read. With
    ``barrier``, it runs its command only once :meth:`wait_ready` saw it imported and
    :meth:`go` released it."""

    def __init__(self, root: str, name: str, *args: str, barrier: bool = False) -> None:
        self.name = name
        cmd = [sys.executable, "-P", "-c", _AT_THE_BARRIER] if barrier else _script()
        self.proc = subprocess.Popen(
            [*cmd, "--output", "json", "maintain", "--name", name, *args],
            env=_env(root),
            stdin=subprocess.PIPE if barrier else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_ready(self) -> None:
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        assert line == "ready\n", f"{self.name} did not reach the barrier: {line}"

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def next_report(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"{self.name} ended without a report: {err}")
        return dict(json.loads(line))

    def finish(self, timeout: float = 60) -> tuple[list[dict[str, Any]], str]:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        return [json.loads(x) for x in out.splitlines()], err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


@pytest.mark.procs
def test_a_killed_holder_blocks_the_others_only_until_its_lease_expires(tmp_path: Path) -> None:
    root = str(tmp_path)
    set_namespace_policies(open_blob_store(root), "public", "default", ledger_max_entries=2)
    _fill(root, "t", 3)
    a = Instance(root, "A", "--interval", "1s", "--lease-time", "3s")
    b = c = None
    try:
        first = a.next_report()
        assert first["status"] == "done" and first["ledgers_deleted"] == 1
        b = Instance(root, "B", "--once")
        [standby], _ = b.finish()
        assert standby["status"] == "standby" and standby["lease_holder"] == "A"
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        killed_ms = int(time.time() * 1000)
        _fill(root, "t", 2)  # more work: a ledger to delete for whoever takes over
        c = Instance(root, "C", "--once", "--wait", "30s")
        [done], _ = c.finish()
        assert done["status"] == "done" and done["holder"] == "C"
        assert done["ledgers_deleted"] == 1
        # A's lease held C off until it expired (at least until the expiry B saw), not longer
        # than one lease time after the kill (plus C's polling and a loaded machine's slack)
        assert done["started_ms"] >= standby["lease_expires_ms"]
        assert done["started_ms"] - killed_ms < 3000 + 3000
    finally:
        for p in (a, b, c):
            if p is not None:
                p.kill()


@pytest.mark.procs
def test_concurrent_instances_take_turns_and_do_each_deletion_once(tmp_path: Path) -> None:
    """Three instances on one scope: at any moment at most one works (their runs never
    overlap in time), each runs its two rounds in turn as the holder exits and releases the
    lease, and every ledger is deleted by exactly one run."""
    root = str(tmp_path)
    set_namespace_policies(open_blob_store(root), "public", "default", ledger_max_entries=1)
    for i in range(4):
        _fill(root, f"t{i}", 6)
    closed = {
        (f"persistent://public/default/t{i}", lg["ledgerId"])
        for i in range(4)
        for lg in _ledgers(root, f"t{i}")
        if lg["closed"]
    }
    assert len(closed) >= 4 * 5
    procs = [
        Instance(root, name, "--interval", "1s", "--runs", "2", "--lease-time", "10s")
        for name in ("A", "B", "C")
    ]
    try:
        results = {p.name: p.finish(timeout=120)[0] for p in procs}
    finally:
        for p in procs:
            p.kill()
    runs = [r for reports in results.values() for r in reports if r["status"] == "done"]
    assert sorted(r["holder"] for r in runs) == ["A", "A", "B", "B", "C", "C"]
    runs.sort(key=lambda r: r["started_ms"])
    for before, after in itertools.pairwise(runs):
        assert before["finished_ms"] <= after["started_ms"], (before, after)
    deleted = [(d["topic"], d["ledger_id"]) for r in runs for d in r["details"]["deleted_ledgers"]]
    assert len(deleted) == len(set(deleted)) and set(deleted) == closed
    assert all(r["failures"] == 0 for r in runs)
    # the standby reports name a live holder
    waits = [r for reports in results.values() for r in reports if r["status"] == "standby"]
    assert waits, "the instances ran at the same time: some stood by"
    assert all(
        w["lease_holder"] in ("A", "B", "C") and w["lease_holder"] != w["holder"] for w in waits
    )


def test_retention_dry_run_previews_what_a_run_deletes(tmp_path: Path, capsys: Any) -> None:
    """``retention --dry-run`` (and ``enforce_retention(dry_run=True)``) lists the ledgers a
    run would delete, the cursors TTL would move first and changes nothing; the real run then
    deletes exactly those."""
    root = str(tmp_path)
    store = open_blob_store(root)
    set_namespace_policies(store, "public", "default", ledger_max_entries=2, message_ttl_seconds=60)
    _fill(root, "t", 5)  # ledgers 0 and 1 closed (2 entries each), 2 open
    _fill(root, "u", 5)
    admin = Admin(root)
    admin.topics().create_subscription("t", "s", "earliest")
    later = int(time.time() * 1000) + 120_000  # everything is two minutes old then: TTL'd
    dry = admin.enforce_retention("t", now=later, dry_run=True)
    assert [(x.subscription, x.ledger_id, x.entry_id) for x in dry.ttl_acknowledged] == [
        ("s", 2, 0)
    ]
    assert [d.ledger_id for d in dry.deleted_ledgers] == [0, 1] and dry.deleted_files == 0
    assert len(_ledgers(root, "t")) == 3 and _values(root, "t") == [0, 1, 2, 3, 4]
    assert admin.topics().get_stats("t")["subscriptions"]["s"]["msgBacklog"] == 5
    real = admin.enforce_retention("t", now=later)
    assert [d.ledger_id for d in real.deleted_ledgers] == [0, 1]
    assert real.ttl_acknowledged == dry.ttl_acknowledged
    assert _values(root, "t") == [4]
    # The command line lists them (u: retention 0, no subscription: all consumed).
    assert main(["--url", root, "retention", "u", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [x.split(": ")[0] for x in out[:2]] == [
        "  would delete persistent://public/default/u ledger 0",
        "  would delete persistent://public/default/u ledger 1",
    ]
    assert out[2].startswith("retention: 1 managed ledgers, would delete 2 ledgers (4 messages")
    assert len(_ledgers(root, "u")) == 3


def _two_scopes_race(root: str) -> tuple[bool, bool]:
    """One race of ``maintain`` and ``maintain public/default`` over six topics of 40
    one-entry ledgers each, every message past its TTL, both released together: checks what
    the race must keep (see the test) and says whether each run deleted something."""
    set_namespace_policies(
        open_blob_store(root),
        "public",
        "default",
        ledger_max_entries=1,
        message_ttl_seconds=1,
    )
    topics = [f"t{i}" for i in range(6)]
    for t in topics:
        store = open_blob_store(root)
        create_topic(store, t)
        SubscriptionConsumer(store, TopicName.parse(t), "s", initial_position="Earliest").close()
        _fill(root, t, 40)
    closed = {
        (f"persistent://public/default/{t}", lg["ledgerId"])
        for t in topics
        for lg in _ledgers(root, t)
        if lg["closed"]
    }
    assert len(closed) >= 6 * 39
    time.sleep(1.1)  # the TTL of every message passes (a real wall clock: the child's)
    sweep = ("--sweep-orphans", "--orphan-min-age-hours", "0")
    a = Instance(root, "A", "--once", *sweep, barrier=True)
    b = Instance(root, "B", "public/default", "--once", *sweep, barrier=True)
    try:
        # Both imported and waiting: released together, neither can finish the work before
        # the other starts (Python's start-up under load took longer than a whole run).
        a.wait_ready()
        b.wait_ready()
        a.go()
        b.go()
        ([ra], err_a), ([rb], err_b) = a.finish(timeout=120), b.finish(timeout=120)
    finally:
        a.kill()
        b.kill()
    assert ra["status"] == rb["status"] == "done"
    assert ra["details"]["failures"] == [] and rb["details"]["failures"] == []
    for err in (err_a, err_b):
        assert "is gone" not in err and "no readable index" not in err, err
    deleted = [
        (d["topic"], d["ledger_id"]) for r in (ra, rb) for d in r["details"]["deleted_ledgers"]
    ]
    assert len(deleted) == len(set(deleted)) and set(deleted) == closed
    return bool(ra["details"]["deleted_ledgers"]), bool(rb["details"]["deleted_ledgers"])


@pytest.mark.procs
def test_two_scopes_racing_on_the_same_topics_count_each_others_deletions_as_done(
    tmp_path: Path,
) -> None:
    """Issue #31: two runs at once over the same topics (``maintain`` and ``maintain
    public/default`` hold different leases, so both work), each with TTL, retention and the
    orphan sweep. A ledger the other run deleted first is done, not a failure: neither run
    reports a failure or warns that an index is gone, and every closed ledger is deleted by
    exactly one of them. Released together, one run can still do all the work before the
    other gets a core on a loaded host (no race then, nothing proved): what both must keep
    is checked on every try, and the race is tried again (3 tries) until each run deleted
    some ledgers."""
    raced = []
    for attempt in range(3):
        raced = list(_two_scopes_race(str(tmp_path / f"try-{attempt}")))
        if all(raced):
            break
    # both ran at the same time: each deleted some
    assert raced == [True, True]
