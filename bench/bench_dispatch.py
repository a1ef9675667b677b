"""Benchmark of the dispatch hot paths.

Run with ``python -m bench.bench_dispatch``; prints one JSON object per measurement. A driver can
call :func:`run` instead, which returns the same records as dicts with ``name``, ``value`` and
``unit`` plus details.

Measured:

* vectorised Key_Shared assignment -- 1M random keys of 8-24 bytes in a pyarrow binary array ->
  murmur hash -> slot -> consumer index, for each selector with 10 consumers;
* the vectorised murmur hash alone and the vectorised JavaStringHash partitioning of string keys;
* scalar ``murmur3_32`` and scalar ``select`` in a Python loop, for comparison.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import mmh3
import numpy as np
import pyarrow as pa

from filepulsar.dispatch.hash_arrays import murmur3_32_array, slot_array
from filepulsar.dispatch.hashing import murmur3_32
from filepulsar.dispatch.routing import partitions_for_keys
from filepulsar.dispatch.selectors.auto_split import AutoSplitHashRangeSelector
from filepulsar.dispatch.selectors.base import StickyKeyConsumerSelector
from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
from filepulsar.dispatch.selectors.sticky import StickyHashRangeSelector

NUM_KEYS = 1_000_000
NUM_SCALAR_KEYS = 100_000
NUM_CONSUMERS = 10
REPEATS = 5
SEED = 20240601


def random_binary_keys(count: int, min_len: int, max_len: int, seed: int) -> pa.Array:
    """``count`` random byte strings of ``min_len..max_len`` bytes, built straight into Arrow."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, count)
    offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
    return pa.Array.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def random_text_keys(count: int, seed: int) -> pa.Array:
    """``count`` ASCII keys like ``user-3f9a1c...`` of 10-24 characters."""
    raw = random_binary_keys(count, 3, 10, seed)
    hexed = [f"user-{b.hex()}" for b in raw.to_pylist()]
    return pa.array(hexed, pa.string())


def selectors() -> dict[str, StickyKeyConsumerSelector]:
    """The three selectors, each with ``NUM_CONSUMERS`` consumers."""
    auto = AutoSplitHashRangeSelector()
    consistent = ConsistentHashingSelector()
    sticky = StickyHashRangeSelector()
    width = 65536 // NUM_CONSUMERS
    for i in range(NUM_CONSUMERS):
        name = f"consumer-{i}"
        auto.add_consumer(name)
        consistent.add_consumer(name)
        end = 65535 if i == NUM_CONSUMERS - 1 else (i + 1) * width - 1
        sticky.add_consumer(name, [(i * width, end)])
    return {"auto_split": auto, "consistent_hashing": consistent, "sticky": sticky}


def best_seconds(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    """Fastest of ``repeats`` timed calls (the first call also warms caches and allocators)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _record(name: str, count: int, seconds: float, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "value": round(count / seconds / 1e6, 3),
        "unit": "M keys/s",
        "keys": count,
        "seconds": round(seconds, 4),
        **extra,
    }


def run() -> list[dict[str, Any]]:
    """Run every measurement and return one record per measurement."""
    keys = random_binary_keys(NUM_KEYS, 8, 24, SEED)
    records = []

    seconds = best_seconds(lambda: murmur3_32_array(keys))
    records.append(_record("murmur3_32_array", NUM_KEYS, seconds, key_bytes="8-24"))

    def comprehension() -> object:
        # The alternative to the numpy kernel: Python objects and mmh3 one key at a time.
        hashes = np.fromiter(
            (mmh3.hash(k, 0, False) for k in keys.to_pylist()), dtype=np.uint32, count=NUM_KEYS
        )
        return hashes & np.uint32(0x7FFFFFFF)

    seconds = best_seconds(comprehension, repeats=3)
    records.append(_record("murmur3_32_comprehension", NUM_KEYS, seconds, key_bytes="8-24"))

    for kind, selector in selectors().items():
        start, end = selector.hash_range

        def assign(selector: StickyKeyConsumerSelector = selector) -> object:
            slots = slot_array(murmur3_32_array(keys), *selector.hash_range)
            return selector.select_slots(slots)

        seconds = best_seconds(assign)
        records.append(
            _record(
                f"key_shared_assign_{kind}",
                NUM_KEYS,
                seconds,
                consumers=NUM_CONSUMERS,
                hash_range=[start, end],
                steps="murmur3_32_array+slot_array+select_slots",
                goal=">= 5 M keys/s",
            )
        )

    text_keys = random_text_keys(NUM_KEYS, SEED + 1)
    seconds = best_seconds(lambda: partitions_for_keys(text_keys, 16, "JavaStringHash"))
    records.append(
        _record("partitions_for_keys_java_string_hash", NUM_KEYS, seconds, partitions=16)
    )

    scalar_keys = keys[:NUM_SCALAR_KEYS].to_pylist()

    def scalar_murmur() -> object:
        return [murmur3_32(k) for k in scalar_keys]

    seconds = best_seconds(scalar_murmur, repeats=3)
    records.append(_record("murmur3_32_scalar_loop", NUM_SCALAR_KEYS, seconds))

    consistent = selectors()["consistent_hashing"]

    def scalar_select() -> object:
        return [consistent.select(k) for k in scalar_keys]

    seconds = best_seconds(scalar_select, repeats=3)
    records.append(_record("consistent_hashing_select_scalar_loop", NUM_SCALAR_KEYS, seconds))
    return records


def main() -> None:
    for record in run():
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
