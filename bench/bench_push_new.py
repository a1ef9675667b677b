"""The push dispatcher's steady-state delivery path alone (issue #27): from a look that found new
entries on a partition to each message in its owner's receiver queue.

Run: ``python -m bench.bench_push_new [consumers] [looks]`` (default 10 consumers, 2000 looks,
1.5 one-message entries a look on average: 1 and 2 in turn). ``consumers``
Key_Shared consumers of one subscription over one topic, not served by a dispatcher thread
(``FILEPULSAR_PUSH=0``): this thread plays the dispatcher's round itself (a partition's
``_Group.fetches`` and every consumer's ``push_wake``) after each commit, then receives and
acknowledges every message. It prints this thread's CPU per delivered message: the round
(``fetches`` + wake-ups, without the manifest look ``ManagedLedger.state``), the manifest
look, the fetches the round fell back to, and the receive + acknowledge; and how many entries
went straight to their owner (``take_new``) or were fetched.
"""

from __future__ import annotations

import itertools
import operator
import os
import shutil
import sys
import tempfile
import time
from typing import Any

os.environ["FILEPULSAR_PUSH"] = "0"

from filepulsar.connector.client import Client
from filepulsar.connector.client.consumer import push
from filepulsar.dispatch.modes import ConsumerType
from filepulsar.storage.ledger import ManagedLedger
from filepulsar.storage.subscription import InitialPosition
from filepulsar.storage.versioned.watch import drain_events

_STATE_NS = [0]
_PARTS: dict[str, int] = {}
#: Under valgrind (``IR=1``): the round runs inside ``itertools.starmap`` and the reads of
#: the states (the manifest's, the subscription's) inside ``operator.call``, C functions
#: nothing else here calls, so that ``callgrind --toggle-collect=starmap_next`` counts the
#: round's instructions alone and ``callgrind_annotate --inclusive=yes`` parts the states'.
_IR = os.environ.get("IR") == "1"
#: ``ACK=0``: messages are received, not acknowledged (no commit of acknowledgements
#: changes the state the looks read: the instructions counted do not depend on timing).
_ACK = os.environ.get("ACK", "0" if _IR else "1") == "1"
#: ``PROF=1``: cProfile of the rounds alone, printed at the end.
_PROF = None
if os.environ.get("PROF") == "1":
    import cProfile

    _PROF = cProfile.Profile()


def _timed(cls: Any, name: str, label: str) -> None:
    """Count the thread CPU of ``cls.name`` in ``_PARTS[label]`` (inclusive)."""
    fn = getattr(cls, name)

    def timed(*a: Any, **k: Any) -> Any:
        t = time.thread_time_ns()
        try:
            return fn(*a, **k)
        finally:
            _PARTS[label] = _PARTS.get(label, 0) + time.thread_time_ns() - t

    setattr(cls, name, timed)


def _timed_state() -> None:
    state = ManagedLedger.state

    def timed(self: Any, *a: Any, **k: Any) -> Any:
        t = time.thread_time_ns()
        try:
            if _IR:
                return operator.call(state, self, *a, **k)
            return state(self, *a, **k)
        finally:
            _STATE_NS[0] += time.thread_time_ns() - t

    ManagedLedger.state = timed  # type: ignore[method-assign]
    if _IR:
        from filepulsar.connector.client.consumer.facade import Consumer
        from filepulsar.storage import delivery, entry_cache
        from filepulsar.storage.subscription import SubscriptionConsumer

        # Each part of the round inside a C function of its own (its inclusive Ir is the
        # part's): accumulate_next the entries read, filterfalse_next the owners,
        # dropwhile_next the hand-over to each owner, takewhile_next the wake-ups.
        def through(kind: str, fn: Any) -> Any:
            def run(*a: Any, **k: Any) -> Any:
                out: list[Any] = []

                def call(*_: Any) -> bool:
                    out.append(fn(*a, **k))
                    return kind == "dropwhile" or kind == "filterfalse"

                if kind == "accumulate":
                    list(itertools.accumulate((0, 0), call))
                elif kind == "filterfalse":
                    list(itertools.filterfalse(call, (0,)))
                elif kind == "dropwhile":
                    list(itertools.dropwhile(call, (0,)))
                else:
                    list(itertools.takewhile(call, (0,)))
                return out[0]

            return run

        for cls, name, kind in (
            (entry_cache.EntryCache, "read_entries", "accumulate"),
            (delivery._StateView, "owners", "filterfalse"),
            (Consumer, "_push_new", "dropwhile"),
        ):
            setattr(cls, name, through(kind, getattr(cls, name)))

        for name in ("state", "state_stamp"):
            fn = getattr(SubscriptionConsumer, name)
            setattr(
                SubscriptionConsumer,
                name,
                lambda *a, fn=fn, **k: operator.call(fn, *a, **k),
            )
        return
    from filepulsar.storage import delivery, entry_cache

    _timed(delivery.KeySharedFilter, "look", "look")
    _timed(entry_cache.EntryCache, "read_entries", "read_entries")
    _timed(delivery._StateView, "owners", "owners")


def _round(group: Any, subs: list[Any]) -> Any:
    out, _ = group.fetches()
    if _IR:
        list(itertools.takewhile(lambda c: c._seat.push_wake() or True, subs))
    else:
        for c in subs:
            c._seat.push_wake()
    return out


def run(consumers: int = 10, looks: int = 2000) -> dict[str, float]:
    _timed_state()  # (before the filter binds the subscription's state readers)
    root = tempfile.mkdtemp(prefix="fp-bench-push-new-")
    try:
        client = Client(root)
        producer = client.create_producer("t", batching_enabled=False)
        subs = [
            client.subscribe(
                "t",
                "app",
                consumer_type=ConsumerType.KeyShared,
                initial_position=InitialPosition.Earliest,
                consumer_name=f"c{i}",
                # (no lease renewal in the run: a commit that would change the state looked at)
                consumer_lease_ms=3_600_000,
            )
            for i in range(consumers)
        ]
        group = push._Group(None)  # type: ignore[arg-type]  # (its waiter: only closed)
        for c in subs:
            group.members[c._seat] = c._topics.parts[0]
        # Settle: every consumer registered and recorded; the filter's first look.
        producer.send(b"x" * 64, partition_key="warm")
        for c in subs:
            c._push_fill(c._topics.parts)
        for c in subs:
            while True:
                try:
                    c.acknowledge(c.receive(50))
                except Exception:
                    break
        drain_events()
        group.fetches()
        # Every key seen once (live traffic repeats its keys: their slots and owners are
        # known), its message received.
        for k in range(1000):
            producer.send(b"x" * 64, partition_key=f"d{k}")
        for _ in range(3):
            drain_events()
            for target, part in group.fetches()[0]:
                target.push_fill([part])
            for c in subs:
                c._push_fill(c._topics.parts)
                while len(c._queue):
                    m = c.receive(0)
                    if _ACK:
                        c.acknowledge(m)
        _PARTS.clear()  # (from the first look timed on)
        sent = got = 0
        ns = {"round": 0, "fallback": 0, "receive": 0}
        handed0 = sum(c._topics.parts[0].sc.handed_directly for c in subs)
        fetched = 0
        for i in range(looks):
            for _ in range(1 + i % 2):
                producer.send(b"x" * 64, partition_key=f"d{sent % 1000}")
                sent += 1
            drain_events()
            _STATE_NS[0] = 0
            t = time.thread_time_ns()
            if _IR:
                (out,) = itertools.starmap(_round, [(group, subs)])
            elif _PROF is not None:
                _PROF.enable()
                out = _round(group, subs)
                _PROF.disable()
            else:
                out = _round(group, subs)
            ns["round"] += time.thread_time_ns() - t - _STATE_NS[0]
            ns["state"] = ns.get("state", 0) + _STATE_NS[0]
            t = time.thread_time_ns()
            for target, part in out:
                fetched += 1
                target.push_fill([part])
                target.push_wake()
            ns["fallback"] += time.thread_time_ns() - t
            t = time.thread_time_ns()
            for c in subs:
                while len(c._queue):
                    m = c.receive(0)
                    if _ACK:
                        c.acknowledge(m)
                    got += 1
            ns["receive"] += time.thread_time_ns() - t
        handed = sum(c._topics.parts[0].sc.handed_directly for c in subs) - handed0
        for c in subs:
            c.close()
        producer.close()
        client.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if got != sent:
        raise RuntimeError(f"{got} of {sent} messages delivered")
    return {
        **{f"{k}_us": v / got / 1e3 for k, v in ns.items()},
        **{f"{k}_us": v / got / 1e3 for k, v in _PARTS.items()},
        "handed": handed / got,
        "fallbacks": fetched / looks,
    }


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    looks = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    r = run(n, looks)
    print(
        f"{n} consumers, {looks} looks: per delivered message round {r['round_us']:.1f} us "
        f"(+ manifest look {r['state_us']:.1f}), fallback fetches {r['fallback_us']:.1f} us, "
        f"receive+ack {r['receive_us']:.1f} us; {r['handed']:.2f} handed directly, "
        f"{r['fallbacks']:.3f} fallback fetches a look"
    )
    if _IR:
        sys.exit(0)
    if _PROF is not None:
        import pstats

        pstats.Stats(_PROF).sort_stats("tottime").print_stats(45)
    after = r["round_us"] + r["state_us"] - r["look_us"]
    path = after + r["read_entries_us"] + r["owners_us"]
    print(
        f"of the round: look {r['look_us']:.1f} us (manifest look {r['state_us']:.1f}, "
        f"read_entries {r['read_entries_us']:.1f}, owners {r['owners_us']:.1f}); after the "
        f"look {after:.1f}; the path (entries read, owners, after the look) {path:.1f}"
    )
