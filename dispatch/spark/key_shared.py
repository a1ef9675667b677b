"""``key_shared_assign``: Pulsar's Key_Shared consumer assignment as a Spark operator
(see :mod:`filepulsar.dispatch.spark` for where each part runs).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import (
    StringType,
    StructField,
    StructType,
)

from filepulsar.dispatch.hash_arrays import sticky_key_array
from filepulsar.dispatch.modes import KeySharedMode
from filepulsar.dispatch.selectors import selector_for_mode, selector_from_dict
from filepulsar.dispatch.selectors.base import (
    DEFAULT_CONSISTENT_HASHING_POINTS,
    ConsumerAssignError,
    StickyKeyConsumerSelector,
)
from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
from filepulsar.dispatch.selectors.sticky import StickyHashRangeSelector
from filepulsar.dispatch.spark.blocks import (
    BLOCK_COLUMN,
    BLOCK_ONLY_SCHEMA,
    GROUP_COLUMN,
    BlockProcessor,
    blocks_frames,
    from_blocks,
    read_block,
    require_columns,
    settle_worker,
    to_blocks,
)

# ============================================================================================
# Key_Shared
# ============================================================================================

_SELECTOR_STATE_SCHEMA = StructType([StructField("selector", StringType(), False)])


def _new_selector(mode: KeySharedMode, consistent: bool, points: int) -> StickyKeyConsumerSelector:
    return selector_for_mode(
        mode, use_consistent_hashing=consistent, consistent_hashing_points=points
    )


def apply_consumers(
    selector: StickyKeyConsumerSelector,
    consumers: Sequence[str],
    *,
    sticky_ranges: Mapping[str, Sequence[tuple[int, int]]] | None = None,
) -> bool:
    """Bring a selector's membership to ``consumers`` the way Pulsar's broker would.

    Consumers that left are removed first, in the order they joined; then the new ones join
    in the order listed. The selector's own join/leave rules decide which hash ranges move, so
    a consumer that stays keeps everything Pulsar would let it keep. For the consistent-hashing
    selector ``consumers`` is a multiset (several consumers may share a name; surplus instances
    leave highest name index first). For the sticky selector a consumer whose ranges changed
    leaves and joins again with its new ranges.

    Runs wherever it is called (the Key_Shared processor calls it on executors); Spark-free.

    Parameters
    ----------
    selector
        The selector to change in place.
    consumers
        Consumer names wanted after the change.
    sticky_ranges
        For a :class:`~filepulsar.dispatch.selectors.sticky.StickyHashRangeSelector`: each
        consumer's inclusive hash ranges; required for every listed consumer.

    Returns
    -------
    bool
        Whether the membership changed.

    Raises
    ------
    ConsumerAssignError
        If the selector refuses a change (duplicate name for auto-split, missing or
        overlapping sticky ranges, a range that cannot be split).
    """
    changed = False
    if isinstance(selector, ConsistentHashingSelector):
        wanted = Counter(consumers)
        live: dict[str, list[int]] = {}
        for name, index in selector.instances():
            live.setdefault(name, []).append(index)
        for name, indexes in live.items():
            for index in sorted(indexes, reverse=True)[: max(0, len(indexes) - wanted[name])]:
                selector.remove_consumer(name, name_index=index)
                changed = True
        have = Counter(selector.consumers())
        for name in consumers:
            if have[name] < wanted[name]:
                selector.add_consumer(name)
                have[name] += 1
                changed = True
        return changed
    if len(set(consumers)) != len(consumers):
        raise ConsumerAssignError(
            f"consumer names must be unique for the {selector.kind} selector, got {consumers}"
        )
    if isinstance(selector, StickyHashRangeSelector):
        ranges = dict(sticky_ranges or {})
        missing = [name for name in consumers if not ranges.get(name)]
        if missing:
            raise ConsumerAssignError(f"sticky consumers {missing} have no hash ranges")
        wanted_ranges = {n: sorted((int(s), int(e)) for s, e in ranges[n]) for n in consumers}
        current = selector.ranges()
        for name in list(current):
            if sorted(current[name]) != wanted_ranges.get(name):
                selector.remove_consumer(name)
                changed = True
        present = set(selector.consumers())
        for name in consumers:
            if name not in present:
                selector.add_consumer(name, wanted_ranges[name])
                changed = True
        return changed
    for name in selector.consumers():
        if name not in consumers:
            selector.remove_consumer(name)
            changed = True
    present = set(selector.consumers())
    for name in consumers:
        if name not in present:
            selector.add_consumer(name)
            changed = True
    return changed


class _KeySharedProcessor(BlockProcessor):
    """One selector per state group (a topic partition), advanced to this run's consumers.

    State (per group): ValueState ``selector`` (``selector string``), the selector's
    :meth:`~filepulsar.dispatch.selectors.base.StickyKeyConsumerSelector.to_dict` as JSON. Input and
    output are Arrow blocks; the output blocks have the input columns plus ``consumer``.
    """

    def __init__(
        self,
        mode: KeySharedMode,
        consistent: bool,
        consumers: list[str],
        sticky_ranges: dict[str, list[tuple[int, int]]] | None,
        points: int,
    ) -> None:
        self._mode = mode
        self._consistent = consistent
        self._consumers = consumers
        self._sticky_ranges = sticky_ranges
        self._points = points

    def init(self, handle: StatefulProcessorHandle) -> None:
        settle_worker()
        self._state = handle.getValueState("selector", _SELECTOR_STATE_SCHEMA)
        # Selectors by state text: the groups of one run usually share one membership history,
        # so the selector and its slot table are built once per task, not once per group.
        self._cache: dict[str | None, tuple[StickyKeyConsumerSelector, str]] = {}

    def _selector(self) -> StickyKeyConsumerSelector:
        stored = self._state.get() if self._state.exists() else None
        text = stored[0] if stored else None
        cached = self._cache.get(text)
        if cached is None:
            if text is None:
                selector = _new_selector(self._mode, self._consistent, self._points)
            else:
                selector = selector_from_dict(json.loads(text))
            apply_consumers(selector, self._consumers, sticky_ranges=self._sticky_ranges)
            cached = (selector, json.dumps(selector.to_dict(), separators=(",", ":")))
            self._cache[text] = cached
        selector, new_text = cached
        if new_text != text:
            self._state.update((new_text,))
        return selector

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        selector = self._selector()
        names = pa.array(selector.consumers(), pa.string())
        out = []
        for pdf in rows:
            for block in pdf[BLOCK_COLUMN]:
                table = read_block(block)
                if not table.num_rows:
                    continue
                keys = sticky_key_array(
                    table.column("orderingKey") if "orderingKey" in table.column_names else None,
                    table.column("key") if "key" in table.column_names else None,
                    table.num_rows,
                )
                owner = selector.select_keys(keys)
                consumer = names.take(pa.array(owner, mask=owner < 0))
                out.append(table.append_column("consumer", consumer))
        yield from blocks_frames(*out)

    def close(self) -> None:
        pass


def key_shared_assign(
    df: DataFrame,
    consumers: Sequence[str],
    *,
    mode: KeySharedMode | str = KeySharedMode.AutoSplit,
    use_consistent_hashing: bool = True,
    sticky_ranges: Mapping[str, Sequence[tuple[int, int]]] | None = None,
    consistent_hashing_points: int = DEFAULT_CONSISTENT_HASHING_POINTS,
    group_by: Sequence[str] = ("topic", "partition"),
) -> DataFrame:
    """Add a ``consumer`` column: which Key_Shared consumer receives each message.

    The sticky key is the ordering key if set, else the key, else ``NONE_KEY``
    (:func:`filepulsar.dispatch.hash_arrays.sticky_key_array`); its slot and owner come from
    :mod:`filepulsar.dispatch.selectors`, vectorised over each block. ``consumer`` is null when no
    consumer owns the slot (a sticky selector whose ranges leave it uncovered, or no consumers): in
    Pulsar the message waits.

    One selector is kept per ``group_by`` group -- by default per topic partition, as Pulsar
    keeps one dispatcher and selector per partition. In the first batch of a run in which a
    group has messages, its stored selector is brought to ``consumers`` by
    :func:`apply_consumers`: consumers that left are removed, new ones join, and Pulsar's
    algorithm alone decides which ranges change hands. A group without messages during a run
    applies the net change when it next has some, like a Pulsar partition that never saw a
    consumer come and go.

    Parameters
    ----------
    df
        Streaming DataFrame with ``key`` and/or ``orderingKey`` and the ``group_by`` columns;
        every column is kept.
    consumers
        Consumer names for this run, in joining order (order matters for auto-split and
        consistent hashing, as join order does in Pulsar).
    mode
        ``"AUTO_SPLIT"`` (default) or ``"STICKY"``, in either spelling
        (:class:`filepulsar.dispatch.modes.KeySharedMode`; ``"AutoSplit"``, ``"Sticky"``). It means
        what it means for a subscription.
    use_consistent_hashing
        ``AUTO_SPLIT`` only, Pulsar's broker setting
        ``subscriptionKeySharedUseConsistentHashing``: consistent hashing (default, as in
        Pulsar) or hash-range auto-split (false).
    sticky_ranges
        ``STICKY`` only: inclusive ``(start, end)`` ranges in ``[0, 65535]`` per consumer.
    consistent_hashing_points
        Ring points per consumer (Pulsar's default 100).
    group_by
        Columns whose values each own one selector; ``()`` keeps one selector for the whole
        stream (and one task does all the work).

    Returns
    -------
    DataFrame
        The input columns plus ``consumer`` (string).

    Raises
    ------
    ValueError
        On the driver: an unknown mode, a missing column, or consumers or sticky ranges that
        the selector refuses (:class:`~filepulsar.dispatch.selectors.base.ConsumerAssignError`).
    TypeError
        If ``consumers`` is a single string.

    Notes
    -----
    State: per group, ValueState ``selector`` (``selector string``); time mode ``None``, output
    mode ``Append``.
    """
    if isinstance(consumers, str):
        raise TypeError("consumers must be a sequence of names, not one string")
    names = list(consumers)
    ranges = None
    if isinstance(mode, str) and mode.strip().upper() == "CONSISTENT_HASHING":
        raise ValueError(
            "key_shared_assign: mode 'CONSISTENT_HASHING' is mode='AUTO_SPLIT' (consistent "
            "hashing is its default; use_consistent_hashing=False selects hash-range auto-split)"
        )
    mode = KeySharedMode.parse(mode, "key_shared_assign: mode")
    if mode is KeySharedMode.Sticky:
        if sticky_ranges is None:
            raise ValueError("mode='STICKY' needs sticky_ranges={consumer: [(start, end), ...]}")
        ranges = {n: [(int(s), int(e)) for s, e in r] for n, r in sticky_ranges.items()}
        unknown = sorted(set(ranges) - set(names))
        if unknown:
            raise ValueError(f"sticky_ranges names consumers {unknown} that are not in consumers")
    elif sticky_ranges is not None:
        raise ValueError(f"sticky_ranges only applies to mode='STICKY', not {mode.wire!r}")
    # Validate on the driver: the call the executors make, on a fresh selector.
    consistent = bool(use_consistent_hashing)
    apply_consumers(
        _new_selector(mode, consistent, consistent_hashing_points), names, sticky_ranges=ranges
    )
    if "key" not in df.columns and "orderingKey" not in df.columns:
        raise ValueError("key_shared_assign: input needs a 'key' or 'orderingKey' column")
    require_columns(df, list(group_by), "key_shared_assign")
    if "consumer" in df.columns:
        raise ValueError("key_shared_assign: input already has a 'consumer' column")
    processor = _KeySharedProcessor(mode, consistent, names, ranges, consistent_hashing_points)
    assigned = (
        to_blocks(df, group_by)
        .groupBy(GROUP_COLUMN)
        .transformWithStateInPandas(processor, BLOCK_ONLY_SCHEMA, "Append", "None")
    )
    schema = StructType([*df.schema.fields, StructField("consumer", StringType(), True)])
    return from_blocks(assigned, schema)
