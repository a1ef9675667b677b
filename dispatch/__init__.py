"""Pulsar's dispatch rules as plain Python: no Spark, no I/O, no clock of their own.

Modules, one concept each:

* :mod:`dispatch.hashing` -- Murmur3_32Hash and JavaStringHash, scalar and vectorised; slots.
* :mod:`dispatch.selectors` -- Key_Shared consumer selectors (auto-split, consistent hashing,
  sticky).
* :mod:`dispatch.routing` -- producer routing of messages to partitions.
* :mod:`dispatch.failover` -- the active consumer of a Failover subscription.
* :mod:`dispatch.redelivery` -- redelivery backoff, negative-ack delay, dead/retry letters.
* :mod:`dispatch.dedup` -- broker-side sequence-id deduplication.
* :mod:`dispatch.delayed` -- whether a delayed message is held back.
* :mod:`dispatch.spark_ops` -- the same rules as Spark Structured Streaming operators (it imports
  PySpark, so it is not imported here).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dispatch.dedup import DedupStatus, DedupTracker
    from dispatch.delayed import should_delay, should_delay_array
    from dispatch.failover import active_consumer
    from dispatch.hashing import (
        java_string_hash,
        java_string_hash_array,
        murmur3_32,
        murmur3_32_array,
        sign_safe_mod,
        slot_array,
        sticky_key,
    )
    from dispatch.redelivery import MultiplierRedeliveryBackoff
    from dispatch.routing import (
        CustomPartitionRouter,
        RoundRobinPartitionRouter,
        SinglePartitionRouter,
        partition_for_key,
        partitions_for_keys,
    )
    from dispatch.selectors import (
        AutoSplitHashRangeSelector,
        ConsistentHashingSelector,
        ConsumerAssignError,
        StickyHashRangeSelector,
        selector_from_dict,
    )

#: Where each public name lives; modules load on first use (Spark workers import little).
_LAZY = {
    "AutoSplitHashRangeSelector": "dispatch.selectors",
    "ConsistentHashingSelector": "dispatch.selectors",
    "ConsumerAssignError": "dispatch.selectors",
    "CustomPartitionRouter": "dispatch.routing",
    "DedupStatus": "dispatch.dedup",
    "DedupTracker": "dispatch.dedup",
    "MultiplierRedeliveryBackoff": "dispatch.redelivery",
    "RoundRobinPartitionRouter": "dispatch.routing",
    "SinglePartitionRouter": "dispatch.routing",
    "StickyHashRangeSelector": "dispatch.selectors",
    "active_consumer": "dispatch.failover",
    "java_string_hash": "dispatch.hashing",
    "java_string_hash_array": "dispatch.hashing",
    "murmur3_32": "dispatch.hashing",
    "murmur3_32_array": "dispatch.hashing",
    "partition_for_key": "dispatch.routing",
    "partitions_for_keys": "dispatch.routing",
    "selector_from_dict": "dispatch.selectors",
    "should_delay": "dispatch.delayed",
    "should_delay_array": "dispatch.delayed",
    "sign_safe_mod": "dispatch.hashing",
    "slot_array": "dispatch.hashing",
    "sticky_key": "dispatch.hashing",
}

__all__ = [
    "AutoSplitHashRangeSelector",
    "ConsistentHashingSelector",
    "ConsumerAssignError",
    "CustomPartitionRouter",
    "DedupStatus",
    "DedupTracker",
    "MultiplierRedeliveryBackoff",
    "RoundRobinPartitionRouter",
    "SinglePartitionRouter",
    "StickyHashRangeSelector",
    "active_consumer",
    "java_string_hash",
    "java_string_hash_array",
    "murmur3_32",
    "murmur3_32_array",
    "partition_for_key",
    "partitions_for_keys",
    "selector_from_dict",
    "should_delay",
    "should_delay_array",
    "sign_safe_mod",
    "slot_array",
    "sticky_key",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
