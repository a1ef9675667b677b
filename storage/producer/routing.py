"""Which partition a producer's message goes to: :class:`Routing`, the producer's rules of
:mod:`filepulsar.dispatch.routing` (keyed messages by hash, keyless ones round robin or to one
partition, or a custom ``message_router`` for every message, as pulsar-client calls it whatever
the routing mode), for one message and for the rows of a table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from filepulsar.dispatch.modes import HashingScheme, PartitionsRoutingMode
from filepulsar.dispatch.routing import (
    MessageRouter,
    RoundRobinPartitionRouter,
    SinglePartitionRouter,
    partition_for_key,
    route_rows,
)
from filepulsar.storage.errors import InvalidConfiguration
from filepulsar.storage.producer.messages import MessageRecord, OutgoingMessage


class Routing:
    """A producer's partition choice.

    Parameters
    ----------
    num_partitions
        The topic's partitions (0: not partitioned; every message goes to index 0).
    mode, hashing_scheme
        The producer's routing mode for keyless messages and hash for keyed ones.
    message_router
        pulsar-client's custom router, ``router(message, num_partitions) -> int``: decides
        every message when given.
    batching, clock
        Round robin keeps a keyless batch on one partition (Pulsar's rule, by time).
    """

    def __init__(
        self,
        num_partitions: int,
        *,
        mode: PartitionsRoutingMode,
        hashing_scheme: HashingScheme,
        message_router: Callable[[Any, int], int] | None,
        batching: bool,
        clock: Callable[[], int],
    ) -> None:
        self.num_partitions = num_partitions
        self.hashing_scheme = hashing_scheme
        self.custom = message_router
        n = max(num_partitions, 1)
        self.router: MessageRouter
        if mode is PartitionsRoutingMode.UseSinglePartition and message_router is None:
            self.router = SinglePartitionRouter(n)
        else:
            self.router = RoundRobinPartitionRouter(
                n,
                start=int(np.random.randint(0, n)),
                batching_enabled=batching,
                hashing_scheme=hashing_scheme,
                clock=clock,
            )
        router = self.router
        #: The partition of the next keyless message (under the send queue's lock).
        self.keyless: Callable[[], int] = (
            (lambda: router.choose_partition(None)) if num_partitions else (lambda: 0)
        )

    def of(self, record: MessageRecord) -> Callable[[], int]:
        """The route of one message, for the send queue to call under its lock."""
        if self.num_partitions == 0:
            return _zero
        if self.custom is not None:
            return lambda: self.custom_partition(OutgoingMessage(record))
        key = record.partition_key
        if key is not None:
            p = partition_for_key(key, self.num_partitions, self.hashing_scheme)
            return lambda: p
        return self.keyless

    def custom_partition(self, msg: OutgoingMessage) -> int:
        """The custom router's answer for ``msg``, checked."""
        assert self.custom is not None
        n = self.num_partitions
        p = self.custom(msg, n)
        if isinstance(p, bool) or not isinstance(p, int | np.integer):
            raise InvalidConfiguration(
                f"message_router returned {p!r}; expected an int in 0..{n - 1}"
            )
        if not 0 <= p < n:
            raise InvalidConfiguration(f"message_router returned {p}; expected 0..{n - 1}")
        return int(p)

    def rows(self, table: pa.Table, batch: int) -> np.ndarray:
        """Partition of every row of a bulk table (the rules :meth:`of` applies one by one),
        keyless rows ``batch`` to a partition."""
        n = self.num_partitions
        rows = table.num_rows
        if self.custom is not None:
            cols = {c: table.column(c).to_pylist() for c in table.column_names}
            none = [None] * rows
            props = [dict(p) if p is not None else None for p in cols.get("properties", none)]
            out = np.empty(rows, np.int64)
            for i, (v, k, ok, evt) in enumerate(
                zip(
                    cols["value"],
                    cols.get("key", none),
                    cols.get("ordering_key", none),
                    cols.get("event_time", none),
                )
            ):
                record = MessageRecord(
                    content=v,
                    properties=props[i],
                    partition_key=k,
                    ordering_key=ok,
                    event_timestamp=evt,
                )
                out[i] = self.custom_partition(OutgoingMessage(record))
            return out
        keys = table.column("key") if "key" in table.column_names else None
        router = self.router
        return route_rows(
            keys,
            rows,
            n,
            self.hashing_scheme,
            lambda c: router.keyless_partitions(c, batch),
        )


def _zero() -> int:
    return 0
