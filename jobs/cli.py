"""``filepulsar``: pulsar-admin's and pulsar-client's commands for topics stored as files.

Thin: parse arguments, call :mod:`filepulsar.connector.admin` or the client, print. Examples::

    export FILEPULSAR_URL=data/pulsar          # or --url, or url= in ./client.conf
    filepulsar topics create-partitioned-topic orders -p 4
    filepulsar namespaces set-retention public/default --time 3d --size 10G
    filepulsar produce orders -m hello -m world -k k1 -p source=cli
    filepulsar produce orders -f events.txt    # one message per line; -f - reads stdin
    filepulsar consume orders -s audit -p Earliest -n 0      # until Ctrl-C
    filepulsar topics stats orders
    filepulsar topics reset-cursor orders -s audit -t 2h
    filepulsar maintain --interval 5m --sweep-orphans   # the broker's background duties
    filepulsar notebook ./notebooks            # the example notebook, to open in Jupyter

Exit codes: 0 done; 1 an error (a missing topic or subscription, a refused operation,
damaged data); 2 bad usage (an unknown command or option, a malformed value); 130 stopped by
Ctrl-C; 141 the output pipe was closed (``| head``). Errors are one ``error: ...`` line on
stderr.

This module holds the argument parser and :func:`main`; the commands live by concept in
:mod:`~filepulsar.jobs.cli_admin` (tenants, namespaces, topics),
:mod:`~filepulsar.jobs.cli_messages` (produce, consume, peek) and
:mod:`~filepulsar.jobs.cli_ops` (policies, retention, maintain), over the shared
:mod:`~filepulsar.jobs.cli_support` (configuration, output, argument helpers).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from filepulsar.connector.admin.units import UnitError
from filepulsar.jobs.cli_admin import (
    cmd_namespaces,
    cmd_tenants,
    cmd_topic_policies,
    cmd_topics,
)
from filepulsar.jobs.cli_messages import (
    cmd_consume,
    cmd_peek,
    cmd_produce,
)
from filepulsar.jobs.cli_ops import (
    cmd_maintain,
    cmd_policies,
    cmd_retention,
)
from filepulsar.jobs.cli_schemas import cmd_schemas
from filepulsar.jobs.cli_support import (
    CONF_FILES,
    ENV_URL,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_PIPE,
    EXIT_USAGE,
    BadArgument,
    Parser,
    non_negative,
)
from filepulsar.jobs.notebook import cmd_notebook
from filepulsar.storage import (
    FilePulsarError,
    InvalidConfiguration,
    InvalidTopicName,
)


# ---------------------------------------------------------------------------- the parser
def _common(defaults: bool) -> Parser:
    """The connection and output options, accepted before or after the command."""
    p = Parser(add_help=False)
    d: dict[str, Any] = {} if defaults else {"default": argparse.SUPPRESS}
    p.add_argument(
        "--url",
        help=f"storage root: a path, s3://..., memory://... (else ${ENV_URL}, else url= in "
        f"{' or '.join(CONF_FILES)})",
        **d,
    )
    p.add_argument("--root", help="deprecated alias of --url", **d)
    p.add_argument("--storage-options", help="fsspec options as JSON (e.g. an S3 endpoint)", **d)
    p.add_argument(
        "--output",
        choices=["table", "json"],
        help="table (for people; default) or json (for scripts)",
        default="table" if defaults else argparse.SUPPRESS,
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    common = _common(False)
    doc = __doc__ or ""
    ap = Parser(
        prog="filepulsar",
        description=doc.splitlines()[0],
        epilog="Exit codes: 0 ok, 1 error, 2 usage, 130 Ctrl-C, 141 closed output pipe.",
        parents=[_common(True)],
    )
    sub = ap.add_subparsers(dest="command", required=True, parser_class=Parser)

    def group(name: str, help: str) -> argparse._SubParsersAction[Any]:
        g = sub.add_parser(name, help=help, parents=[common])
        return g.add_subparsers(dest="action", required=True, parser_class=Parser)

    def verb(g: argparse._SubParsersAction[Any], name: str, help: str) -> argparse.ArgumentParser:
        return g.add_parser(name, help=help, parents=[common])

    # tenants
    g = group("tenants", "list, create or delete tenants")
    verb(g, "list", "every tenant").set_defaults(func=cmd_tenants)
    for v, h in (("create", "register a tenant"), ("delete", "delete an empty tenant")):
        p = verb(g, v, h)
        p.add_argument("tenant")
        p.set_defaults(func=cmd_tenants)

    # namespaces
    g = group("namespaces", "namespaces and their policies (tenant/namespace)")

    def ns_verb(name: str, help: str) -> argparse.ArgumentParser:
        p = verb(g, name, help)
        p.add_argument("namespace", help="tenant/namespace" if name != "list" else "tenant")
        p.set_defaults(func=cmd_namespaces)
        return p

    ns_verb("list", "the namespaces of a tenant")
    ns_verb("create", "register a namespace")
    ns_verb("delete", "delete a namespace").add_argument(
        "-f", "--force", action="store_true", help="also delete its topics"
    )
    ns_verb("policies", "the policies set on it, as pulsar-admin's JSON")
    ns_verb("get-retention", "retention time (minutes) and size (MB)")
    p = ns_verb("set-retention", "keep consumed messages for a time / up to a size")
    p.add_argument("--time", "-t", help="e.g. 3d, 10h, 30m; bare number: seconds; -1 unlimited")
    p.add_argument("--size", "-s", help="e.g. 10G, 500M; bare number: bytes; -1 unlimited")
    ns_verb("remove-retention", "back to the default retention")
    p = ns_verb("set-message-ttl", "acknowledge messages older than the TTL")
    p.add_argument(
        "--ttl", "-ttl", "--messageTTL", required=True, help="e.g. 3600, 1h, 2d; 0 disables"
    )
    ns_verb("remove-message-ttl", "back to no TTL")
    for name, help in (
        ("set-deduplication", "drop messages whose sequence id a producer already stored"),
        ("set-delayed-delivery", "hold messages with a delivery time until it comes"),
        ("set-auto-topic-creation", "create missing topics on first produce or subscribe"),
    ):
        p = ns_verb(name, help)
        p.add_argument("--enable", "-e", action="store_true")
        p.add_argument("--disable", "-d", action="store_true")
        if name == "set-delayed-delivery":
            p.add_argument("--time", "-t", help="tick time, e.g. 1s (bare number: seconds)")
            p.add_argument(
                "--maxDelay",
                "-md",
                dest="max_delay",
                help="the longest delay a producer may ask for, e.g. 10m (0: no limit)",
            )
        if name == "set-auto-topic-creation":
            p.add_argument(
                "--type",
                "-t",
                default="non-partitioned",
                choices=["non-partitioned", "partitioned"],
            )
            p.add_argument("--num-partitions", "-n", type=non_negative("--num-partitions"))
    ns_verb("remove-delayed-delivery", "back to the default delayed delivery")
    p = ns_verb("set-subscription-expiration-time", "delete subscriptions inactive this long")
    p.add_argument("--time", "-t", required=True, help="e.g. 60 (minutes), 2h, 7d; 0 disables")
    p = ns_verb("set-max-message-size", "the largest message a producer may send")
    p.add_argument("--size", "-m", required=True, help="e.g. 1M, 5242880")

    # topics
    g = group("topics", "topics, their stats, messages and subscriptions")

    def t_verb(name: str, help: str, topic: bool = True) -> argparse.ArgumentParser:
        p = verb(g, name, help)
        if topic:
            p.add_argument("topic", help="topic name (short names are public/default)")
        p.set_defaults(func=cmd_topics)
        return p

    p = t_verb("list", "the topics of a namespace", topic=False)
    p.add_argument("namespace_pos", nargs="?", metavar="namespace", help="default public/default")
    p.add_argument("--namespace", default="public/default", help=argparse.SUPPRESS)
    for name, help in (
        ("create", "create a topic (-p N: partitioned)"),
        ("create-partitioned-topic", "create a partitioned topic"),
        ("update-partitioned-topic", "add partitions (the count only grows)"),
    ):
        p = t_verb(name, help)
        p.add_argument(
            "-p",
            "--partitions",
            type=non_negative("--partitions"),
            default=0 if name == "create" else None,
            required=name != "create",
            help="number of partitions",
        )
    p = t_verb("delete", "delete a non-partitioned topic and its data")
    p.add_argument("-f", "--force", action="store_true", help="even with connected clients")
    p = t_verb("delete-partitioned-topic", "delete a partitioned topic and its partitions")
    p.add_argument("-f", "--force", action="store_true", help="even with connected clients")
    p.add_argument(
        "-d", "--deleteSchema", dest="delete_schema", action="store_true", help=argparse.SUPPRESS
    )
    t_verb("compact", "compact the topic now (the latest message per key)")
    p = t_verb("compaction-status", "whether the topic has a compacted view")
    p.add_argument("-w", "--wait-complete", action="store_true", help=argparse.SUPPRESS)
    t_verb("stats", "message counts, storage size, subscriptions' backlogs (JSON)")
    t_verb("stats-internal", "ledgers and cursors (JSON)")
    p = t_verb("partitioned-stats", "totals over the partitions (JSON)")
    p.add_argument("--per-partition", action="store_true", help="each partition's stats too")
    p = t_verb("peek-messages", "show messages after a subscription's cursor, acknowledging none")
    p.add_argument("-s", "--subscription", help="default: from the start of the topic")
    p.add_argument("-n", "--count", type=non_negative("--count"), default=1)
    p = t_verb("examine-message", "show the message at a position from either end")
    p.add_argument(
        "-i",
        "--initialPosition",
        dest="initial_position",
        default="latest",
        help="earliest or latest (default; any case)",
    )
    p.add_argument("-m", "--messagePosition", dest="message_position", type=int, default=1)
    t_verb("subscriptions", "the subscriptions of a topic")
    p = t_verb("create-subscription", "create a subscription with no consumer")
    p.add_argument("-s", "--subscription")
    p.add_argument(
        "-m",
        "--messageId",
        dest="message_id",
        help="latest (default), earliest or ledger:entry:partition",
    )
    p = t_verb("unsubscribe", "delete a subscription")
    p.add_argument("-s", "--subscription")
    p.add_argument("-f", "--force", action="store_true", help="even with connected consumers")
    p = t_verb("reset-cursor", "move a subscription's cursor to a message or a time")
    p.add_argument("-s", "--subscription")
    p.add_argument(
        "-m", "--messageId", dest="message_id", help="ledger:entry:partition, earliest, latest"
    )
    p.add_argument("-t", "--time", help="back from now: 10m, 2h, 1d (bare number: minutes)")
    p = t_verb("skip", "skip messages of a subscription")
    p.add_argument("-s", "--subscription")
    p.add_argument("-n", "--count", type=non_negative("--count"))
    p = t_verb("clear-backlog", "skip every message of a subscription")
    p.add_argument("-s", "--subscription")
    p = t_verb("expire-messages", "acknowledge messages older than a time")
    p.add_argument("-s", "--subscription")
    p.add_argument("-t", "--expireTime", dest="time", help="seconds, or 10m, 2h ...")

    # topicPolicies (a topic's own policies; remove-* lets the namespace's apply again)
    g = group("topicPolicies", "a topic's own policies over its namespace's")

    def tp_verb(name: str, help: str) -> argparse.ArgumentParser:
        p = verb(g, name, help)
        p.add_argument("topic")
        p.set_defaults(func=cmd_topic_policies)
        if name.startswith("get-"):
            p.add_argument(
                "-ap", "--applied", action="store_true", help="the value in force, if not own"
            )
        return p

    p = tp_verb("set-retention", "keep consumed messages for a time / up to a size")
    p.add_argument("--time", "-t", required=True, help="e.g. 3d, 10h; -1 unlimited")
    p.add_argument("--size", "-s", required=True, help="e.g. 10G, 500M; -1 unlimited")
    p = tp_verb("set-message-ttl", "acknowledge messages older than the TTL")
    p.add_argument("--ttl", "-t", "-ttl", required=True, help="e.g. 3600, 1h; 0 disables")
    p = tp_verb("set-delayed-delivery", "delayed delivery on/off, tick and max delay")
    p.add_argument("--enable", "-e", action="store_true")
    p.add_argument("--disable", "-d", action="store_true")
    p.add_argument("--time", "-t", help="tick time, e.g. 1s (bare number: seconds)")
    p.add_argument("--maxDelay", "-md", dest="max_delay", help="e.g. 10m (0: no limit)")
    p = tp_verb("set-max-message-size", "the largest message a producer may send")
    p.add_argument("--max-message-size", "-m", dest="size", required=True, help="e.g. 1M")
    for what in ("retention", "message-ttl", "delayed-delivery", "max-message-size"):
        tp_verb(f"get-{what}", f"the topic's own {what} (null if none; -ap: in force)")
        tp_verb(f"remove-{what}", f"drop the topic's {what}: the namespace's applies")

    # schemas
    g = group("schemas", "a topic's value schema (pulsar-admin schemas)")
    p = verb(g, "upload", "add a schema version from pulsar-admin's schema file")
    p.add_argument("topic")
    p.add_argument(
        "-f", "--filename", required=True, help='JSON: {"type": ..., "schema": ..., ...}'
    )
    p.set_defaults(func=cmd_schemas)
    p = verb(g, "get", "the newest schema version (or -v N, or -a every version)")
    p.add_argument("topic")
    p.add_argument("-v", "--version", type=int)
    p.add_argument("-a", "--all-version", action="store_true")
    p.set_defaults(func=cmd_schemas)
    p = verb(g, "delete", "delete the schema (versions stay readable by old messages)")
    p.add_argument("topic")
    p.add_argument("-f", "--force", action="store_true", help="accepted, as pulsar-admin's")
    p.set_defaults(func=cmd_schemas)

    # produce / consume (pulsar-client)
    p = sub.add_parser("produce", help="publish messages", parents=[common])
    p.add_argument("topic")
    p.add_argument("values", nargs="*", help=argparse.SUPPRESS)  # the first CLI's form
    p.add_argument("-m", "--messages", action="append", help="a message (repeatable)")
    p.add_argument("-f", "--files", action="append", help="a file, one message per line; - stdin")
    p.add_argument("-n", "--num-produce", type=int, default=1, help="send everything N times")
    p.add_argument(
        "-db",
        "--disable-batching",
        action="store_true",
        help="one entry per message (default: batches of up to 1000 messages / 128 KB)",
    )
    p.add_argument("-k", "--key", help="the messages' key")
    p.add_argument("-p", "--property", action="append", help="k=v[,k2=v2] (repeatable)")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("consume", help="receive and acknowledge messages", parents=[common])
    p.add_argument("topic")
    p.add_argument("-s", "--subscription-name", dest="subscription", required=True)
    p.add_argument(
        "-t",
        "--subscription-type",
        default="Exclusive",
        help="Exclusive (default), Shared, Failover, Key_Shared (or KeyShared; any case)",
    )
    p.add_argument(
        "-p",
        "--subscription-position",
        default="Latest",
        help="Latest (default) or Earliest (any case)",
    )
    p.add_argument(
        "-n",
        "--num-messages",
        type=non_negative("--num-messages"),
        default=1,
        help="how many (default 1); 0: until Ctrl-C",
    )
    p.add_argument(
        "--start-timestamp",
        type=non_negative("--start-timestamp"),
        help="epoch ms: first move the subscription to the first message published then",
    )
    p.add_argument(
        "--end-timestamp",
        type=non_negative("--end-timestamp"),
        help="epoch ms: stop before the first message published after it",
    )
    p.set_defaults(func=cmd_consume)

    # the first CLI's commands
    p = sub.add_parser(
        "peek", help="JSON lines of messages from --start, no subscription", parents=[common]
    )
    p.add_argument("topic")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--start", help="message id to start at (default: earliest)")
    p.set_defaults(func=cmd_peek)

    p = sub.add_parser(
        "policies", help="get or set namespace or topic policies by name", parents=[common]
    )
    p.add_argument("action", choices=["get", "set"])
    p.add_argument("target", help="tenant/namespace or a topic name")
    p.add_argument("values", nargs="*", help="name=value, value in JSON (strings in double quotes)")
    p.set_defaults(func=cmd_policies)

    p = sub.add_parser(
        "retention",
        help="apply retention, TTL and subscription expiry; sweep orphan files",
        parents=[common],
    )
    p.add_argument("topic", nargs="?", help="one topic (default: every topic)")
    p.add_argument(
        "--sweep-orphans",
        action="store_true",
        help="also delete data and index files no manifest references",
    )
    p.add_argument(
        "--orphan-min-age-hours",
        type=float,
        default=24.0,
        help="only sweep files older than this, >= 0 (default 24; keep it above your longest "
        "Spark batch: a small value can delete files a live writer has not committed yet)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing: report the ledgers, subscriptions, cursors and orphan files a "
        "run would delete or move",
    )
    p.set_defaults(func=cmd_retention)

    p = sub.add_parser(
        "maintain",
        help="the broker's background duties: retention, TTL, subscription expiry, orphan "
        "sweeps, once or every --interval (one instance per scope works, by a lease)",
        parents=[common],
    )
    p.add_argument("scope", nargs="?", help="all (default), a tenant, or tenant/namespace")
    p.add_argument("--once", action="store_true", help="one run, then exit")
    p.add_argument("--interval", help="time between runs, e.g. 30s, 5m (default 2m)")
    p.add_argument("--runs", type=non_negative("--runs"), help="with --interval: stop after N runs")
    p.add_argument(
        "--sweep-orphans",
        action="store_true",
        help="also delete data and index files no manifest references",
    )
    p.add_argument(
        "--orphan-min-age-hours",
        type=float,
        default=24.0,
        help="only sweep files older than this, >= 0 (default 24; keep it above your longest "
        "Spark batch)",
    )
    p.add_argument(
        "--lease-time",
        default="60s",
        help="how long the lease lasts unrenewed: a killed instance blocks the others this "
        "long (default 60s, at least 1s)",
    )
    p.add_argument(
        "--wait", help="with --once: wait up to this long for the lease (default: do not wait)"
    )
    p.add_argument("--name", help="this instance's name in the lease (default host:pid:random)")
    p.set_defaults(func=cmd_maintain)

    p = sub.add_parser(
        "notebook",
        help="copy the example notebook shipped with the package into a folder",
        parents=[common],
    )
    p.add_argument("dir", help="the folder to write it to (created if missing)")
    p.add_argument("-f", "--force", action="store_true", help="replace a notebook of the same name")
    p.set_defaults(func=cmd_notebook)
    return ap


def _usage_error(e: FilePulsarError) -> bool:
    return isinstance(e, BadArgument | UnitError | InvalidConfiguration | InvalidTopicName)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (see the module docstring)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly; keep Python's exit-time flush of
        # stdout from failing again.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_PIPE


def _main(argv: list[str] | None) -> int:
    ap = build_parser()
    try:
        args, extra = ap.parse_known_args(argv)
        if extra and args.command == "produce" and not any(x.startswith("-") for x in extra):
            args.values = [*args.values, *extra]  # the first CLI's `produce t --key k v1 v2`
        elif extra:
            ap.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:
        return int(e.code or 0)
    if args.root and not args.url:
        args.url = args.root
    try:
        return int(args.func(args))
    except FilePulsarError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE if _usage_error(e) else EXIT_ERROR
    except BrokenPipeError:
        raise
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
