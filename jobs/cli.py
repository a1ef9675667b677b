"""``filepulsar``: topic and subscription admin, produce and peek, from the shell.

Thin: parse arguments, call ``storage``, print. Examples::

    filepulsar --root data/pulsar topics create orders --partitions 4
    filepulsar --root data/pulsar topics update-partitioned-topic orders -p 8
    filepulsar --root data/pulsar topics list
    filepulsar --root data/pulsar topics stats orders
    filepulsar --root data/pulsar topics delete orders
    filepulsar --root data/pulsar produce orders --key k1 "hello" "world"
    filepulsar --root data/pulsar peek orders --count 5
    filepulsar --root data/pulsar policies set public/default retention_time_minutes=60
    filepulsar --root data/pulsar retention --sweep-orphans   # run it periodically
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from filepulsar.storage import (
    FilePulsarError,
    InvalidConfiguration,
    ManagedLedger,
    MessageId,
    Producer,
    Reader,
    TopicName,
    create_topic,
    delete_topic,
    effective_policies,
    jsontext,
    list_topics,
    open_blob_store,
    set_namespace_policies,
    set_topic_policies,
    update_partitioned_topic,
)
from filepulsar.storage.blobstore import BlobStore
from filepulsar.storage.retention import enforce_retention, sweep_orphans
from filepulsar.storage.subscription import (
    SubscriptionStore,
    list_subscriptions,
    subscription_backlog,
)
from filepulsar.storage.topics import managed_ledgers


class BadArgument(InvalidConfiguration):
    """A command-line argument the CLI cannot use; the message names it and what is allowed.
    Reported like a FilePulsarError: one ``error: ...`` line, exit code 2."""


def _store(args: argparse.Namespace) -> BlobStore:
    opts = None
    if args.storage_options:
        try:
            opts = jsontext.loads(args.storage_options)
        except ValueError as e:
            raise BadArgument(
                f"--storage-options must be a JSON object, got {_short(args.storage_options)} ({e})"
            ) from e
        if not isinstance(opts, dict):
            raise BadArgument(
                f"--storage-options must be a JSON object, got {_short(args.storage_options)}"
            )
    return open_blob_store(args.root, storage_options=opts)


def _short(value: str, limit: int = 80) -> str:
    """``repr(value)``, cut to about ``limit`` characters so an error stays one short line."""
    r = repr(value)
    return r if len(r) <= limit else f"{r[: limit - 20]}... ({len(value)} characters)"


def _properties(items: list[str] | None) -> dict[str, str] | None:
    """``--property name=value`` arguments as a dict."""
    if not items:
        return None
    props = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise BadArgument(f"--property must be name=value, got {item!r}")
        props[name] = value
    return props


def _policy_values(items: list[str]) -> dict[str, Any]:
    """``name=value`` policy arguments, each value JSON (a number, true/false, or a string in
    double quotes)."""
    values: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name or not raw:
            raise BadArgument(f"policy {item!r} must be name=value, value in JSON")
        try:
            values[name] = jsontext.loads(raw)
        except ValueError as e:
            raise BadArgument(
                f"policy {name}: value {_short(raw)} is not JSON; give a number, true/false, "
                "or a string in double quotes (e.g. auto_topic_creation_type='\"partitioned\"')"
            ) from e
    return values


def _orphan_min_age_ms(hours: float) -> int:
    if not math.isfinite(hours) or hours < 0:
        raise BadArgument(
            f"--orphan-min-age-hours must be a number >= 0, got {hours!r} "
            "(keep it above your longest Spark batch; small values are unsafe)"
        )
    return int(hours * 3600 * 1000)


def cmd_topics(args: argparse.Namespace) -> int:
    store = _store(args)
    if args.action == "create":
        t = create_topic(store, args.topic, partitions=args.partitions)
        print(f"created {t}" + (f" with {args.partitions} partitions" if args.partitions else ""))
    elif args.action == "update-partitioned-topic":
        old, new = update_partitioned_topic(store, args.topic, args.partitions)
        print(f"updated {TopicName.parse(args.topic)}: {old} -> {new} partitions")
    elif args.action == "list":
        tenant, _, ns = args.namespace.partition("/")
        for info in list_topics(store, tenant, ns):
            print(f"{info.name}\tpartitions={info.partitions}")
    elif args.action == "delete":
        delete_topic(store, args.topic, force=args.force)
        print(f"deleted {args.topic}")
    elif args.action == "stats":
        print(json.dumps(topic_stats(store, args.topic), indent=2))
    return 0


def topic_stats(store: BlobStore, name: str) -> dict[str, Any]:
    """Per-partition ledgers, messages, and each subscription's cursor and backlog."""
    out: dict[str, Any] = {"topic": str(TopicName.parse(name)), "partitions": {}}
    for t in managed_ledgers(store, name):
        ml = ManagedLedger(store, t)
        m = ml.state()
        subs = {}
        for sub in list_subscriptions(store, t):
            st = SubscriptionStore(store, t, sub)
            if not st.exists():
                continue
            s = st.latest()
            subs[sub] = {
                "type": s.sub_type,
                "markDelete": list(s.mark_delete),
                "backlog": subscription_backlog(ml, m, s),
                "consumers": [c.name for c in s.live_consumers(st.clock())],
            }
        out["partitions"][str(t)] = {
            "ledgers": len(m.ledgers),
            "messages": m.total_messages,
            "storedBytes": sum(lg.size for lg in m.ledgers),
            "lastMessageId": ":".join(map(str, m.last_position())),
            "subscriptions": subs,
        }
    return out


def cmd_produce(args: argparse.Namespace) -> int:
    props = _properties(args.property)
    store = _store(args)
    with Producer(store, args.topic) as p:
        for v in args.values:
            mid = p.send(v.encode(), properties=props, partition_key=args.key)
            print(mid)
    return 0


def cmd_peek(args: argparse.Namespace) -> int:
    start = MessageId.earliest
    if args.start:
        try:
            start = MessageId.parse(args.start)
        except ValueError as e:
            raise BadArgument(f"--start: {e}") from e
    store = _store(args)
    r = Reader(store, args.topic, start, start_message_id_inclusive=True)
    shown = 0
    while shown < args.count:
        t = r.read_batch(100, timeout_ms=0)
        if not t.num_rows:
            break
        for row in t.slice(0, args.count - shown).to_pylist():
            mid = MessageId(row["partition"], row["ledger_id"], row["entry_id"], row["batch_index"])
            value = row["value"]
            text = value.decode(errors="replace") if value is not None else None
            print(
                json.dumps(
                    {
                        "messageId": str(mid),
                        "key": row["key"],
                        "value": text,
                        "properties": dict(row["properties"] or []),
                        "publishTime": row["publish_time"],
                    }
                )
            )
            shown += 1
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    values = _policy_values(args.values) if args.action == "set" else {}
    store = _store(args)
    if args.action == "get":
        t = TopicName.parse(
            args.target
            if "/" not in args.target or "://" in args.target
            else f"persistent://{args.target}/_"
        )
        print(json.dumps(effective_policies(store, t).__dict__, indent=2))
        return 0
    if "://" in args.target or "/" not in args.target:
        set_topic_policies(store, args.target, **values)
    else:
        tenant, _, ns = args.target.partition("/")
        set_namespace_policies(store, tenant, ns, **values)
    print(f"set {values} on {args.target}")
    return 0


def cmd_retention(args: argparse.Namespace) -> int:
    """Run retention, TTL and subscription expiry (what Pulsar's broker does periodically),
    and optionally delete orphan files."""
    min_age_ms = _orphan_min_age_ms(args.orphan_min_age_hours)
    store = _store(args)
    out: dict[str, Any] = {}
    if not args.dry_run:
        out["retention"] = enforce_retention(store, args.topic).to_dict()
    if args.sweep_orphans or args.dry_run:
        out["orphans"] = sweep_orphans(
            store,
            args.topic,
            min_age_ms=min_age_ms,
            dry_run=args.dry_run,
        ).to_dict()
    print(json.dumps(out, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="filepulsar", description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="storage root: path, s3://..., memory://...")
    ap.add_argument("--storage-options", help="fsspec options as JSON (e.g. an S3 endpoint)")
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser(
        "topics", help="create, list, delete or describe topics; add partitions to one"
    )
    t.add_argument(
        "action", choices=["create", "list", "delete", "stats", "update-partitioned-topic"]
    )
    t.add_argument("topic", nargs="?", help="topic name (not for list)")
    t.add_argument(
        "-p",
        "--partitions",
        type=int,
        default=0,
        help="partition count (create; update-partitioned-topic: the new, larger count)",
    )
    t.add_argument("--namespace", default="public/default")
    t.add_argument("--force", action="store_true", help="delete even with live producers")
    t.set_defaults(func=cmd_topics)

    p = sub.add_parser("produce", help="publish messages given on the command line")
    p.add_argument("topic")
    p.add_argument("values", nargs="+")
    p.add_argument("--key")
    p.add_argument("--property", action="append", help="name=value (repeatable)")
    p.set_defaults(func=cmd_produce)

    k = sub.add_parser("peek", help="print messages without a subscription")
    k.add_argument("topic")
    k.add_argument("--count", type=int, default=10)
    k.add_argument("--start", help="message id to start at (default: earliest)")
    k.set_defaults(func=cmd_peek)

    pol = sub.add_parser("policies", help="get or set namespace (tenant/ns) or topic policies")
    pol.add_argument("action", choices=["get", "set"])
    pol.add_argument("target", help="tenant/namespace or a topic name")
    pol.add_argument(
        "values", nargs="*", help="name=value, value in JSON (strings in double quotes)"
    )
    pol.set_defaults(func=cmd_policies)

    r = sub.add_parser(
        "retention", help="apply retention, TTL and subscription expiry; sweep orphan files"
    )
    r.add_argument("topic", nargs="?", help="one topic (default: every topic)")
    r.add_argument(
        "--sweep-orphans",
        action="store_true",
        help="also delete data and index files no manifest references",
    )
    r.add_argument(
        "--orphan-min-age-hours",
        type=float,
        default=24.0,
        help="only sweep files older than this, >= 0 (default 24; keep it above your longest "
        "Spark batch: a small value can delete files a live writer has not committed yet)",
    )
    r.add_argument(
        "--dry-run", action="store_true", help="only report the orphans a sweep would delete"
    )
    r.set_defaults(func=cmd_retention)

    args = ap.parse_args(argv)
    if args.command == "topics" and args.action != "list" and not args.topic:
        ap.error(f"topics {args.action} needs a topic name")
    try:
        return int(args.func(args))
    except (FilePulsarError, BadArgument) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
