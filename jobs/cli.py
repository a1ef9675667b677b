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

Exit codes: 0 done; 1 an error (a missing topic or subscription, a refused operation,
damaged data); 2 bad usage (an unknown command or option, a malformed value); 130 stopped by
Ctrl-C; 141 the output pipe was closed (``| head``). Errors are one ``error: ...`` line on
stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, NoReturn

import numpy as np
import pyarrow as pa

from filepulsar.connector.admin import Admin
from filepulsar.connector.units import UnitError, parse_time
from filepulsar.dispatch.modes import ConsumerType, InitialPosition
from filepulsar.storage import (
    FilePulsarError,
    InvalidConfiguration,
    InvalidTopicName,
    MessageId,
    Reader,
    TopicName,
    effective_policies,
    jsontext,
    set_namespace_policies,
    set_topic_policies,
)

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 130, 141
ENV_URL = "FILEPULSAR_URL"
ENV_CONF = "FILEPULSAR_CONF"
#: Where the client configuration is looked for (the first that exists), as pulsar's
#: ``client.conf``: ``url=...`` and optionally ``storageOptions={...}``.
CONF_FILES = ("client.conf", "~/.config/filepulsar/client.conf")
#: Bytes read from a file per bulk send in ``produce -f``.
CHUNK_BYTES = 16 << 20


class BadArgument(InvalidConfiguration):
    """A command-line argument the CLI cannot use; the message names it and what is allowed.
    Reported as one ``error: ...`` line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One ``error:`` line and exit code 2 (argparse's own prints the usage first)."""
        self.exit(EXIT_USAGE, f"error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------------------- configuration
def _conf_file() -> dict[str, str]:
    """``key=value`` lines of the first configuration file found ({} if none)."""
    env = os.environ.get(ENV_CONF)
    candidates = [env] if env else list(CONF_FILES)
    for name in candidates:
        path = Path(name).expanduser()
        if not path.is_file():
            if env:
                raise BadArgument(f"{ENV_CONF}={env}: no such file")
            continue
        out = {}
        for n, line in enumerate(path.read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise BadArgument(f"{path}:{n}: expected key=value, got {line!r}")
            out[key.strip()] = value.strip()
        out["__file__"] = str(path)
        return out
    return {}


def _short(value: str, limit: int = 80) -> str:
    """``repr(value)``, cut to about ``limit`` characters so an error stays one short line."""
    r = repr(value)
    return r if len(r) <= limit else f"{r[: limit - 20]}... ({len(value)} characters)"


def _storage_options(text: str | None, where: str) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        opts = jsontext.loads(text)
    except ValueError as e:
        raise BadArgument(f"{where} must be a JSON object, got {_short(text)} ({e})") from e
    if not isinstance(opts, dict):
        raise BadArgument(f"{where} must be a JSON object, got {_short(text)}")
    return opts


def _connection(args: argparse.Namespace) -> tuple[str, dict[str, Any] | None]:
    """The root URL and storage options: ``--url`` (or the old ``--root``), else
    ``$FILEPULSAR_URL``, else the configuration file."""
    conf: dict[str, str] | None = None
    url = next((u for u in (args.url, args.root) if u is not None), os.environ.get(ENV_URL))
    if url is None:
        conf = _conf_file()
        url = conf.get("url") or conf.get("webServiceUrl") or conf.get("brokerServiceUrl")
    if url is None:
        raise BadArgument(
            f"no storage root: give --url URL, set {ENV_URL}, or write url=... in "
            f"{' or '.join(CONF_FILES)}"
        )
    if args.storage_options:
        return url, _storage_options(args.storage_options, "--storage-options")
    conf = conf if conf is not None else _conf_file()
    where = f"storageOptions in {conf.get('__file__')}"
    return url, _storage_options(conf.get("storageOptions"), where)


def _admin(args: argparse.Namespace) -> Admin:
    url, opts = _connection(args)
    return Admin(url, storage_options=opts)


# ---------------------------------------------------------------------------- output
def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _print_rows(
    args: argparse.Namespace, headers: Sequence[str], rows: Sequence[Sequence[Any]]
) -> None:
    """A table: rich's on a terminal, tab-separated lines when piped, a JSON list of objects
    with ``--output json``."""
    if args.output == "json":
        _print_json([dict(zip(headers, r, strict=True)) for r in rows])
        return
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(*headers)
        for r in rows:
            table.add_row(*(_cell(v) for v in r))
        Console().print(table)
        return
    for r in rows:
        print("\t".join(_cell(v) for v in r))


def _cell(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, dict | list):
        return json.dumps(v, default=_json_default)
    return "" if v is None else str(v)


def _print_list(args: argparse.Namespace, items: list[str]) -> None:
    """Names one per line (pulsar-admin's list output), a JSON list with ``--output json``."""
    if args.output == "json":
        _print_json(items)
    else:
        for i in items:
            print(i)


def _done(args: argparse.Namespace, text: str, **details: Any) -> None:
    """A one-line confirmation, or its details as JSON."""
    if args.output == "json":
        _print_json(details or {"ok": True})
    else:
        print(text)


@contextmanager
def _progress(description: str, total: int | None, unit: str = "") -> Iterator[Callable[..., None]]:
    """A progress bar on stderr while it is a terminal; silent otherwise. Yields
    ``update(done, total=None)``."""
    if not sys.stderr.isatty():
        yield lambda done, total=None: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns: list[Any] = [TextColumn("{task.description}"), BarColumn()]
    columns.append(TextColumn("{task.percentage:>3.0f}%") if unit else MofNCompleteColumn())
    columns.append(TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)

        def update(done: int, total: int | None = None) -> None:
            if total is not None:
                bar.update(task, total=total)
            bar.update(task, completed=done)

        yield update


# ---------------------------------------------------------------------------- helpers
def _properties(items: list[str] | None) -> dict[str, str] | None:
    """``-p k=v`` arguments (each may hold several, comma separated, as pulsar-client's)."""
    if not items:
        return None
    props = {}
    for item in items:
        for part in item.split(","):
            name, sep, value = part.partition("=")
            if not sep or not name:
                raise BadArgument(f"--property must be name=value, got {part!r}")
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


def _positive(what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be an integer, got {text!r}") from None
        if n < 0:
            raise argparse.ArgumentTypeError(f"{what} must be >= 0, got {n}")
        return n

    return parse


def _message_json(m: dict[str, Any]) -> str:
    return json.dumps(
        {**m, "value": m["value"].decode(errors="replace") if m["value"] is not None else None},
        default=_json_default,
    )


# ---------------------------------------------------------------------------- tenants
def cmd_tenants(args: argparse.Namespace) -> int:
    tenants = _admin(args).tenants()
    if args.action == "list":
        _print_list(args, tenants.list())
    elif args.action == "create":
        tenants.create(args.tenant)
        _done(args, f"created tenant {args.tenant}", tenant=args.tenant)
    else:
        tenants.delete(args.tenant)
        _done(args, f"deleted tenant {args.tenant}", tenant=args.tenant)
    return EXIT_OK


# ---------------------------------------------------------------------------- namespaces
def _enable_flag(args: argparse.Namespace, what: str) -> bool:
    if args.enable == args.disable:
        raise BadArgument(f"{what}: give exactly one of --enable/-e and --disable/-d")
    return bool(args.enable)


def cmd_namespaces(args: argparse.Namespace) -> int:
    ns = _admin(args).namespaces()
    a, name = args.action, args.namespace
    if a == "list":
        _print_list(args, ns.list(name))
    elif a == "create":
        ns.create(name)
        _done(args, f"created namespace {name}", namespace=name)
    elif a == "delete":
        ns.delete(name, force=args.force)
        _done(args, f"deleted namespace {name}", namespace=name)
    elif a == "policies":
        pol = ns.get_policies(name)
        if args.output == "json":
            _print_json(pol)
        else:
            _print_rows(args, ["policy", "value"], sorted(pol.items()))
    elif a == "get-retention":
        _print_json(ns.get_retention(name))
    elif a == "set-retention":
        if args.time is None or args.size is None:
            raise BadArgument("set-retention needs --time (e.g. 3d, -1) and --size (e.g. 10G, -1)")
        got = ns.set_retention(name, time=args.time, size=args.size)
        _done(args, f"set retention of {name}: {got}", namespace=name, **got)
    elif a == "remove-retention":
        ns.remove_retention(name)
        _done(args, f"removed the retention of {name}", namespace=name)
    elif a == "set-message-ttl":
        secs = ns.set_message_ttl(name, args.ttl)
        _done(args, f"set message TTL of {name}: {secs} s", namespace=name, messageTTL=secs)
    elif a == "remove-message-ttl":
        ns.remove_message_ttl(name)
        _done(args, f"removed the message TTL of {name}", namespace=name)
    elif a == "set-deduplication":
        on = _enable_flag(args, "set-deduplication")
        ns.set_deduplication_status(name, on)
        _done(args, f"deduplication {'enabled' if on else 'disabled'} on {name}", enabled=on)
    elif a == "set-delayed-delivery":
        on = _enable_flag(args, "set-delayed-delivery")
        ns.set_delayed_delivery(name, on, args.time)
        _done(args, f"delayed delivery {'enabled' if on else 'disabled'} on {name}", enabled=on)
    elif a == "set-subscription-expiration-time":
        minutes = ns.set_subscription_expiration_time(name, args.time)
        _done(args, f"set subscription expiration of {name}: {minutes} min", minutes=minutes)
    elif a == "set-max-message-size":
        size = ns.set_max_message_size(name, args.size)
        _done(args, f"set max message size of {name}: {size} bytes", bytes=size)
    elif a == "set-auto-topic-creation":
        on = _enable_flag(args, "set-auto-topic-creation")
        ns.set_auto_topic_creation(name, on, args.type, args.num_partitions)
        _done(args, f"auto topic creation {'enabled' if on else 'disabled'} on {name}", enabled=on)
    return EXIT_OK


# ---------------------------------------------------------------------------- topics
def _reset_time_ms(text: str) -> int:
    """``-t`` of reset-cursor: a duration back from now (``10m``, ``2h``; a bare number is
    minutes, as pulsar-admin reads it)."""
    import time

    secs = parse_time(text, "--time", default_unit="m")
    return int(time.time() * 1000) - secs * 1000


def cmd_topics(args: argparse.Namespace) -> int:
    admin = _admin(args)
    t = admin.topics()
    a, topic = args.action, getattr(args, "topic", "")
    if a == "list":
        ns = args.namespace_pos or args.namespace
        rows = t.list_with_partitions(ns)
        if args.output == "json":
            _print_json([{"topic": n, "partitions": p} for n, p in rows])
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
        _done(args, f"created {name}{extra}", topic=name, partitions=parts)
    elif a == "update-partitioned-topic":
        old, new = t.update_partitioned_topic(topic, args.partitions)
        name = str(TopicName.parse(topic))
        _done(args, f"updated {name}: {old} -> {new} partitions", topic=name, old=old, new=new)
    elif a == "delete":
        t.delete(topic, force=args.force)
        _done(args, f"deleted {topic}", topic=topic)
    elif a == "stats":
        _print_json(t.get_stats(topic))
    elif a == "stats-internal":
        _print_json(t.get_internal_stats(topic))
    elif a == "partitioned-stats":
        _print_json(t.get_partitioned_stats(topic, per_partition=args.per_partition))
    elif a == "peek-messages":
        msgs = t.peek_messages(topic, args.subscription, args.count)
        _print_messages(args, msgs)
    elif a == "examine-message":
        where = InitialPosition.parse(args.initial_position, "-i/--initialPosition")
        m = t.examine_message(topic, where, args.message_position)
        _print_messages(args, [m])
    elif a == "subscriptions":
        _print_list(args, t.get_subscriptions(topic))
    elif a == "create-subscription":
        t.create_subscription(topic, _need_sub(args), args.message_id or "latest")
        _done(args, f"created subscription {args.subscription} on {topic}")
    elif a == "unsubscribe":
        t.delete_subscription(topic, _need_sub(args), force=args.force)
        _done(args, f"deleted subscription {args.subscription} on {topic}")
    elif a == "reset-cursor":
        sub = _need_sub(args)
        if (args.message_id is None) == (args.time is None):
            raise BadArgument("reset-cursor needs one of -m/--messageId and -t/--time")
        if args.message_id is not None:
            got = t.reset_cursor(topic, sub, message_id=args.message_id)
        else:
            got = t.reset_cursor(topic, sub, timestamp=_reset_time_ms(args.time))
        _done(args, f"reset cursor of {sub} on {topic}", markDelete=got)
    elif a == "skip":
        if args.count is None:
            raise BadArgument("skip needs -n/--count N")
        skipped = t.skip_messages(topic, _need_sub(args), args.count)
        _done(
            args,
            f"skipped {skipped} entries of {args.subscription} on {topic}",
            skippedEntries=skipped,
        )
    elif a == "clear-backlog":
        t.clear_backlog(topic, _need_sub(args))
        _done(args, f"cleared the backlog of {args.subscription} on {topic}")
    elif a == "expire-messages":
        if args.time is None:
            raise BadArgument("expire-messages needs -t/--expireTime (e.g. 60, 10m)")
        secs = parse_time(args.time, "--expireTime")
        moved = t.expire_messages(topic, _need_sub(args), secs)
        _done(args, f"expired messages older than {secs} s on {topic}", partitionsMoved=moved)
    return EXIT_OK


def _need_sub(args: argparse.Namespace) -> str:
    if not args.subscription:
        raise BadArgument(f"topics {args.action} needs -s/--subscription NAME")
    return str(args.subscription)


def _print_messages(args: argparse.Namespace, msgs: list[dict[str, Any]]) -> None:
    if args.output == "json":
        for m in msgs:
            print(_message_json(m))
        return
    rows = [(m["messageId"], m["key"], m["properties"], m["value"]) for m in msgs]
    _print_rows(args, ["messageId", "key", "properties", "value"], rows)


# ---------------------------------------------------------------------------- produce
def _lines_table(chunk: bytes) -> pa.Array:
    """``chunk`` (whole lines, each ending in ``\\n``) as a binary array of the lines without
    their ``\\n`` or ``\\r\\n``, built without a Python loop per line."""
    data = np.frombuffer(chunk, dtype=np.uint8)
    ends = np.flatnonzero(data == 10)  # index of each '\n'
    starts = np.concatenate(([0], ends[:-1] + 1))
    cr = np.zeros(len(ends), dtype=bool)
    has_prev = ends > starts
    cr[has_prev] = data[ends[has_prev] - 1] == 13
    ends_wo = ends - cr
    keep = np.ones(len(data), dtype=bool)
    keep[ends] = False
    keep[ends[cr] - 1] = False
    values = data[keep]
    lengths = ends_wo - starts
    offsets = np.zeros(len(ends) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(
        pa.large_binary(), len(ends), [None, pa.py_buffer(offsets), pa.py_buffer(values.tobytes())]
    ).cast(pa.binary())


def _read_lines(stream: IO[bytes]) -> Iterator[tuple[pa.Array, int]]:
    """Chunks of whole lines of ``stream`` as arrays, with the bytes they came from."""
    rest = b""
    while True:
        block = stream.read(CHUNK_BYTES)
        if not block:
            break
        block = rest + block
        cut = block.rfind(b"\n") + 1
        rest = block[cut:]
        if cut:
            yield _lines_table(block[:cut]), cut
    if rest:
        yield _lines_table(rest + b"\n"), len(rest)


def cmd_produce(args: argparse.Namespace) -> int:
    from filepulsar.connector.client import Client

    props = _properties(args.property)
    messages = list(args.values or []) + list(args.messages or [])
    if not messages and not args.files:
        raise BadArgument("produce needs messages: -m TEXT (repeatable) or -f FILE (- for stdin)")
    if args.num_produce < 1:
        raise BadArgument(f"-n/--num-produce must be >= 1, got {args.num_produce}")
    if "-" in (args.files or []) and args.num_produce > 1:
        raise BadArgument("-n cannot repeat stdin (-f -); give a file")
    for f in args.files or []:
        if f != "-" and not os.path.isfile(f):
            raise BadArgument(f"-f {f}: no such file")
    url, opts = _connection(args)
    client = Client(url, storage_options=opts)
    total = 0
    first = last = None
    try:
        producer = client.create_producer(args.topic)

        def send(values: pa.Array) -> None:
            nonlocal total, first, last
            cols: dict[str, pa.Array] = {"value": values}
            n = len(values)
            if args.key is not None:
                cols["key"] = pa.array([args.key] * n, pa.string())
            if props:
                cols["properties"] = pa.array(
                    [list(props.items())] * n, pa.map_(pa.string(), pa.string())
                )
            ids = producer.send_table(pa.table(cols))
            total += n
            if n:
                row = ids.slice(n - 1, 1).to_pylist()[0]
                last = str(
                    MessageId(
                        row["ledger_id"], row["entry_id"], row["partition"], row["batch_index"]
                    )
                )
                if first is None:
                    r0 = ids.slice(0, 1).to_pylist()[0]
                    first = str(
                        MessageId(
                            r0["ledger_id"], r0["entry_id"], r0["partition"], r0["batch_index"]
                        )
                    )

        if messages:
            values = pa.array([m.encode() for m in messages] * args.num_produce, pa.binary())
            send(values)
        for f in args.files or []:
            for _ in range(args.num_produce):
                if f == "-":
                    for values, _used in _read_lines(sys.stdin.buffer):
                        send(values)
                    continue
                size = os.path.getsize(f)
                with (
                    open(f, "rb") as stream,
                    _progress(f"produce {os.path.basename(f)}", size, "bytes") as bar,
                ):
                    done = 0
                    for values, used in _read_lines(stream):
                        send(values)
                        done += used
                        bar(done)
        producer.close()
    finally:
        client.close()
    _done(
        args,
        f"produced {total} messages to {TopicName.parse(args.topic)}",
        topic=str(TopicName.parse(args.topic)),
        produced=total,
        firstMessageId=first,
        lastMessageId=last,
    )
    return EXIT_OK


# ---------------------------------------------------------------------------- consume
def cmd_consume(args: argparse.Namespace) -> int:
    from filepulsar.connector.client import Client, ConsumerBatchReceivePolicy

    kind = ConsumerType.parse(args.subscription_type, "-t/--subscription-type")
    where = InitialPosition.parse(args.subscription_position, "-p/--subscription-position")
    url, opts = _connection(args)
    client = Client(url, storage_options=opts)
    want = args.num_messages  # 0: until stopped
    got = 0
    out = sys.stdout.buffer
    as_json = args.output == "json"
    consumer = None
    # Ctrl-C sets a flag the loop checks between batches, so a batch that was printed is
    # always acknowledged before the consumer closes (no redelivery of what was shown).
    stop = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    try:
        consumer = client.subscribe(
            args.topic,
            args.subscription,
            consumer_type=kind,
            initial_position=where,
            batch_receive_policy=ConsumerBatchReceivePolicy(10_000, -1, 100),
        )
        cumulative = kind in (ConsumerType.Exclusive, ConsumerType.Failover)
        while (want == 0 or got < want) and not stop:
            batch = consumer.batch_receive()
            if not batch:
                continue
            if want:
                batch = batch[: want - got]
            if as_json:
                text = "".join(
                    json.dumps(
                        {
                            "messageId": str(m.message_id()),
                            "topic": m.topic_name(),
                            "key": m.partition_key() if m.has_key() else None,
                            "value": m.data().decode(errors="replace"),
                            "properties": m.properties(),
                            "publishTime": m.publish_timestamp(),
                            "eventTime": m.event_timestamp() or None,
                            "redeliveryCount": m.redelivery_count(),
                        }
                    )
                    + "\n"
                    for m in batch
                )
                out.write(text.encode())
            else:
                out.write(b"".join(m.data() + b"\n" for m in batch))
            out.flush()  # acknowledge only what reached the output
            if cumulative:
                lasts: dict[str, Any] = {}
                for m in batch:
                    lasts[m.topic_name()] = m
                for m in lasts.values():
                    consumer.acknowledge_cumulative(m)
            else:
                consumer.acknowledge(batch)
            got += len(batch)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if consumer is not None:
            consumer.close()
        client.close()
        if got and sys.stderr.isatty():
            print(f"consumed {got} messages", file=sys.stderr)
    if stop:
        print(f"interrupted after {got} messages", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


# ---------------------------------------------------------------------------- older commands
def cmd_peek(args: argparse.Namespace) -> int:
    """The first command's ``peek`` (kept): JSON lines from ``--start`` without a
    subscription; ``topics peek-messages`` is pulsar-admin's."""
    start = MessageId.earliest
    if args.start:
        try:
            start = MessageId.parse(args.start)
        except ValueError as e:
            raise BadArgument(f"--start: {e}") from e
    admin = _admin(args)
    r = Reader(admin.store, args.topic, start, start_message_id_inclusive=True)
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
    return EXIT_OK


def cmd_policies(args: argparse.Namespace) -> int:
    values = _policy_values(args.values) if args.action == "set" else {}
    store = _admin(args).store
    if args.action == "get":
        t = TopicName.parse(
            args.target
            if "/" not in args.target or "://" in args.target
            else f"persistent://{args.target}/_"
        )
        _print_json(effective_policies(store, t).__dict__)
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
    min_age_ms = _orphan_min_age_ms(args.orphan_min_age_hours)
    admin = _admin(args)
    out: dict[str, Any] = {}
    if not args.dry_run:
        with _progress("retention", None) as bar:
            rep = admin.enforce_retention(args.topic, progress=bar)
        out["retention"] = rep.to_dict()
        if args.output != "json":
            print(
                f"retention: {rep.managed_ledgers} managed ledgers, deleted "
                f"{len(rep.deleted_ledgers)} ledgers ({rep.deleted_messages} messages, "
                f"{rep.deleted_bytes} bytes), expired {len(rep.expired_subscriptions)} "
                f"subscriptions, TTL moved {len(rep.ttl_acknowledged)} cursors, "
                f"{len(rep.failures)} failures"
            )
            for topic, err in rep.failures:
                print(f"  failed: {topic}: {err}")
    if args.sweep_orphans or args.dry_run:
        with _progress("orphan sweep", None) as bar:
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
        _print_json(out)
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


def _print_round(args: argparse.Namespace, rep: dict[str, Any]) -> None:
    """One round of ``maintain``: a JSON line, or a table of what it did and a summary line."""
    if args.output == "json":
        print(json.dumps(rep, default=_json_default))
    elif rep["status"] == "standby":
        print(
            f"maintain {rep['scope']}: standby, the lease is held by {rep['lease_holder']} "
            f"until {_clock(rep['lease_expires_ms'])}"
        )
    else:
        rows = _maintain_rows(rep)
        if rows:
            _print_rows(args, ["action", "topic", "detail"], rows)
        lost = " (lease lost: stopped early)" if rep["status"] == "lease lost" else ""
        print(
            f"maintain {rep['scope']}: {rep['topics']} topics, deleted {rep['ledgers_deleted']} "
            f"ledgers ({rep['messages_deleted']} messages, {rep['bytes_deleted']} bytes), "
            f"expired {rep['subscriptions_expired']} subscriptions, TTL moved "
            f"{rep['cursors_ttl_moved']} cursors, deleted {rep['orphans_deleted']} orphan files "
            f"({rep['orphan_bytes']} bytes), {rep['failures']} failures in {rep['seconds']} s{lost}"
        )
    sys.stdout.flush()


def cmd_maintain(args: argparse.Namespace) -> int:
    """Retention, TTL, subscription expiry and orphan sweeps for a scope, once or every
    ``--interval``, by whichever running instance holds the scope's lease."""
    import time

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
    min_age_ms = _orphan_min_age_ms(args.orphan_min_age_hours)
    scope = Scope.parse(args.scope)
    admin = _admin(args)
    scope.namespaces(admin)  # an unknown tenant or namespace fails here, before any lease
    lease = Lease(admin, scope, args.name or default_holder(), lease_ms=lease_ms)
    poll_s = max(0.2, min(interval_ms, lease_ms // 3) / 1000)
    worked = 0
    failures = 0
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.getsignal(signal.SIGTERM) if in_main else None

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if in_main:
        signal.signal(signal.SIGTERM, on_term)
    try:
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            if lease.acquire():
                with _progress(f"maintain {scope}", None) as bar:
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
                _print_round(args, out)
                worked += 1
                if args.once or (args.runs is not None and worked >= args.runs):
                    break
                next_run = time.monotonic() + interval_ms / 1000
                while (left := next_run - time.monotonic()) > 0:
                    time.sleep(min(left, poll_s))
                    if not lease.acquire():  # renew while waiting; lost: stand by
                        break
                continue
            # Try again when the holder's lease would expire (if it does not renew), or
            # sooner (its release on exit ends it at once).
            until_expiry_s = max(0.0, lease.state.expires_ms - time.time() * 1000) / 1000
            nap_s = min(poll_s, until_expiry_s + 0.05)
            if args.once and time.monotonic() < deadline:
                time.sleep(min(nap_s, max(0.0, deadline - time.monotonic())))
                continue
            st = lease.state
            _print_round(
                args,
                {
                    "status": "standby",
                    "scope": str(scope),
                    "holder": lease.holder,
                    "lease_holder": st.holder,
                    "lease_expires_ms": st.expires_ms,
                },
            )
            if args.once:
                break
            time.sleep(nap_s)
    finally:
        lease.release()
        if in_main:
            signal.signal(signal.SIGTERM, old_term)
    return EXIT_ERROR if failures else EXIT_OK


# ---------------------------------------------------------------------------- the parser
def _common(defaults: bool) -> _Parser:
    """The connection and output options, accepted before or after the command."""
    p = _Parser(add_help=False)
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
    ap = _Parser(
        prog="filepulsar",
        description=doc.splitlines()[0],
        epilog="Exit codes: 0 ok, 1 error, 2 usage, 130 Ctrl-C, 141 closed output pipe.",
        parents=[_common(True)],
    )
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def group(name: str, help: str) -> argparse._SubParsersAction[Any]:
        g = sub.add_parser(name, help=help, parents=[common])
        return g.add_subparsers(dest="action", required=True, parser_class=_Parser)

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
    ns_verb("policies", "the effective policies")
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
        if name == "set-auto-topic-creation":
            p.add_argument(
                "--type",
                "-t",
                default="non-partitioned",
                choices=["non-partitioned", "partitioned"],
            )
            p.add_argument("--num-partitions", "-n", type=_positive("--num-partitions"))
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
            type=_positive("--partitions"),
            default=0 if name == "create" else None,
            required=name != "create",
            help="number of partitions",
        )
    p = t_verb("delete", "delete a topic and its data")
    p.add_argument("-f", "--force", action="store_true", help="even with connected clients")
    t_verb("stats", "message counts, storage size, subscriptions' backlogs (JSON)")
    t_verb("stats-internal", "ledgers and cursors (JSON)")
    p = t_verb("partitioned-stats", "totals over the partitions (JSON)")
    p.add_argument("--per-partition", action="store_true", help="each partition's stats too")
    p = t_verb("peek-messages", "show messages after a subscription's cursor, acknowledging none")
    p.add_argument("-s", "--subscription", help="default: from the start of the topic")
    p.add_argument("-n", "--count", type=_positive("--count"), default=1)
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
    p.add_argument("-n", "--count", type=_positive("--count"))
    p = t_verb("clear-backlog", "skip every message of a subscription")
    p.add_argument("-s", "--subscription")
    p = t_verb("expire-messages", "acknowledge messages older than a time")
    p.add_argument("-s", "--subscription")
    p.add_argument("-t", "--expireTime", dest="time", help="seconds, or 10m, 2h ...")

    # produce / consume (pulsar-client)
    p = sub.add_parser("produce", help="publish messages", parents=[common])
    p.add_argument("topic")
    p.add_argument("values", nargs="*", help=argparse.SUPPRESS)  # the first CLI's form
    p.add_argument("-m", "--messages", action="append", help="a message (repeatable)")
    p.add_argument("-f", "--files", action="append", help="a file, one message per line; - stdin")
    p.add_argument("-n", "--num-produce", type=int, default=1, help="send everything N times")
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
        type=_positive("--num-messages"),
        default=1,
        help="how many (default 1); 0: until Ctrl-C",
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
        "--dry-run", action="store_true", help="only report the orphans a sweep would delete"
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
    p.add_argument("--runs", type=_positive("--runs"), help="with --interval: stop after N runs")
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
