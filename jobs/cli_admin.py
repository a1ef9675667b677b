"""``filepulsar tenants|namespaces|topics``: pulsar-admin's resource commands
(:mod:`filepulsar.jobs.cli`).
"""

from __future__ import annotations

import argparse
import dataclasses

from filepulsar.connector.admin.units import parse_time
from filepulsar.dispatch.clock import SYSTEM, Clock
from filepulsar.dispatch.modes import InitialPosition
from filepulsar.jobs.cli_support import (
    EXIT_OK,
    BadArgument,
    open_admin,
    print_done,
    print_json,
    print_list,
    print_messages,
)
from filepulsar.storage import (
    TopicName,
)


# ---------------------------------------------------------------------------- tenants
def cmd_tenants(args: argparse.Namespace) -> int:
    tenants = open_admin(args).tenants()
    if args.action == "list":
        print_list(args, tenants.list())
    elif args.action == "create":
        tenants.create(args.tenant)
        print_done(args, f"created tenant {args.tenant}", tenant=args.tenant)
    else:
        tenants.delete(args.tenant)
        print_done(args, f"deleted tenant {args.tenant}", tenant=args.tenant)
    return EXIT_OK


# ---------------------------------------------------------------------------- namespaces
def _enable_flag(args: argparse.Namespace, what: str) -> bool:
    if args.enable == args.disable:
        raise BadArgument(f"{what}: give exactly one of --enable/-e and --disable/-d")
    return bool(args.enable)


def _retention_text(got: dict[str, int]) -> str:
    minutes, mb = got["retentionTimeInMinutes"], got["retentionSizeInMB"]
    return (
        f"{'unlimited time' if minutes == -1 else f'{minutes} minutes'}, "
        f"{'unlimited size' if mb == -1 else f'{mb} MB'}"
    )


def cmd_namespaces(args: argparse.Namespace) -> int:
    ns = open_admin(args).namespaces()
    a, name = args.action, args.namespace
    if a == "list":
        print_list(args, ns.list(name))
    elif a == "create":
        ns.create(name)
        print_done(args, f"created namespace {name}", namespace=name)
    elif a == "delete":
        ns.delete(name, force=args.force)
        print_done(args, f"deleted namespace {name}", namespace=name)
    elif a == "policies":
        print_json(ns.get_pulsar_policies(name))  # as pulsar-admin: JSON either way
    elif a == "get-retention":
        print_json(ns.get_retention(name))
    elif a == "set-retention":
        if args.time is None or args.size is None:
            raise BadArgument("set-retention needs --time (e.g. 3d, -1) and --size (e.g. 10G, -1)")
        got = ns.set_retention(name, time=args.time, size=args.size)
        print_done(args, f"set retention of {name}: {_retention_text(got)}", namespace=name, **got)
    elif a == "remove-retention":
        ns.remove_retention(name)
        print_done(args, f"removed the retention of {name}", namespace=name)
    elif a == "set-message-ttl":
        secs = ns.set_message_ttl(name, args.ttl)
        print_done(args, f"set message TTL of {name}: {secs} s", namespace=name, messageTTL=secs)
    elif a == "remove-message-ttl":
        ns.remove_message_ttl(name)
        print_done(args, f"removed the message TTL of {name}", namespace=name)
    elif a == "set-deduplication":
        on = _enable_flag(args, "set-deduplication")
        ns.set_deduplication_status(name, on)
        print_done(args, f"deduplication {'enabled' if on else 'disabled'} on {name}", enabled=on)
    elif a == "set-delayed-delivery":
        on = _enable_flag(args, "set-delayed-delivery")
        ns.set_delayed_delivery(name, on, args.time, args.max_delay)
        print_done(
            args, f"delayed delivery {'enabled' if on else 'disabled'} on {name}", enabled=on
        )
    elif a == "remove-delayed-delivery":
        ns.remove_delayed_delivery(name)
        print_done(args, f"removed the delayed delivery policy of {name}", namespace=name)
    elif a == "set-subscription-expiration-time":
        minutes = ns.set_subscription_expiration_time(name, args.time)
        print_done(args, f"set subscription expiration of {name}: {minutes} min", minutes=minutes)
    elif a == "set-max-message-size":
        size = ns.set_max_message_size(name, args.size)
        print_done(args, f"set max message size of {name}: {size} bytes", bytes=size)
    elif a == "set-auto-topic-creation":
        on = _enable_flag(args, "set-auto-topic-creation")
        ns.set_auto_topic_creation(name, on, args.type, args.num_partitions)
        print_done(
            args, f"auto topic creation {'enabled' if on else 'disabled'} on {name}", enabled=on
        )
    return EXIT_OK


# ---------------------------------------------------------------------------- topics
def _reset_time_ms(text: str, clock: Clock = SYSTEM) -> int:
    """``-t`` of reset-cursor: a duration back from ``clock``'s now (``10m``, ``2h``; a bare
    number is minutes, as pulsar-admin reads it)."""
    secs = parse_time(text, "--time", default_unit="m")
    return clock.now_ms() - secs * 1000


def cmd_topics(args: argparse.Namespace) -> int:
    admin = open_admin(args)
    t = admin.topics()
    a, topic = args.action, getattr(args, "topic", "")
    if a == "list":
        ns = args.namespace_pos or args.namespace
        rows = t.list_with_partitions(ns)
        if args.output == "json":
            print_json([{"topic": n, "partitions": p} for n, p in rows])
        else:
            for n, p in rows:
                print(f"{n}\tpartitions={p}")
    elif a in ("create", "create-partitioned-topic"):
        parts = args.partitions or 0
        if a == "create-partitioned-topic" and parts < 1:
            raise BadArgument("create-partitioned-topic needs -p/--partitions N, N >= 1")
        if parts:
            name = t.create_partitioned_topic(topic, parts)
        else:
            name = t.create_non_partitioned_topic(topic)
        extra = f" with {parts} partitions" if parts else ""
        print_done(args, f"created {name}{extra}", topic=name, partitions=parts)
    elif a == "update-partitioned-topic":
        old, new = t.update_partitioned_topic(topic, args.partitions)
        name = str(TopicName.parse(topic))
        print_done(args, f"updated {name}: {old} -> {new} partitions", topic=name, old=old, new=new)
    elif a == "delete":
        t.delete(topic, force=args.force)
        print_done(args, f"deleted {topic}", topic=topic)
    elif a == "delete-partitioned-topic":
        t.delete_partitioned_topic(topic, force=args.force)
        print_done(args, f"deleted {topic} and its partitions", topic=topic)
    elif a == "compact":
        reports = t.trigger_compaction(topic)
        name = str(TopicName.parse(topic))
        print_done(
            args,
            f"Topic compaction requested for {name}",
            topic=name,
            partitions=[dataclasses.asdict(r) for r in reports],
        )
    elif a == "compaction-status":
        status = t.compaction_status(topic)
        name = str(TopicName.parse(topic))
        if args.output == "json":
            print_json(status)
        elif status["status"] == "SUCCESS":
            print("Compaction was a success")
        else:
            print(f"Compaction has not been run for {name}")
    elif a == "stats":
        print_json(t.get_stats(topic))
    elif a == "stats-internal":
        print_json(t.get_internal_stats(topic))
    elif a == "partitioned-stats":
        print_json(t.get_partitioned_stats(topic, per_partition=args.per_partition))
    elif a == "peek-messages":
        msgs = t.peek_messages(topic, args.subscription, args.count)
        print_messages(args, msgs)
    elif a == "examine-message":
        where = InitialPosition.parse(args.initial_position, "-i/--initialPosition")
        m = t.examine_message(topic, where, args.message_position)
        print_messages(args, [m])
    elif a == "subscriptions":
        print_list(args, t.get_subscriptions(topic))
    elif a == "create-subscription":
        t.create_subscription(topic, _need_sub(args), args.message_id or "latest")
        print_done(args, f"created subscription {args.subscription} on {topic}")
    elif a == "unsubscribe":
        t.delete_subscription(topic, _need_sub(args), force=args.force)
        print_done(args, f"deleted subscription {args.subscription} on {topic}")
    elif a == "reset-cursor":
        sub = _need_sub(args)
        if (args.message_id is None) == (args.time is None):
            raise BadArgument("reset-cursor needs one of -m/--messageId and -t/--time")
        if args.message_id is not None:
            got = t.reset_cursor(topic, sub, message_id=args.message_id)
        else:
            got = t.reset_cursor(topic, sub, timestamp=_reset_time_ms(args.time))
        print_done(args, f"reset cursor of {sub} on {topic}", markDelete=got)
    elif a == "skip":
        if args.count is None:
            raise BadArgument("skip needs -n/--count N")
        skipped = t.skip_messages(topic, _need_sub(args), args.count)
        print_done(
            args,
            f"skipped {skipped} entries of {args.subscription} on {topic}",
            skippedEntries=skipped,
        )
    elif a == "clear-backlog":
        t.clear_backlog(topic, _need_sub(args))
        print_done(args, f"cleared the backlog of {args.subscription} on {topic}")
    elif a == "expire-messages":
        if args.time is None:
            raise BadArgument("expire-messages needs -t/--expireTime (e.g. 60, 10m)")
        secs = parse_time(args.time, "--expireTime")
        moved = t.expire_messages(topic, _need_sub(args), secs)
        print_done(args, f"expired messages older than {secs} s on {topic}", partitionsMoved=moved)
    return EXIT_OK


def _need_sub(args: argparse.Namespace) -> str:
    if not args.subscription:
        raise BadArgument(f"topics {args.action} needs -s/--subscription NAME")
    return str(args.subscription)


# ---------------------------------------------------------------------------- topicPolicies
def cmd_topic_policies(args: argparse.Namespace) -> int:
    """pulsar-admin ``topicPolicies``: ``get-*`` print JSON (``null`` when the topic has no
    value of its own), ``set-*`` and ``remove-*`` a confirmation line."""
    tp = open_admin(args).topic_policies()
    a, topic = args.action, args.topic
    verb, _, what = a.partition("-")
    if verb == "get":
        getter = getattr(tp, f"get_{what.replace('-', '_')}")
        print_json(getter(topic, applied=args.applied))
    elif verb == "remove":
        getattr(tp, f"remove_{what.replace('-', '_')}")(topic)
        print_done(args, f"removed the {what} of {topic}: its namespace's applies", topic=topic)
    elif a == "set-retention":
        got = tp.set_retention(topic, args.time, args.size)
        print_done(args, f"set retention of {topic}: {_retention_text(got)}", topic=topic, **got)
    elif a == "set-message-ttl":
        secs = tp.set_message_ttl(topic, args.ttl)
        print_done(args, f"set message TTL of {topic}: {secs} s", topic=topic, messageTTL=secs)
    elif a == "set-delayed-delivery":
        on = _enable_flag(args, "set-delayed-delivery")
        tp.set_delayed_delivery(topic, on, args.time, args.max_delay)
        print_done(
            args, f"delayed delivery {'enabled' if on else 'disabled'} on {topic}", enabled=on
        )
    elif a == "set-max-message-size":
        size = tp.set_max_message_size(topic, args.size)
        print_done(args, f"set max message size of {topic}: {size} bytes", bytes=size)
    return EXIT_OK
