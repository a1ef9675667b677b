"""``filepulsar policies|retention|maintain``: the storage's background duties, run by
hand or as a loop (:mod:`filepulsar.jobs.cli`).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

from filepulsar.connector.admin.units import parse_time
from filepulsar.dispatch.clock import SYSTEM, Clock
from filepulsar.jobs.cli_support import (
    EXIT_ERROR,
    EXIT_OK,
    BadArgument,
    json_default,
    open_admin,
    parse_orphan_min_age,
    parse_policy_values,
    print_json,
    print_rows,
    progress_bar,
)
from filepulsar.storage import (
    TopicName,
    effective_policies,
    set_namespace_policies,
    set_topic_policies,
)


def cmd_policies(args: argparse.Namespace) -> int:
    values = parse_policy_values(args.values) if args.action == "set" else {}
    store = open_admin(args).store
    if args.action == "get":
        t = TopicName.parse(
            args.target
            if "/" not in args.target or "://" in args.target
            else f"persistent://{args.target}/_"
        )
        print_json(effective_policies(store, t).__dict__)
        return EXIT_OK
    if "://" in args.target or "/" not in args.target:
        set_topic_policies(store, args.target, **values)
    else:
        tenant, _, ns = args.target.partition("/")
        set_namespace_policies(store, tenant, ns, **values)
    print(f"set {values} on {args.target}")
    return EXIT_OK


def cmd_retention(args: argparse.Namespace) -> int:
    """Run retention, TTL and subscription expiry (what Pulsar's broker does periodically),
    and optionally delete orphan files; a summary line each, the details with --output json."""
    min_age_ms = parse_orphan_min_age(args.orphan_min_age_hours)
    admin = open_admin(args)
    out: dict[str, Any] = {}
    with progress_bar("retention", None) as bar:
        rep = admin.enforce_retention(args.topic, progress=bar, dry_run=args.dry_run)
    out["retention"] = rep.to_dict()
    if args.output != "json":
        would = "would " if args.dry_run else ""
        if args.dry_run:
            for d in rep.deleted_ledgers:
                print(
                    f"  would delete {d.topic} ledger {d.ledger_id}: {d.messages} messages, "
                    f"{d.size} bytes"
                )
        print(
            f"retention: {rep.managed_ledgers} managed ledgers, {would}delete"
            f"{'' if would else 'd'} {len(rep.deleted_ledgers)} ledgers "
            f"({rep.deleted_messages} messages, {rep.deleted_bytes} bytes), {would}expire"
            f"{'' if would else 'd'} {len(rep.expired_subscriptions)} subscriptions, TTL "
            f"{would}move{'' if would else 'd'} {len(rep.ttl_acknowledged)} cursors, "
            f"{len(rep.failures)} failures"
        )
        for topic, err in rep.failures:
            print(f"  failed: {topic}: {err}")
    if args.sweep_orphans or args.dry_run:
        with progress_bar("orphan sweep", None) as bar:
            sweep = admin.sweep_orphans(
                args.topic, min_age_ms=min_age_ms, dry_run=args.dry_run, progress=bar
            )
        out["orphans"] = sweep.to_dict()
        if args.output != "json":
            verb = "would delete" if args.dry_run else "deleted"
            print(
                f"orphans: {sweep.managed_ledgers} managed ledgers, {verb} "
                f"{len(sweep.deleted)} files ({sweep.deleted_bytes} bytes), kept "
                f"{sweep.kept_young} younger files, {len(sweep.failures)} failures"
            )
    if args.output == "json":
        print_json(out)
    return EXIT_OK


def _duration_ms(text: str, what: str, *, minimum_s: int = 0) -> int:
    secs = parse_time(text, what)
    if secs < minimum_s:
        raise BadArgument(f"{what} must be at least {minimum_s} s, got {text!r}")
    return secs * 1000


def _clock(ms: int) -> str:
    import time

    return time.strftime("%H:%M:%S", time.localtime(ms / 1000))


def _maintain_rows(rep: dict[str, Any]) -> list[tuple[str, str, str]]:
    d = rep["details"]
    rows = [
        (
            "deleted ledger",
            x["topic"],
            f"ledger {x['ledger_id']}: {x['messages']} messages, {x['size']} bytes",
        )
        for x in d["deleted_ledgers"]
    ]
    rows += [
        (
            "expired subscription",
            x["topic"],
            f"{x['subscription']} (idle since {_clock(x['last_active_ms'])})",
        )
        for x in d["expired_subscriptions"]
    ]
    rows += [
        ("TTL moved cursor", x["topic"], f"{x['subscription']} to {x['ledger_id']}:{x['entry_id']}")
        for x in d["ttl_acknowledged"]
    ]
    rows += [("deleted orphan", x["key"], f"{x['bytes']} bytes") for x in d["deleted_orphans"]]
    rows += [("failed", x["topic"], x["error"]) for x in d["failures"]]
    return rows


def _stamp(ms: int) -> str:
    """A log line's time: ISO 8601 in UTC, to the second."""
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def _idle(rep: dict[str, Any]) -> bool:
    """A round that changed nothing and met no failure."""
    return rep["status"] == "done" and not _maintain_rows(rep)


def _print_round(args: argparse.Namespace, rep: dict[str, Any], stamp: str | None = None) -> None:
    """One round of ``maintain``: a JSON line, or what it did and a summary line. With
    ``stamp`` (the loop of ``--interval``: a daemon's log) each line starts with it and the
    rows are tab-separated lines rather than a table."""
    if args.output == "json":
        print(json.dumps(rep, default=json_default))
        sys.stdout.flush()
        return
    lead = f"{stamp} " if stamp else ""
    if rep["status"] == "standby":
        print(
            f"{lead}maintain {rep['scope']}: standby, the lease is held by "
            f"{rep['lease_holder']} until {_clock(rep['lease_expires_ms'])}"
        )
    else:
        rows = _maintain_rows(rep)
        if rows and stamp:
            for row in rows:
                print(lead + "\t".join(row))
        elif rows:
            print_rows(args, ["action", "topic", "detail"], rows)
        lost = " (lease lost: stopped early)" if rep["status"] == "lease lost" else ""
        print(
            f"{lead}maintain {rep['scope']}: {rep['topics']} topics, deleted "
            f"{rep['ledgers_deleted']} ledgers ({rep['messages_deleted']} messages, "
            f"{rep['bytes_deleted']} bytes), expired {rep['subscriptions_expired']} "
            f"subscriptions, TTL moved {rep['cursors_ttl_moved']} cursors, deleted "
            f"{rep['orphans_deleted']} orphan files ({rep['orphan_bytes']} bytes), "
            f"{rep['failures']} failures in {rep['seconds']} s{lost}"
        )
    sys.stdout.flush()


def cmd_maintain(args: argparse.Namespace, clock: Clock = SYSTEM) -> int:
    """Retention, TTL, subscription expiry and orphan sweeps for a scope, once or every
    ``--interval``, by whichever running instance holds the scope's lease. Time (the lease's wall
    clock, the waits between rounds) is read from and waited on ``clock``.

    With ``--interval`` the output is a daemon's log: each line starts with its UTC time, a
    round that changed nothing after the first prints nothing, a standby is said once per
    holder (``--output json`` prints every round and standby as a record)."""
    from filepulsar.jobs.maintain import Lease, Scope, default_holder, run_once

    if args.once and args.interval is not None:
        raise BadArgument("give --once or --interval, not both")
    if args.runs is not None and args.once:
        raise BadArgument("--runs counts rounds of --interval; --once is one run")
    interval_ms = _duration_ms(args.interval or "2m", "--interval")
    lease_ms = _duration_ms(args.lease_time, "--lease-time", minimum_s=1)
    wait_ms = _duration_ms(args.wait, "--wait") if args.wait else 0
    if args.wait and not args.once:
        raise BadArgument("--wait applies to --once (with --interval, standby retries anyway)")
    min_age_ms = parse_orphan_min_age(args.orphan_min_age_hours)
    scope = Scope.parse(args.scope)
    admin = open_admin(args)
    scope.namespaces(admin)  # an unknown tenant or namespace fails here, before any lease
    lease = Lease(
        admin, scope, args.name or default_holder(), lease_ms=lease_ms, clock=clock.now_ms
    )
    poll_s = max(0.2, min(interval_ms, lease_ms // 3) / 1000)
    worked = 0
    failures = 0
    standby_holder: str | None = None  # whose lease the last standby line named
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.getsignal(signal.SIGTERM) if in_main else None

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if in_main:
        signal.signal(signal.SIGTERM, on_term)
    try:
        deadline = clock.monotonic() + wait_ms / 1000
        while True:
            if lease.acquire():
                with progress_bar(f"maintain {scope}", None) as bar:
                    rep = run_once(
                        admin,
                        scope,
                        lease,
                        sweep_orphans=args.sweep_orphans,
                        orphan_min_age_ms=min_age_ms,
                        progress=bar,
                    )
                out = rep.to_dict()
                failures += len(rep.failures)
                # A daemon's log: timed lines; an idle round after the first says nothing
                # (table output; JSON lines are records and all come).
                quiet = not args.once and worked > 0 and _idle(out)
                if args.output == "json" or not quiet:
                    _print_round(args, out, None if args.once else _stamp(clock.now_ms()))
                standby_holder = None
                worked += 1
                if args.once or (args.runs is not None and worked >= args.runs):
                    break
                next_run = clock.monotonic() + interval_ms / 1000
                while (left := next_run - clock.monotonic()) > 0:
                    clock.sleep(min(left, poll_s))
                    if not lease.acquire():  # renew while waiting; lost: stand by
                        break
                continue
            # Try again when the holder's lease would expire (if it does not renew), or
            # sooner (its release on exit ends it at once).
            until_expiry_s = max(0.0, lease.state.expires_ms - clock.now_ms()) / 1000
            nap_s = min(poll_s, until_expiry_s + 0.05)
            if args.once and clock.monotonic() < deadline:
                clock.sleep(min(nap_s, max(0.0, deadline - clock.monotonic())))
                continue
            st = lease.state
            if args.output == "json" or args.once or st.holder != standby_holder:
                # (the loop's table output says it once per holder, not every poll)
                _print_round(
                    args,
                    {
                        "status": "standby",
                        "scope": str(scope),
                        "holder": lease.holder,
                        "lease_holder": st.holder,
                        "lease_expires_ms": st.expires_ms,
                    },
                    None if args.once else _stamp(clock.now_ms()),
                )
            standby_holder = st.holder
            if args.once:
                break
            clock.sleep(nap_s)
    finally:
        lease.release()
        if in_main:
            signal.signal(signal.SIGTERM, old_term)
    return EXIT_ERROR if failures else EXIT_OK
