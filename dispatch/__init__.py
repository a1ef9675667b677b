"""Pulsar's dispatch rules as plain Python: no Spark, no I/O, no clock of their own.

Modules, one concept each:

* :mod:`filepulsar.dispatch.modes` -- Pulsar's closed sets (subscription type, routing mode ...) as
  enums, each parsed by one function that takes pulsar-client's and the wire spelling.
* :mod:`filepulsar.dispatch.clock` -- the one clock (wall ms, monotonic, sleep; a manual clock for
  tests) and the one poll helper.
* :mod:`filepulsar.dispatch.lru` -- the least-recently-used dict, bounded by count or weight,
  that the caches of storage, the source's meter and the consistent-hashing rings share.
* :mod:`filepulsar.dispatch.hashing` -- Murmur3_32Hash and JavaStringHash of one key; slots; sticky
  keys.
* :mod:`filepulsar.dispatch.hash_arrays` -- the same hashes, slots and sticky keys over whole
  arrays.
* :mod:`filepulsar.dispatch.selectors` -- Key_Shared consumer selectors (auto-split, consistent
  hashing, sticky): built from a mode or saved state; each selector in its own module
  of that package over :mod:`filepulsar.dispatch.selectors.base`.
* :mod:`filepulsar.dispatch.routing` -- producer routing of messages to partitions.
* :mod:`filepulsar.dispatch.failover` -- the active consumer of a Failover subscription.
* :mod:`filepulsar.dispatch.redelivery` -- redelivery backoff, negative-ack delay, dead/retry
  letters.
* :mod:`filepulsar.dispatch.dedup` -- broker-side sequence-id deduplication.
* :mod:`filepulsar.dispatch.delayed` -- whether a delayed message is held back.
* :mod:`filepulsar.dispatch.spark` -- the same rules as Spark Structured Streaming operators (it
  imports PySpark, so it is not imported here).
"""

from filepulsar.dispatch.dedup import DedupStatus, DedupTracker
from filepulsar.dispatch.delayed import should_delay, should_delay_array
from filepulsar.dispatch.failover import active_consumer
from filepulsar.dispatch.hash_arrays import java_string_hash_array, murmur3_32_array, slot_array
from filepulsar.dispatch.hashing import java_string_hash, murmur3_32, sign_safe_mod, sticky_key
from filepulsar.dispatch.redelivery import MultiplierRedeliveryBackoff
from filepulsar.dispatch.routing import (
    CustomPartitionRouter,
    RoundRobinPartitionRouter,
    SinglePartitionRouter,
    partition_for_key,
    partitions_for_keys,
)
from filepulsar.dispatch.selectors import selector_from_dict
from filepulsar.dispatch.selectors.auto_split import AutoSplitHashRangeSelector
from filepulsar.dispatch.selectors.base import ConsumerAssignError
from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
from filepulsar.dispatch.selectors.sticky import StickyHashRangeSelector

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
