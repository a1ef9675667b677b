"""Dispatch claims as pure functions: what a fetch of each subscription type takes from a
:class:`~filepulsar.storage.cursor.SubscriptionState`.

Each function changes the state it is given (a commit's working copy) and returns what was
claimed, or raises :class:`~filepulsar.storage.versioned.Abort` with one of the sentinels
(:data:`LOST`, :data:`RESCAN`, :data:`IDLE`) so that the commit writes nothing. Everything they need
comes in as plain values: the candidate positions the caller already read, which of them
delayed delivery holds and until when, the consumer id, the time, the lease, the consumers
whose lease the caller judged lapsed (:class:`~filepulsar.storage.consumer_leases.LeaseWatch`, from
its own monotonic clock: wall clocks never decide a lease), the limit, and for Key_Shared each
candidate's slot and the selector the caller scanned with. No I/O and no clock reads:
:class:`~filepulsar.storage.delivery.Dispatcher` reads the entries, calls these from its commit's
change function (which a commit may apply again, to a newer state, after a lost race) and
keeps the lease bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from filepulsar.dispatch.selectors.base import StickyKeyConsumerSelector
from filepulsar.storage.cursor import (
    SubscriptionState,
    key_pos,
    pos_key,
    selector_owner,
)
from filepulsar.storage.ledger import Position
from filepulsar.storage.versioned import Abort

# The sentinels a claim aborts its commit with (typed Any: one stands for a whole result).
LOST: Any = "lost-registration"
"""The consumer's registration is gone (its lease lapsed and another fetch purged it)."""
RESCAN: Any = "rescan"
"""The Key_Shared selector changed since the caller scanned: scan again from the cursor."""
IDLE: Any = "idle"
"""Nothing to claim: nothing written, the lease not renewed."""


def _owner_of(selector: StickyKeyConsumerSelector) -> Callable[[int], str | None]:
    """The ``sel_id`` owning a slot, asked of ``selector`` once per slot (a claim looks at
    many entries of few slots)."""
    owners: dict[int, str | None] = {}

    def owner(slot: int) -> str | None:
        if slot not in owners:
            owners[slot] = selector_owner(selector, slot)
        return owners[slot]

    return owner


#: What a claim hands out: a position and its redelivery count, in delivery order.
Claim = tuple[Position, int]


def due_redeliveries(state: SubscriptionState, now: int) -> list[Position]:
    """The positions in ``state.redeliver`` whose not-before time is ``now`` or earlier, in
    position order. Changes nothing."""
    return sorted(key_pos(k) for k, v in state.redeliver.items() if v[1] <= now)


def passed_over(state: SubscriptionState, p: Position) -> bool:
    """Exclusive / Failover: whether the sequential read skips entry ``p``: it is acknowledged,
    or waits in ``redeliver`` (the redelivery path hands it out). Changes nothing."""
    return state.is_acked(p) or pos_key(p) in state.redeliver


def take_redeliveries(state: SubscriptionState, positions: Iterable[Position]) -> None:
    """Exclusive / Failover: remove ``positions`` (due redeliveries the caller is about to
    hand out again) from ``state.redeliver``; positions not there are ignored. Never aborts."""
    for p in positions:
        state.redeliver.pop(pos_key(p), None)


def claim_shared(
    state: SubscriptionState,
    *,
    cid: str,
    now: int,
    lease_ms: int,
    lapsed: Collection[str],
    candidates: Sequence[Position],
    held: Mapping[Position, int],
    max_entries: int,
) -> list[Claim]:
    """Shared: claim up to ``max_entries`` entries for consumer ``cid`` at time ``now``.

    Parameters
    ----------
    state
        The state to change (a commit's working copy).
    lapsed
        Ids of the consumers whose lease the caller judged lapsed (in this state).
    candidates
        The entries after ``dispatched`` the caller read, in position order.
    held
        The candidates delayed delivery holds, with when each becomes deliverable (ms).

    Returns
    -------
    The claims in delivery order: first the redeliveries due at ``now`` (position order, with
    their redelivery counts; acknowledged ones are dropped from ``redeliver`` unclaimed), then
    candidates after ``dispatched`` (count 0). In ``state``: the ``lapsed`` consumers are
    purged (their pending entries go to ``redeliver``), the lease of ``cid`` is renewed,
    each claim is ``pending`` at ``cid``, ``dispatched`` moves past every candidate looked
    at; a held candidate goes to ``redeliver`` with its due time (count 0, slot -1), and
    acknowledged candidates or ones already pending or in ``redeliver`` are passed over.

    Raises
    ------
    Abort(LOST)
        ``cid`` is no longer registered (it must register again).
    Abort(IDLE)
        Nothing claimed and ``dispatched`` did not move (nothing worth writing).
    """
    state.purge(lapsed, now, keep=cid)
    if cid not in state.consumers:
        raise Abort(LOST)
    state.consumers[cid].extend(now, lease_ms)
    claimed: list[Claim] = []
    was_dispatched = state.dispatched
    for p in due_redeliveries(state, now):
        if len(claimed) >= max_entries:
            break
        count, _, slot = state.redeliver.pop(pos_key(p))
        if state.is_acked(p):
            continue
        state.pending[pos_key(p)] = [cid, count, slot]
        claimed.append((p, count))
    for p in candidates:
        if p <= state.dispatched:
            continue
        if len(claimed) >= max_entries:
            break
        state.dispatched = p
        if state.is_acked(p):
            continue
        if pos_key(p) in state.pending or pos_key(p) in state.redeliver:
            continue  # dispatch moved back over it (cap_ack_ranges): already out
        if p in held:
            state.redeliver[pos_key(p)] = [0, held[p], -1]
            continue
        state.pending[pos_key(p)] = [cid, 0, -1]
        claimed.append((p, 0))
    if not claimed and state.dispatched == was_dispatched:
        raise Abort(IDLE)  # nothing changed (passing held entries is a change to keep)
    return claimed


def claim_key_shared(
    state: SubscriptionState,
    *,
    cid: str,
    now: int,
    lease_ms: int,
    lapsed: Collection[str],
    scan_version: int,
    selector: StickyKeyConsumerSelector,
    slots: Mapping[Position, int],
    held: Mapping[Position, int],
    max_entries: int,
) -> tuple[list[Claim], Position | None]:
    """Key_Shared: claim up to ``max_entries`` entries of the slots consumer ``cid`` owns, in
    position order per slot, at time ``now``.

    Parameters
    ----------
    state
        The state to change (a commit's working copy).
    lapsed
        Ids of the consumers whose lease the caller judged lapsed (in this state).
    scan_version, selector
        The ``selector_version`` of the state the caller scanned with, and that state's
        selector (the owner of each slot is read from it).
    slots
        The candidates (entries scanned from the scan position, plus the due redeliveries the
        caller read), each with its sticky-key slot.
    held
        The candidates delayed delivery holds, with when each becomes deliverable (ms).

    Returns
    -------
    ``(claims, first_unclaimed)``: the claims in position order (counts from ``redeliver``,
    else 0), and the first candidate of an owned slot that was left for later (blocked, or
    past ``max_entries``; None if none), where the next scan must start. Or ``RESCAN`` when
    the purge of a lapsed consumer moved hashes: the purge is to be committed, then the
    caller scans again. In ``state``: the ``lapsed`` consumers are purged, the lease of
    ``cid`` is renewed, each claim is ``pending`` at ``cid`` (leaving ``redeliver``). A slot
    is blocked (nothing of it claimed after that point) when another consumer has an entry of
    it pending (draining), when an entry of it waits in ``redeliver`` not yet due or not among
    the candidates, after a held entry of it (recorded in ``redeliver`` with its due time),
    and after an entry of it left for later. Acknowledged and pending candidates and those of
    slots owned by others are passed over.

    Raises
    ------
    Abort(RESCAN)
        ``state.selector_version`` is not ``scan_version``: hashes moved since the scan; or
        a consumer has not yet recorded its deliveries for this membership (:func:`unsynced`).
    Abort(LOST)
        ``cid`` is no longer registered (it must register again).
    Abort((IDLE, first_unclaimed))
        Nothing claimed and no held entry recorded (nothing worth writing).
    """
    if state.selector_version != scan_version:
        # Hashes moved since this consumer scanned: its candidates may miss older
        # entries of slots it now owns. Scan again rather than claim out of order.
        raise Abort(RESCAN)
    state.purge(lapsed, now, keep=cid)
    if cid not in state.consumers:
        raise Abort(LOST)
    state.consumers[cid].extend(now, lease_ms)
    assert state.selector is not None
    if state.selector_version != scan_version:
        # The purge of a departed consumer moved hashes: commit the purge (every
        # consumer would otherwise redo it and abort, until a lease renewal), then
        # scan again.
        return RESCAN  # typed Any: the sentinel stands for the whole result
    if unsynced(state):
        # A consumer that records its deliveries only when membership changes has not
        # recorded them for this membership yet: any slot may still be in flight there.
        raise Abort(RESCAN)
    own = state.consumers[cid].sel_id
    blocked: set[int] = set()
    # Draining: a slot with entries pending at another consumer stays blocked.
    for v in state.pending.values():
        if v[0] != cid:
            blocked.add(v[2])
    for k, v in state.redeliver.items():
        if v[1] > now or key_pos(k) not in slots:
            # An earlier entry of the slot waits (not yet due, or handed back after
            # this consumer read its candidates): keep the slot's order.
            blocked.add(v[2])
    claimed: list[Claim] = []
    first_unclaimed: Position | None = None
    held_recorded = False
    owner = _owner_of(selector)
    for p in sorted(slots):
        slot = slots[p]
        if owner(slot) != own or state.is_acked(p):
            continue
        k = pos_key(p)
        if k in state.pending:
            continue
        if p in held and k not in state.redeliver:
            state.redeliver[k] = [0, held[p], slot]
            blocked.add(slot)
            held_recorded = True
            continue
        if slot in blocked or len(claimed) >= max_entries:
            blocked.add(slot)
            if first_unclaimed is None and k not in state.redeliver:
                first_unclaimed = p
            continue
        count = 0
        if k in state.redeliver:
            count = state.redeliver.pop(k)[0]
        state.pending[k] = [cid, count, slot]
        claimed.append((p, count))
    if not claimed and not held_recorded:
        raise Abort((IDLE, first_unclaimed))
    return claimed, first_unclaimed


def unsynced(state: SubscriptionState, lapsed: Collection[str] = ()) -> bool:
    """Key_Shared: whether a registered consumer (but those in ``lapsed``) that records its
    deliveries only when membership changes has not recorded them since the last change
    (its ``synced`` is not ``selector_version``). Nobody hands out anything new meanwhile: a
    slot that moved may still have entries in flight at its previous owner, unrecorded.
    Changes nothing."""
    v = state.selector_version
    return any(
        c.synced is not None and c.synced != v and c.cid not in lapsed
        for c in state.consumers.values()
    )


def record_in_flight(
    state: SubscriptionState, cid: str, in_flight: Mapping[Position, tuple[int, int]]
) -> None:
    """Key_Shared: consumer ``cid`` records what it handed out and holds (``in_flight``:
    position → ``(slot, redelivery count)``) as ``pending`` at it, as a claim would have,
    and that it did so for this membership (``synced`` = ``selector_version``). Entries
    acknowledged meanwhile, or pending already, are left as they are; a recorded entry
    leaves ``redeliver``. Pulsar's draining then applies: a slot that moved stays blocked for
    its new owner until these are acknowledged (or handed back). Never aborts; ``cid`` must
    be registered."""
    for p, (slot, count) in in_flight.items():
        k = pos_key(p)
        if k in state.pending or state.is_acked(p):
            continue
        state.redeliver.pop(k, None)
        state.pending[k] = [cid, count, slot]
    state.consumers[cid].synced = state.selector_version


def nothing_to_claim_key_shared(
    state: SubscriptionState,
    *,
    cid: str,
    selector: StickyKeyConsumerSelector,
    slots: Mapping[Position, int],
) -> bool:
    """Key_Shared: whether :func:`claim_key_shared` on ``state`` would claim nothing and
    record nothing for consumer ``cid``: no candidate is of a slot it owns and still to
    deliver (unacknowledged and not pending). The caller then spares the commit (its scan
    moves past the candidates, as after an idle claim). Only for a state where ``cid`` is
    registered and nobody is to be purged: a purge may move hashes.
    """
    c = state.consumers.get(cid)
    if c is None:
        return False
    own = c.sel_id
    owner = _owner_of(selector)
    for p, slot in slots.items():
        if owner(slot) == own and not state.is_acked(p) and pos_key(p) not in state.pending:
            return False
    return True


def next_scan_pos(
    candidates: Iterable[Position],
    first_unclaimed: Position | None,
    scanned_to: Position | None,
    scan_pos: Position | None,
) -> Position | None:
    """Key_Shared: where the consumer's next scan resumes (it reads after this position).

    With an entry left for later (``first_unclaimed``): the candidate just before it (kept at
    ``scan_pos`` if there is none); else the last entry scanned (``scanned_to``), or
    ``scan_pos`` when nothing was scanned.
    """
    if first_unclaimed is not None:
        prev = [p for p in sorted(candidates) if p < first_unclaimed]
        return prev[-1] if prev else scan_pos
    if scanned_to is not None:
        return scanned_to
    return scan_pos
