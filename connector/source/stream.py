"""The streaming source: ``spark.readStream.format("filepulsar")`` (driver side).

Owns :class:`FilePulsarStreamReader`: offsets per trigger (``initialOffset``, ``latestOffset``
with admission control, Shared/Key_Shared claims), checkpoint checks, planning a batch's tasks,
committing to the subscription's cursors, and the backlog report. Its partitions and
consumers are kept by the :class:`~filepulsar.connector.source.consumers.StreamConsumers` it
owns. See :mod:`filepulsar.connector.source.batch` for the offsets and what runs where.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from filepulsar.connector.source.claims import (
    Piece,
    claim_acks,
    claim_slice,
    piece_of,
    take_messages,
)
from filepulsar.connector.source.consumers import StreamConsumers
from filepulsar.connector.source.meter import MessageMeter, apportion, cut_bytes, ml_bytes
from filepulsar.connector.source.offsets import (
    START,
    PartitionOffset,
    check_offset_keys,
    end_offset,
    offset_before,
    offsets_json,
    parse_offsets,
    recreated_between,
    resolve_offset,
)
from filepulsar.connector.source.options import SourceOptions, parse_topic_pattern
from filepulsar.connector.source.partition import FilePulsarPartition
from filepulsar.connector.source.plan import plan_partitions
from filepulsar.connector.source.read import read_partition
from filepulsar.dispatch.clock import SYSTEM, Clock
from filepulsar.storage import (
    InvalidConfiguration,
    ManagedLedger,
    SubscriptionNotFound,
    TopicName,
    TopicNotFound,
)
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.read_range import WHOLE, data_loss, recreated_message
from filepulsar.storage.subscriptions import SubscriptionStore, subscription_backlog

log = logging.getLogger(__name__)

#: Entries a Shared/Key_Shared query claims per trigger when no message limit applies.
CLAIM_ENTRIES = 1000
# Claim rounds an AvailableNow run fetches again while its subscription's key ranges move,
# and how often it looks whether what held back its keys was acknowledged (see _settle).
_SETTLE_ROUNDS = 16
_DRAIN_POLL_S = 0.05


def _compare(before: dict[str, tuple[Any, ...]], after: dict[str, tuple[Any, ...]]) -> str:
    """How claim marks (:meth:`FilePulsarStreamReader._claim_marks`) changed over a claim
    round: ``"still"`` (no commit to any of the subscriptions), ``"forward"`` (scans or
    dispatch positions moved on, the key ranges as they were) or ``"moved"`` (consumers
    joined or left, a scan restarts, or other consumers committed)."""
    if before == after:
        return "still"
    if before.keys() != after.keys():
        return "moved"
    forward = False
    for key, (_, selector, scan, dispatched, _) in before.items():
        _, selector2, scan2, dispatched2, _ = after[key]
        if selector2 != selector or dispatched2 < dispatched:
            return "moved"
        if scan is not None and (scan2 is None or scan2 < scan):
            return "moved"
        forward = forward or dispatched2 > dispatched or (scan2 is not None and scan2 != scan)
    return "forward" if forward else "moved"


class FilePulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("filepulsar")`` (driver side; see the module docstring)."""

    def __init__(self, options: Any, schema: StructType, *, clock: Clock = SYSTEM) -> None:
        """Called by Spark on the driver when the query starts (in its planner process, which
        keeps this object for the query's life), and again in short-lived Python workers that
        only pickle it to executors for :meth:`read`. Parses the options (a typed read also
        reads the topics' schema); registers nothing. ``clock``: where time is read and
        waited (pattern refresh, the busy-consumer wait, ``maxTriggerDelay``); tests pass a
        :class:`~filepulsar.dispatch.clock.ManualClock`."""
        # Spark also builds this object on executors only to call read(): the constructor
        # validates options and touches nothing; consumers register on the first driver call.
        self.opts = SourceOptions.parse(options, streaming=True).for_schema(schema)
        self.store = self.opts.store()
        self._streams = StreamConsumers(self.opts, self.store, clock)
        self._target: dict[str, PartitionOffset] | None = None
        self._claim_seq = 0
        # Shared/Key_Shared: entries claimed but not (wholly) in a batch yet, per partition,
        # and the average messages per entry seen (sizes the next fetch); see _claim.
        self._carry: dict[str, list[Piece]] = {}
        self._per_entry = 1.0
        self._committed: dict[str, Any] | None = None
        # reportLatestOffset (polled with every latestOffset): the backlog per partition
        # memoised on (last position, subscription version).
        self._backlog: dict[str, tuple[Any, int]] = {}
        self._checked = False  # the checkpoint's offsets were checked against the options
        # This trigger's manifest states (read once, by latestOffset), the end it planned
        # (for the backlog report), per-entry message counts (see MessageMeter), minMessages timing.
        self._states: dict[str, ManifestState] = {}
        self._last_end: dict[str, PartitionOffset] | None = None
        self._meter = MessageMeter()
        self._time = clock
        self._clock = clock.monotonic
        self._last_trigger: float | None = None

    # -- offsets
    def initialOffset(self) -> dict[str, Any]:
        """Called once on the driver, only by a query with no checkpoint: where it starts.

        Registers the consumers (with a subscription: the cursor is the start). The dict is
        written to the checkpoint, so it must be JSON of primitives.
        """
        self._checked = True  # a new query: no checkpoint to check
        self._streams.refresh()
        check_offset_keys(self.opts, self._streams.partitions)
        if self._streams.claims_mode:
            return {"claims": {}, "seq": 0}
        out: dict[str, PartitionOffset] = {}
        for t in self._streams.partitions:
            key = str(t)
            ml = self._streams.mls[key]
            m = ml.state()
            c = self._streams.consumers.get(key)
            if c is not None:
                md = c.state().mark_delete
                out[key] = PartitionOffset(md.ledger_id, md.entry_id, WHOLE, m.incarnation)
            else:
                out[key] = resolve_offset(
                    self.opts.starting_offsets, key, m, ml, self.opts, is_start=True
                )
        return offsets_json(out)

    def getDefaultReadLimit(self) -> ReadLimit:
        """Called on the driver when the query starts: the limit per trigger the options
        give; Spark may still pass :class:`ReadAllAvailable` (trigger AvailableNow)."""
        if self.opts.min_messages is not None:
            return ReadMinRows(self.opts.min_messages)  # the max (if any) from the options
        if self.opts.max_messages is not None:
            return ReadMaxRows(self.opts.max_messages)
        if self.opts.max_bytes is not None:
            return ReadMaxBytes(self.opts.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Called once on the driver at the start of a Trigger.AvailableNow run: fixes the
        end (each partition's last position now); later triggers never read past it."""
        self._target = self._latest_positions()

    def _latest_positions(self) -> dict[str, PartitionOffset]:
        """Every partition's last position, from its manifest read now (once per trigger:
        the states are kept in ``_states`` for the rest of the trigger -- cutting, planning,
        the backlog report)."""
        self._streams.refresh()
        out = {}
        self._states = {}
        for t in self._streams.partitions:
            try:
                m = self._streams.mls[str(t)].state()
            except TopicNotFound:
                continue  # deleted since the listing: reported by latestOffset
            self._states[str(t)] = m
            out[str(t)] = end_offset(m)
        return out

    def _check_checkpoint(self, start: dict[str, Any]) -> None:
        """Offsets from a checkpoint must be for the topics this query reads (a checkpoint
        belongs to one topic set, as Kafka's).

        Raises
        ------
        InvalidConfiguration
            Naming the checkpoint's topics and the query's.
        """
        if self._checked:
            return
        self._checked = True
        if ("claims" in start) != self._streams.claims_mode:
            raise InvalidConfiguration(
                "filepulsar source: the checkpoint was written by a query "
                + ("with" if "claims" in start else "without")
                + " a Shared/Key_Shared subscription and this query is "
                + ("not" if "claims" in start else "")
                + " one; use a new checkpointLocation"
            )
        if "claims" in start:
            return
        pattern = parse_topic_pattern(self.opts.pattern) if self.opts.pattern else None
        named = set(self.opts.topics)

        def base(key: str) -> str:
            return str(TopicName.parse(key).base)

        def ours(key: str) -> bool:
            if pattern is not None:
                return pattern.matches(TopicName.parse(key))
            return base(key) in named or key in named

        theirs = sorted({base(k) for k in start})
        foreign = [k for k in start if not ours(k)]
        missing = []
        if pattern is None and not self.opts.wait_for_topics:
            missing = [n for n in sorted(named) if not any(n in (k, base(k)) for k in start)]
        if foreign or missing:
            reads = self.opts.pattern or ", ".join(sorted(named))
            raise InvalidConfiguration(
                f"filepulsar source: the checkpoint's offsets are for {theirs} but this query "
                f"reads {reads}; a checkpoint belongs to the topics it was started with: use a "
                "new checkpointLocation, or the original topic options"
            )

    def _effective_start(self, s: PartitionOffset, e: PartitionOffset | None) -> PartitionOffset:
        """Where a batch's range for one partition begins: ``s``, or the start of a topic
        that was deleted and created again (different incarnations, or -- for offsets from
        before incarnations -- an end behind the start, which only a reset makes)."""
        if e is None:
            return s
        if recreated_between(s, e) or (not s.incarnation and e.position < s.position):
            return START.at(e.incarnation)
        return s

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Called on the driver once per trigger (also when no data came: keep it cheap):
        the end of the next batch, ``start`` when there is nothing to read.

        ``start`` is the previous batch's end (or :meth:`initialOffset`'s, or the
        checkpoint's after a restart). Must respect ``limit``. The returned offset goes to
        the checkpoint's offset log before the batch runs, so a replay after a crash plans
        the same batch from it: it must name everything the batch reads (Shared/Key_Shared:
        the claimed entries).
        """
        self._check_checkpoint(start)
        # Spark asks for the next batch only once the previous one is in its commit log, but
        # calls commit() for a batch only while planning the next: acknowledge ``start`` here
        # so the last batch of a run (AvailableNow) reaches the cursor too. Idempotent.
        self.commit(start)
        if self._streams.claims_mode:
            return self._claim(start, limit)
        begin = parse_offsets(start)
        self._streams.refresh()
        now_latest = self._latest_positions()  # the manifests, read once for this trigger
        latest = self._target or now_latest
        end = dict(begin)
        for key in list(end):
            if key not in latest:
                # Deleted: Kafka's "partitions are gone. Some data may have been missed".
                data_loss(
                    f"{key} was deleted; messages after {end[key].ledger_id}:"
                    f"{end[key].entry_id} this query had not read may have been lost",
                    self.opts.fail_on_data_loss,
                )
                del end[key]
        if start and not end and not latest:
            # Every partition is gone: no batch, the offsets stay as they were (Kafka's
            # SPARK-41375). An empty offset would go to the checkpoint and a restart of a
            # query naming its topics would then refuse it.
            self._last_end = begin
            if self._target is not None:
                self._release()
            return start
        for key, lat in latest.items():
            if key not in end:
                # A partition discovered later (a topic the pattern finds, a partition added,
                # a topic that appeared) joins the offsets at its start (the subscription's
                # cursor, else its beginning) and is read from the next batch on: every
                # batch's range is then (start, end] of its own offsets, so a replay reads
                # the same and admission control counts it like the others.
                c = self._streams.consumers.get(key)
                if c is not None:
                    md = c.state().mark_delete
                    end[key] = PartitionOffset(md.ledger_id, md.entry_id, WHOLE, lat.incarnation)
                else:
                    end[key] = START.at(lat.incarnation)
                continue
            if not self._streams.active(key):
                continue
            cur = end[key]
            if self._effective_start(cur, lat) is not cur:
                if recreated_between(cur, lat):
                    msg = recreated_message(key, cur.incarnation, lat.incarnation)
                else:
                    msg = (
                        f"{key}: its last message {lat.ledger_id}:{lat.entry_id} is before this "
                        f"query's offset {cur.ledger_id}:{cur.entry_id}: the topic was deleted "
                        "and created again, and messages this query had not read may have been "
                        "lost"
                    )
                data_loss(msg, self.opts.fail_on_data_loss)
                end[key] = lat  # read from the start of the new topic
                continue
            if lat.position > cur.position or (
                lat.position == cur.position and cur.messages != WHOLE
            ):
                end[key] = lat
        if isinstance(limit, ReadMinRows) and self._target is None and end != begin:
            # Kafka's minOffsetsPerTrigger: wait for enough messages, or maxTriggerDelay
            # since the last batch (the first trigger of a query does not wait). AvailableNow
            # never waits: it reads what there is, then ends.
            now = self._clock()
            due = (
                self._last_trigger is None
                or (now - self._last_trigger) * 1000 >= self.opts.max_trigger_delay_ms
            )
            if not due and self._count(begin, end) < limit.min_rows:
                self._last_end = begin
                return start
            self._last_trigger = now
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        nbytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        if isinstance(limit, ReadMinRows):  # the maximum (if any) comes from the options
            rows, nbytes = self.opts.max_messages, self.opts.max_bytes
        if rows is not None:
            end = self._cap(begin, end, rows=rows)
        elif nbytes is not None:
            end = self._cap(begin, end, nbytes=nbytes)
        self._last_end = end
        if self._target is not None and end == begin:
            self._release()  # AvailableNow is done: let the next query have the subscription
        return offsets_json(end)

    def _release(self) -> None:
        """Unregister this query's consumers (they are registered again if needed)."""
        self.stop()
        self._committed = None
        self._streams.forget()

    def _ranges(
        self, start: dict[str, PartitionOffset], end: dict[str, PartitionOffset]
    ) -> dict[str, tuple[ManifestState, PartitionOffset, PartitionOffset]]:
        """Each partition's (manifest state, start, end) with something to read in between."""
        out = {}
        for key in sorted(start):
            if key not in end or end[key] == start[key] or key not in self._streams.mls:
                continue
            m = self._states.get(key)
            if m is None:
                continue  # deleted meanwhile: planning reports it
            out[key] = (m, self._effective_start(start[key], end[key]), end[key])
        return out

    def _count(self, start: dict[str, PartitionOffset], end: dict[str, PartitionOffset]) -> int:
        """Messages in (start, end] over every partition, from fragment metadata."""
        return sum(
            self._meter.messages(self._streams.mls[k], m, s, e)
            for k, (m, s, e) in self._ranges(start, end).items()
        )

    def _cap(
        self,
        start: dict[str, PartitionOffset],
        end: dict[str, PartitionOffset],
        *,
        rows: int | None = None,
        nbytes: int | None = None,
    ) -> dict[str, PartitionOffset]:
        """Cut ``end`` so at most ``rows`` messages (or about ``nbytes``) are admitted, split
        over the partitions in proportion to each one's backlog (as Spark's Kafka source
        does), never less than one message. Counted from fragment metadata (see
        :class:`MessageMeter`)."""
        budget = rows if rows is not None else nbytes
        assert budget is not None
        out = dict(end)  # partitions new to the offsets stay at their start (see above)
        out.update({k: v for k, v in start.items() if k in end})
        ranges = self._ranges(start, end)
        sizes = {}
        for key, (m, s, e) in ranges.items():
            ml = self._streams.mls[key]
            sizes[key] = (
                self._meter.messages(ml, m, s, e, exact=True)
                if rows is not None
                else ml_bytes(ml, m, s, e)
            )
        if sum(sizes.values()) <= budget:
            return end
        for key, quota in apportion(sizes, budget).items():
            if quota <= 0:
                continue
            m, s, e = ranges[key]
            ml = self._streams.mls[key]
            if rows is not None:
                out[key] = self._meter.cut_messages(ml, m, s, e, quota)
            else:
                out[key] = cut_bytes(ml, m, s, e, quota)
        return out

    def _claim(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Shared/Key_Shared: claim entries for this query; the offset lists them.

        A message limit (``maxMessagesPerTrigger``) counts messages, as Failover's offsets
        do: the batch entry where it runs out is split, its first messages in this batch and
        the rest kept claimed (in ``_carry``, under the consumer's lease) for the next
        triggers, which take them before fetching more; so a batch never exceeds the limit
        and always makes progress. How many entries to fetch is estimated from the messages
        per entry seen so far (Pulsar's dispatcher sizes its reads from permits the same
        way). Without a limit, up to :data:`CLAIM_ENTRIES` whole entries.
        """
        self._streams.refresh()
        budget: int | None = None
        if isinstance(limit, ReadMaxRows):
            budget = max(1, limit.max_rows)
        elif isinstance(limit, ReadMinRows):  # the maximum (if any) comes from the options
            budget = self.opts.max_messages
        cap = CLAIM_ENTRIES if budget is None else budget
        for key in [k for k in self._carry if k not in self._streams.consumers]:
            del self._carry[key]  # its consumer is gone, and with it the claims
        claims = self._claim_round(budget, cap)
        if not claims and self._target is not None:
            claims = self._settle(budget, cap)
        if not claims:
            if self._target is not None:
                self._release()
            return start
        self._claim_seq = max(self._claim_seq, int(start.get("seq", 0))) + 1
        return {"claims": claims, "seq": self._claim_seq}

    def _settle(self, budget: int | None, cap: int) -> dict[str, list[list[int]]]:
        """AvailableNow, Shared/Key_Shared: a claim round found nothing. The run ends only
        on a round that claims nothing while the subscription stands still and nothing of
        this query's waits on another's acknowledgement; until then, claim rounds again
        (the claims of the first that finds something, else nothing):

        - a round whose fetches moved their scan (Key_Shared: past entries of slots other
          consumers own) or the subscription's dispatch position (Shared: past delayed or
          acknowledged entries) made progress: a fetch starts from there;
        - another query joining or leaving moves the key ranges (a fetch that was between
          its scan and its claim scans again and hands out nothing): up to
          :data:`_SETTLE_ROUNDS` such rounds;
        - Key_Shared draining: entries pending at another consumer hold back slots this
          query now owns (it gets their later entries once those are acknowledged, as a
          Pulsar consumer does): wait for that, up to ``consumerBusyTimeoutMs`` on the
          reader's clock, then end with a warning (what stays is read by the next run).
        """
        moved = 0
        waited_since: float | None = None
        while True:
            before = self._claim_marks()
            claims = self._claim_round(budget, cap)
            if claims:
                return claims
            after = self._claim_marks()
            change = _compare(before, after)
            if change == "forward":
                continue  # the scans moved on: the next round starts there
            if change == "moved":
                moved += 1
                if moved <= _SETTLE_ROUNDS:
                    continue
                log.warning(
                    "AvailableNow: the subscription changed during each of %d claim rounds "
                    "that found nothing (consumers joining, leaving or committing); this run "
                    "ends here",
                    moved,
                )
                return {}
            if any(mark[4] for mark in after.values()):
                now = self._clock()
                if waited_since is None:
                    waited_since = now
                if (now - waited_since) * 1000 < self.opts.busy_timeout_ms:
                    self._time.sleep(_DRAIN_POLL_S)
                    continue
                log.warning(
                    "AvailableNow: keys of this query wait on messages another consumer of "
                    "the subscription holds unacknowledged (Key_Shared draining) for %d ms "
                    "(consumerBusyTimeoutMs); this run ends, the next reads them",
                    self.opts.busy_timeout_ms,
                )
            return {}

    def _claim_round(self, budget: int | None, cap: int) -> dict[str, list[list[int]]]:
        """One pass of :meth:`_claim` over this query's consumers: what each fetches (after
        its carried pieces), up to ``cap`` entries and ``budget`` messages in all."""
        claims: dict[str, list[list[int]]] = {}
        messages = entries = 0
        for key, c in sorted(self._streams.consumers.items()):
            pieces = self._carry.pop(key, [])
            if pieces:
                c.renew_if_due()  # the carried entries stay claimed under this lease
            taken: list[list[int]] = []
            while entries < cap and (budget is None or messages < budget):
                if not pieces:
                    want = cap - entries
                    if budget is not None:
                        want = min(want, max(1, int((budget - messages) / self._per_entry)))
                    pieces = [p for p in map(piece_of, c.fetch(want)) if p[3] < p[4]]
                    if not pieces:
                        break
                    seen = sum(p[4] - p[3] for p in pieces) / len(pieces)
                    self._per_entry = (self._per_entry + seen) / 2
                room = None if budget is None else budget - messages
                items, pieces, used = take_messages(pieces, room, cap - entries)
                taken += items
                messages += used
                entries += len(items)
            if pieces:
                self._carry[key] = pieces
            if taken:
                claims[key] = taken
        return claims

    def _claim_marks(self) -> dict[str, tuple[int, int, Any, Any, bool]]:
        """Each consumer's subscription state, as :meth:`_settle` compares it over a claim
        round that found nothing: its version, selector version, this consumer's scan
        position (Key_Shared), the dispatch position (Shared) and whether entries pending at
        other consumers hold back slots this consumer owns (draining), all of one state."""
        out = {}
        for key, c in self._streams.consumers.items():
            s = c.state()
            drains = c.drains_in(s)
            out[key] = (s.version, s.selector_version, c.scan_position, s.dispatched, drains)
        return out

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Latest positions plus ``backlog``, shown in the query's progress as the source's
        ``latestOffset`` (read it with :func:`backlog_of`). Spark calls this right after
        :meth:`latestOffset`: the backlog is what remains after the batch just planned --
        messages in (its end, latest] per partition and in total -- so the last batch of an
        AvailableNow run shows what it left (0 when nothing arrived meanwhile), not the
        batch's own size. Uses the manifests latestOffset read (it reads them when called
        alone). Never registers consumers; never part of a checkpoint. Called on the driver
        once per trigger."""
        self._streams.refresh(subscribe=False)
        if not self._states:
            for t in self._streams.partitions:
                try:
                    self._states[str(t)] = self._streams.mls[str(t)].state()
                except TopicNotFound:
                    continue
        out: dict[str, Any] = {}
        per: dict[str, int] = {}
        for t in self._streams.partitions:
            key = str(t)
            m = self._states.get(key)
            if m is None:
                continue
            lat = end_offset(m)
            out[key] = lat.to_json()
            if self._streams.claims_mode:
                if self.opts.durable:
                    per[key] = self._backlog_of(key, self._streams.mls[key], m)
                continue
            done = (self._last_end or {}).get(key)
            if done is None:
                done = START.at(m.incarnation)  # not read yet: all of it
            done = self._effective_start(done, lat)
            per[key] = self._meter.messages(self._streams.mls[key], m, done, lat)
        out["backlog"] = {"messages": sum(per.values()), "partitions": per}
        return out

    def _backlog_of(self, key: str, ml: ManagedLedger, m: ManifestState) -> int:
        st = self._streams.subs.get(key)
        if st is None:
            st = SubscriptionStore(self.store, ml.topic, self.opts.subscription or "")
            if not st.exists():
                return 0
            self._streams.subs[key] = st
        try:
            s = st.latest()
        except SubscriptionNotFound:  # unsubscribed or expired meanwhile
            del self._streams.subs[key]
            return 0
        memo = (m.last_position(), s.version)
        hit = self._backlog.get(key)
        if hit is None or hit[0] != memo:
            hit = self._backlog[key] = (memo, subscription_backlog(ml, m, s))
        return hit[1]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[FilePulsarPartition]:
        """Called on the driver once per batch, after :meth:`latestOffset` -- or, replaying
        a batch after a restart, with offsets from the checkpoint and no latestOffset before.
        Must be deterministic in (start, end): a replay reads the same messages. Returns
        picklable tasks (``start == end``: none).
        """
        if "claims" in end:
            if end.get("seq") == start.get("seq"):
                return []
            filt = tuple(sorted(self.opts.property_filter.items()))
            return [
                FilePulsarPartition(
                    root=self.opts.root,
                    storage_options=self.opts.storage_options,
                    topic=key,
                    start=(-1, -1, WHOLE),
                    end=(-1, -1, WHOLE),
                    positions=tuple((p[0], p[1], p[2]) for p in ps),
                    slices=tuple(sl for sl in map(claim_slice, ps) if sl is not None),
                    fail_on_data_loss=self.opts.fail_on_data_loss,
                    property_filter=filt,
                    columns=self.opts.emit,
                    value=self.opts.value,
                )
                for key, ps in sorted(end["claims"].items())
            ]
        self._check_checkpoint(start)
        self._streams.refresh()
        s0, e0 = parse_offsets(start), parse_offsets(end)
        begin = {k: self._effective_start(s, e0.get(k)) for k, s in s0.items()}
        # The manifests latestOffset read for this trigger cover its end; a replay after a
        # restart (no latestOffset yet) reads them fresh.
        states = {
            k: m for k, m in self._states.items() if k in e0 and m.last_position() >= e0[k].position
        }
        return plan_partitions(self.store, self.opts, begin, e0, states, mls=self._streams.mls)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Called on an executor once per task attempt, on a copy of this reader unpickled
        there (its driver state is not to be used): reads only ``partition``, so a retry
        reads the same (:func:`~filepulsar.connector.source.read.read_partition`)."""
        return read_partition(partition)  # type: ignore[arg-type]

    def commit(self, end: dict[str, Any]) -> None:
        """Move the durable cursors to ``end`` (acknowledging what this batch read).

        Called on the driver after a batch is in the commit log (Spark calls it while
        planning the next batch); :meth:`latestOffset` also calls it with its ``start``.
        May repeat an ``end`` (after a restart): idempotent.
        """
        if end == self._committed:
            return  # latestOffset calls this with every poll; an idle query writes nothing
        self._streams.refresh()
        if not self._streams.consumers:
            return
        if "claims" in end:
            for key, ps in end["claims"].items():
                c = self._streams.consumers.get(key)
                if c is not None:
                    c.acknowledge([ack for p in ps for ack in claim_acks(p)])
            self._committed = end
            return
        for key, spelled in end.items():
            c = self._streams.consumers.get(key)
            if c is None or not isinstance(spelled, list):
                continue
            off = PartitionOffset.from_json(key, spelled)
            seen = (
                self._streams.mls[key].state(refresh=False).incarnation
                if key in self._streams.mls
                else ""
            )
            if off.incarnation and seen and seen != off.incarnation:
                continue  # an offset in a deleted topic: nothing to acknowledge in the new one
            if off.messages == WHOLE:
                if off.ledger_id >= 0:
                    c.acknowledge_cumulative(off.position)
            else:
                ml = self._streams.mls[key]
                m = self._states.get(key) or ml.state()
                before = offset_before(off.position)
                if before.ledger_id >= 0:
                    c.acknowledge_cumulative(before.position)
                lg = m.ledger(off.ledger_id)
                # The entry's message count: known to the meter when the cut was made here.
                size = (
                    self._meter.entry(ml, m, lg, off.entry_id) if lg is not None else off.messages
                )
                c.acknowledge([(off.position, i, size) for i in range(off.messages)])
        self._committed = end

    def stop(self) -> None:
        """Called once on the driver when the query stops (SIGTERM handled, see
        :func:`~filepulsar.connector.source.consumers._stop_on_sigterm`): unregister the consumers.
        Never raises."""
        self._streams.close()
        self._carry = {}  # closing released their claims
