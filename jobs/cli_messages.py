"""``filepulsar produce|consume|peek``: pulsar-client's message commands
(:mod:`filepulsar.jobs.cli`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import IO, Any

import numpy as np
import pyarrow as pa

from filepulsar.dispatch.modes import ConsumerType, InitialPosition
from filepulsar.jobs.cli_support import (
    CHUNK_BYTES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    BadArgument,
    connection_of,
    open_admin,
    parse_properties,
    print_done,
    progress_bar,
)
from filepulsar.storage import (
    MessageId,
    Reader,
    TopicName,
)


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


#: Bytes of a file ``produce -f`` reads and sends at a time: the progress bar moves per block.
PRODUCE_BLOCK_BYTES = 1 << 20


def _read_lines(
    stream: IO[bytes], block_bytes: int = CHUNK_BYTES
) -> Iterator[tuple[pa.Array, int]]:
    """Chunks of whole lines of ``stream`` (read ``block_bytes`` at a time) as arrays, with
    the bytes they came from."""
    rest = b""
    while True:
        block = stream.read(block_bytes)
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

    props = parse_properties(args.property)
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
    url, opts = connection_of(args)
    client = Client(url, storage_options=opts)
    total = 0
    first = last = None
    try:
        # Batched, as pulsar-client's produce (-db turns it off): a file's lines go into
        # entries of up to 1000 messages / 128 KB, not one entry per line.
        producer = client.create_producer(args.topic, batching_enabled=not args.disable_batching)

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
                    progress_bar(f"produce {os.path.basename(f)}", size, "bytes") as bar,
                ):
                    done = 0
                    for values, used in _read_lines(stream, PRODUCE_BLOCK_BYTES):
                        send(values)
                        done += used
                        bar(done)
        producer.close()
    finally:
        client.close()
    print_done(
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
    url, opts = connection_of(args)
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
        if args.start_timestamp is not None:
            consumer.seek(args.start_timestamp)  # PIP-435: from the first message published then
        cumulative = kind in (ConsumerType.Exclusive, ConsumerType.Failover)
        ended = False  # --end-timestamp reached
        while (want == 0 or got < want) and not stop and not ended:
            batch = consumer.batch_receive()
            if not batch:
                continue
            if args.end_timestamp is not None:
                # PIP-435: stop at the first message published after the end (not printed, not
                # acknowledged: it stays in the backlog).
                within = [m for m in batch if m.publish_timestamp() <= args.end_timestamp]
                if len(within) < len(batch):
                    ended = True
                    batch = within
            if want:
                batch = batch[: want - got]
            if not batch:
                continue
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
    admin = open_admin(args)
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
