"""A publish of one entry (a producer's usual commit) applies broker-side dedup by its own
short path in ``apply_entries`` (``dedup_decide`` on the manifest's mark, no tracker): the same
decisions, recorded high-water marks and use times as the tracker (``DedupTracker``) that a
publish of several entries applies."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from filepulsar.dispatch.dedup import DedupStatus, DedupTracker
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.commit import PendingEntry, apply_entries
from filepulsar.storage.ledger import ManagedLedger
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import Policies

pytestmark = pytest.mark.unit


def _entry(seq: int, highest: int) -> PendingEntry:
    return PendingEntry.of([b"x" * 8], 1, 1_000, "p", seq, highest)


def _expected(persisted: int | None, seq: int, highest: int) -> tuple[bool, int | None]:
    """Kept, and the producer's recorded id afterwards, by the tracker's rule."""
    t = DedupTracker()
    if persisted is not None:
        t.record_persisted("p", persisted)
    t.reset_pushed()
    kept = t.check("p", seq, highest) is DedupStatus.NOT_DUP
    if kept:
        t.record_persisted("p", seq, highest)
    return kept, t.highest_persisted("p")


def _apply(
    ml: ManagedLedger, entries: list[PendingEntry], persisted: int | None
) -> tuple[ManifestState, list[bool]]:
    """The state after publishing ``entries``, and whether each was kept."""
    state = ManifestState(topic=str(ml.topic), partition=-1)
    if persisted is not None:
        state.note_dedup("p", persisted, 500)
    out, _, _ = apply_entries(
        ml,
        state,
        entries,
        ["b"] * len(entries),
        [8 * i for i in range(len(entries))],
        policies=Policies(),
        now=2_000,
        dedup=True,
        indexes=[],
    )
    return state, [p is not None for p in out]


def test_one_entry_decides_as_the_tracker(tmp_path: Path) -> None:
    ml = ManagedLedger(LocalBlobStore(str(tmp_path)), TopicName.parse("t"))
    for persisted, seq, extra in itertools.product((None, 4, 9), (-1, 0, 4, 5, 9, 10), (0, 3)):
        highest = seq + extra
        kept, recorded = _expected(persisted, seq, highest)
        state, out = _apply(ml, [_entry(seq, highest)], persisted)
        case = f"persisted {persisted}, ids {seq}..{highest}"
        assert out == [kept], case
        assert state.dedup.get("p") == recorded, case
        if recorded is not None:
            assert state.dedup_used["p"] == 2_000, case  # used now, kept or not
        else:
            assert "p" not in state.dedup_used, case


def test_one_entry_and_two_agree(tmp_path: Path) -> None:
    """The same entry, alone or after an entry of an older id (the tracker's path): the same
    decision for it and the same recorded id."""
    ml = ManagedLedger(LocalBlobStore(str(tmp_path)), TopicName.parse("t"))
    for persisted, seq, extra in itertools.product((5, 9), (6, 9, 10, 12), (0, 2)):
        one, kept_one = _apply(ml, [_entry(seq, seq + extra)], persisted)
        two, kept_two = _apply(ml, [_entry(1, 1), _entry(seq, seq + extra)], persisted)
        case = f"persisted {persisted}, ids {seq}..{seq + extra}"
        assert kept_one == kept_two[1:], case
        assert one.dedup == two.dedup, case
