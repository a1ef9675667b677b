"""Broker-side message deduplication for one topic.

Pulsar keeps, per producer name, the highest sequence id *pushed* (accepted for writing) and the
highest *persisted* (written). A message carries the sequence range
``[sequence_id, highest_sequence_id]`` (a batch covers several ids). On publish:

* if the producer is known and ``sequence_id <= highest pushed``, the message is a duplicate when
  ``sequence_id <= highest persisted`` as well (acknowledged at once with id ``-1:-1``, nothing
  written), and otherwise *unknown*: an earlier copy is still in flight, so the send fails and the
  client retries;
* otherwise it is new: ``highest pushed = max(highest_sequence_id, sequence_id)`` and it is
  written.

Only the highest value is compared, so gaps are fine. A message whose producer assigned no
sequence id carries :data:`NO_SEQUENCE_ID` (any negative id counts as none): it is never a
duplicate and leaves the state alone, as a broker applies deduplication only to
producer-assigned ids. The Spark sink stores its rows so when its input has no ``sequenceId``
column; a pulsar-client producer sending without ``sequence_id=`` assigns ``last + 1`` itself,
which *is* a producer-assigned id. After a failed write or a restart the
pushed map is reset to the persisted one (:meth:`DedupTracker.reset_pushed`); a restart restores
the persisted map from a snapshot and replays the entries written after it
(:meth:`DedupTracker.replay_entry`).

The rule has two forms here, one message at a time (:func:`dedup_decide`, a pure function that
:class:`DedupTracker` applies to its maps and a commit of one entry applies to the manifest's
high-water mark directly) and over a whole array of one producer's sequence ids
(:func:`dedup_keep_mask`, what the Spark operator ``dedup_by_sequence`` applies); a property test
pins them equal.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "NO_SEQUENCE_ID",
    "DedupStatus",
    "DedupTracker",
    "dedup_decide",
    "dedup_keep_mask",
    "sequence_range",
]

_SNAPSHOT_VERSION = 1

#: Sequence id of a message whose producer assigned none (never a duplicate); every negative
#: id is read the same way.
NO_SEQUENCE_ID = -1


class DedupStatus(enum.Enum):
    """Outcome of :meth:`DedupTracker.check` (Pulsar's ``MessageDupStatus``)."""

    NOT_DUP = "NotDup"
    """New message: write it."""
    DUP = "Dup"
    """Already persisted: acknowledge without writing."""
    UNKNOWN = "Unknown"
    """Pushed but not yet persisted: fail the send so the producer retries."""


# (The members as module names: an enum member read through its class costs a lookup each time,
# about 60 ns on CPython 3.11, and dedup_decide runs once per published entry.)
_NOT_DUP, _DUP, _UNKNOWN = DedupStatus.NOT_DUP, DedupStatus.DUP, DedupStatus.UNKNOWN


def sequence_range(sequence_id: int, highest_sequence_id: int | None) -> int:
    """The highest id of a message covering ``[sequence_id, highest_sequence_id]`` (None: a
    single id): what :meth:`DedupTracker.check` records as pushed when it is new.

    Raises
    ------
    TypeError
        If ``sequence_id`` is not an int.
    """
    if not isinstance(sequence_id, int) or isinstance(sequence_id, bool):
        raise TypeError(f"sequence_id must be an int, got {type(sequence_id).__name__}")
    if highest_sequence_id is None:
        return sequence_id
    return max(highest_sequence_id, sequence_id)


def dedup_decide(
    sequence_id: int,
    highest_sequence_id: int | None,
    last_pushed: int | None,
    last_persisted: int | None,
) -> tuple[DedupStatus, int | None]:
    """Pulsar's rule for one message (the module docstring), as a pure function of the
    producer's two high-water marks.

    Parameters
    ----------
    sequence_id, highest_sequence_id
        The message's range (``highest_sequence_id`` None: a single id).
    last_pushed, last_persisted
        The producer's highest pushed and persisted ids, None when unknown. A caller that has
        nothing in flight (a commit, which persists what it accepts) passes the same value
        twice, and ``UNKNOWN`` cannot occur.

    Returns
    -------
    tuple
        ``(status, pushed)``: the decision and the producer's highest pushed id afterwards,
        ``max(highest_sequence_id, sequence_id)`` when ``NOT_DUP`` with an assigned id, else
        ``last_pushed`` unchanged. A negative ``sequence_id`` (no producer-assigned id) is
        ``NOT_DUP`` and changes nothing.

    Raises
    ------
    TypeError
        If ``sequence_id`` is not an int.
    """
    if type(sequence_id) is not int:  # (the usual case checked without a call: a commit's)
        sequence_range(sequence_id, highest_sequence_id)  # raises unless an int subclass
    if sequence_id < 0:
        return _NOT_DUP, last_pushed
    if last_pushed is not None and sequence_id <= last_pushed:
        if last_persisted is not None and sequence_id <= last_persisted:
            return _DUP, last_pushed
        return _UNKNOWN, last_pushed
    # (sequence_range's maximum, without its call: this runs once per published entry)
    if highest_sequence_id is None or highest_sequence_id < sequence_id:
        return _NOT_DUP, sequence_id
    return _NOT_DUP, highest_sequence_id


def _is_partial_chunk(chunk_id: int | None, num_chunks: int | None) -> bool:
    if chunk_id is None:
        return False
    if num_chunks is None or not 0 <= chunk_id < num_chunks:
        raise ValueError(f"chunk_id {chunk_id} needs num_chunks > chunk_id, got {num_chunks}")
    return chunk_id != num_chunks - 1


class DedupTracker:
    """Sequence-id bookkeeping of one topic, mirroring Pulsar's ``MessageDeduplication``.

    The tracker is plain state: no clock, no I/O. The caller decides when a write succeeded
    (:meth:`record_persisted`), failed (:meth:`reset_pushed`) or when to snapshot.
    """

    def __init__(self) -> None:
        self._pushed: dict[str, int] = {}
        self._persisted: dict[str, int] = {}

    def check(
        self,
        producer_name: str,
        sequence_id: int,
        highest_sequence_id: int | None = None,
        *,
        chunk_id: int | None = None,
        num_chunks: int | None = None,
    ) -> DedupStatus:
        """Classify a message about to be written, recording it as pushed when it is new.

        Parameters
        ----------
        producer_name
            Name of the producer that sent the message.
        sequence_id
            The message's (or batch's first) sequence id.
        highest_sequence_id
            Last sequence id of a batch; ``None`` for a single message.
        chunk_id, num_chunks
            For a chunk of a chunked message: only the last chunk is checked (earlier chunks are
            always ``NOT_DUP`` and leave the state alone), as all chunks share one sequence id.

        Returns
        -------
        DedupStatus
            ``NOT_DUP`` (highest pushed now ``max(highest_sequence_id, sequence_id)``), ``DUP`` or
            ``UNKNOWN`` (state unchanged). A negative ``sequence_id`` (no producer-assigned id)
            is ``NOT_DUP`` and leaves the state alone.

        Raises
        ------
        ValueError
            If ``chunk_id`` is given without a valid ``num_chunks``.
        """
        last_pushed = self._pushed.get(producer_name)
        status, pushed = dedup_decide(
            sequence_id, highest_sequence_id, last_pushed, self._persisted.get(producer_name)
        )
        if _is_partial_chunk(chunk_id, num_chunks):
            return DedupStatus.NOT_DUP
        if pushed is not None and pushed != last_pushed:
            self._pushed[producer_name] = pushed
        return status

    def record_persisted(
        self,
        producer_name: str,
        sequence_id: int,
        highest_sequence_id: int | None = None,
        *,
        chunk_id: int | None = None,
        num_chunks: int | None = None,
    ) -> None:
        """Record that a message was written.

        The producer's highest persisted id becomes ``max(highest_sequence_id, sequence_id)``
        unless it is already higher (writes are recorded in order, so Pulsar's plain overwrite
        and this maximum agree). A non-final chunk, or a message without a producer-assigned
        id (negative ``sequence_id``), records nothing.

        Raises
        ------
        ValueError
            If ``chunk_id`` is given without a valid ``num_chunks``.
        """
        highest = sequence_range(sequence_id, highest_sequence_id)
        if _is_partial_chunk(chunk_id, num_chunks) or sequence_id < 0:
            return
        current = self._persisted.get(producer_name)
        if current is None or highest > current:
            self._persisted[producer_name] = highest

    def replay_entry(
        self, producer_name: str, sequence_id: int, highest_sequence_id: int | None = None
    ) -> None:
        """Apply an entry found in the log after the last snapshot (recovery).

        Both maps take ``max(highest_sequence_id, sequence_id)`` for the producer; entries must
        be replayed in log order. An entry without a producer-assigned id (negative
        ``sequence_id``) changes nothing.
        """
        highest = sequence_range(sequence_id, highest_sequence_id)
        if sequence_id < 0:
            return
        self._pushed[producer_name] = highest
        self._persisted[producer_name] = highest

    def reset_pushed(self) -> None:
        """Forget what was pushed but not persisted: pushed becomes a copy of persisted.

        Pulsar does this when a write fails and when the topic is loaded again.
        """
        self._pushed = dict(self._persisted)

    def highest_pushed(self, producer_name: str) -> int | None:
        """Highest sequence id accepted from the producer, or ``None`` if unknown."""
        return self._pushed.get(producer_name)

    def highest_persisted(self, producer_name: str) -> int | None:
        """Highest sequence id written for the producer, or ``None`` if unknown."""
        return self._persisted.get(producer_name)

    def producers(self) -> list[str]:
        """Producers with any recorded state, sorted."""
        return sorted(self._pushed.keys() | self._persisted.keys())

    def snapshot(self) -> dict[str, Any]:
        """JSON-compatible copy of both maps; :meth:`from_snapshot` restores it exactly.

        To model a broker restart, restore and then call :meth:`reset_pushed` (or snapshot only
        what was persisted and replay the log after it).
        """
        return {
            "version": _SNAPSHOT_VERSION,
            "pushed": dict(sorted(self._pushed.items())),
            "persisted": dict(sorted(self._persisted.items())),
        }

    @classmethod
    def from_snapshot(cls, snapshot: Mapping[str, Any]) -> DedupTracker:
        """Rebuild a tracker from :meth:`snapshot` output.

        Raises
        ------
        ValueError
            If the snapshot has another version or malformed maps.
        """
        if not isinstance(snapshot, Mapping) or snapshot.get("version") != _SNAPSHOT_VERSION:
            version = snapshot.get("version") if isinstance(snapshot, Mapping) else None
            raise ValueError(
                f"unsupported dedup snapshot version {version!r} (expected {_SNAPSHOT_VERSION})"
            )
        tracker = cls()
        for key, target in (("pushed", tracker._pushed), ("persisted", tracker._persisted)):
            values = snapshot.get(key, {})
            if not isinstance(values, Mapping):
                raise ValueError(f"dedup snapshot field {key!r} must be a mapping")
            for name, seq in values.items():
                if not isinstance(name, str) or not isinstance(seq, int) or isinstance(seq, bool):
                    raise ValueError(f"dedup snapshot {key}[{name!r}] = {seq!r} is not str -> int")
                target[name] = seq
        return tracker

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DedupTracker):
            return NotImplemented
        return self._pushed == other._pushed and self._persisted == other._persisted

    def __repr__(self) -> str:
        return f"DedupTracker(pushed={self._pushed!r}, persisted={self._persisted!r})"


def dedup_keep_mask(
    sequence_ids: npt.ArrayLike, highest_persisted: int | None
) -> tuple[npt.NDArray[np.bool_], int | None]:
    """Pulsar's dedup decision for one producer's messages, in publish order, vectorised.

    A message is new when its sequence id is above the highest persisted before it: the
    producer's stored highest and every earlier sequence id in ``sequence_ids``. A negative
    id (:data:`NO_SEQUENCE_ID`, no producer-assigned id) is always kept and takes no part in
    the highest. This equals
    :meth:`DedupTracker.check` followed by ``record_persisted`` for each kept
    message, one message at a time (for messages that are all persisted, "pushed" and
    "persisted" coincide, so ``UNKNOWN`` cannot occur).

    Parameters
    ----------
    sequence_ids
        Integer sequence ids in the order the messages were written.
    highest_persisted
        The producer's highest persisted id before these messages, or ``None`` if unknown.

    Returns
    -------
    tuple
        ``(keep, highest)``: boolean mask of new messages and the new highest persisted id.
    """
    seq = np.asarray(sequence_ids, dtype=np.int64)
    assigned = seq >= 0
    if not assigned.any():
        return np.ones(seq.shape, dtype=np.bool_), highest_persisted
    # Unassigned ids become -1, below every assigned one: they never raise the running maximum.
    running = np.maximum.accumulate(np.where(assigned, seq, NO_SEQUENCE_ID))
    keep = np.empty(seq.shape, dtype=np.bool_)
    keep[1:] = seq[1:] > running[:-1]
    keep[0] = True
    if highest_persisted is not None:
        keep &= seq > highest_persisted
    keep |= ~assigned
    top = int(running[-1])
    return keep, top if highest_persisted is None else max(top, highest_persisted)
