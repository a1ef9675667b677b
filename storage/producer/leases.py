"""A producer's partition leases: its registration in each partition's manifest (access modes,
fencing, ``WaitForExclusive``, the dedup high-water mark it resumes from), their renewal and
their removal, and the writer each registered partition is written through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from filepulsar.dispatch.clock import Clock
from filepulsar.dispatch.modes import ProducerAccessMode
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import (
    FilePulsarError,
    ProducerBusy,
    ProducerFenced,
)
from filepulsar.storage.ledger import ManagedLedger
from filepulsar.storage.manifest import ManifestState, ProducerLease
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import Policies
from filepulsar.storage.versioned import Abort
from filepulsar.storage.writer import LedgerWriter

log = logging.getLogger(__name__)

_WAIT = "wait"


@dataclass(frozen=True, eq=False)
class Partition:
    """One registered partition: its ledger, the producer's writer on it, and the sequence
    id its next message gets by default (after the dedup high-water mark when dedup is on)."""

    ml: ManagedLedger
    writer: LedgerWriter
    next_seq: int

    @property
    def index(self) -> int:
        """The partition's number (-1 for a non-partitioned topic)."""
        return self.ml.partition


@dataclass(frozen=True, eq=False)
class PartitionLeases:
    """A producer's lease on each partition it writes: its registration in the partition's
    manifest (access mode, fencing, ``WaitForExclusive``, the dedup high-water mark it resumes
    from), renewal and removal. Owned by :class:`~filepulsar.storage.producer.Producer`; holds
    no state of its own beyond its settings (the partitions it registers are returned).

    Parameters
    ----------
    store, producer_name, session, access_mode, policies, dedup, persistent
        The producer's: where it writes, who it is (its name, and the session that tells this
        instance from another with the same name), its access mode, the topic's
        policies, whether dedup applies and whether the topic is persistent.
    clock, waits
        Wall-clock ms (leases' expiry) and the clock ``WaitForExclusive`` sleeps on.
    """

    store: BlobStore
    producer_name: str
    session: str
    access_mode: ProducerAccessMode
    policies: Policies
    dedup: bool
    persistent: bool
    clock: Callable[[], int]
    waits: Clock

    # ------------------------------------------------------------------ registration
    def register(self, topic: TopicName, initial_sequence_id: int | None) -> Partition:
        """Register on partition ``topic`` (one manifest commit; ``WaitForExclusive`` waits
        for the exclusive producer to go) and return the partition's writer state, its next
        sequence id after the dedup high-water mark when dedup is on.

        Raises
        ------
        ProducerBusy, ProducerFenced
            As Pulsar's broker refuses the producer in its access mode.
        """
        ml = ManagedLedger(self.store, topic, clock=self.clock)
        mode = self.access_mode
        lease_ms = self.policies.producer_lease_ms
        name, session = self.producer_name, self.session

        def change(state: ManifestState) -> int:
            now = self.clock()
            for k in [k for k, p in state.producers.items() if p.expires_ms <= now]:
                del state.producers[k]
            mine = state.producers.get(name)
            if mine is not None and mine.session != session:
                raise ProducerBusy(f"producer with name {name!r} is already connected to {topic}")
            others = [p for k, p in state.producers.items() if k != name]
            exclusive = [p.name for p in others if p.access_mode is not ProducerAccessMode.Shared]
            if mode is ProducerAccessMode.Shared:
                if exclusive:
                    raise ProducerFenced(
                        f"topic {topic} has an existing exclusive producer: {exclusive[0]}"
                    )
                epoch = state.topic_epoch
            elif mode is ProducerAccessMode.ExclusiveWithFencing:
                # Pulsar's fencing mode: every other producer loses its registration (its next
                # write fails with ProducerFenced) and this one becomes the exclusive producer.
                for k in [k for k in state.producers if k != name]:
                    del state.producers[k]
                state.topic_epoch += 1
                epoch = state.topic_epoch
            else:
                if others:
                    if mode is ProducerAccessMode.WaitForExclusive:
                        raise Abort(_WAIT)
                    if exclusive:
                        raise ProducerFenced(
                            f"topic {topic} has an existing exclusive producer: {exclusive[0]}"
                        )
                    raise ProducerBusy(f"topic {topic} has existing shared producers")
                state.topic_epoch += 1
                epoch = state.topic_epoch
            state.producers[name] = ProducerLease(name, session, mode, epoch, now + lease_ms)
            return state.dedup.get(name, -1)

        while True:
            _, last = ml.manifest.commit(change)
            if last != _WAIT:
                break
            self.waits.sleep(min(0.2, lease_ms / 10000))
        next_seq = initial_sequence_id + 1 if initial_sequence_id is not None else 0
        if self.dedup and isinstance(last, int):
            next_seq = max(next_seq, last + 1)
        writer = LedgerWriter(
            ml,
            producer_name=name,
            session=session,
            policies=self.policies,
            durable=self.persistent,
        )
        return Partition(ml, writer, next_seq)

    def register_all(
        self, topics: list[TopicName], initial_sequence_id: int | None
    ) -> list[Partition]:
        """:meth:`register` on every topic in order; on a failure, the ones registered so far
        are unregistered and the error raised."""
        parts: list[Partition] = []
        try:
            for t in topics:
                parts.append(self.register(t, initial_sequence_id))
        except BaseException:
            self.unregister_all(parts)
            raise
        return parts

    def unregister_all(self, parts: list[Partition]) -> None:
        """:meth:`unregister` every partition."""
        for p in parts:
            self.unregister(p)

    def unregister(self, part: Partition) -> None:
        """Remove the lease from ``part``'s manifest (a failure is logged: the lease then
        lapses) and close its writer."""
        name, session = self.producer_name, self.session

        def change(state: ManifestState) -> None:
            lease = state.producers.get(name)
            if lease is None or lease.session != session:
                raise Abort()
            del state.producers[name]

        try:
            part.ml.manifest.commit(change)
        except FilePulsarError as e:
            log.warning("could not unregister %s from %s: %s", name, part.ml.topic, e)
        part.writer.close()
