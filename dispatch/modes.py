"""Pulsar's closed sets, each one enum, each parsed by one function.

Every closed set a user types -- in the client, in a Spark option, on the command line -- is an
enum here, and every entry point turns what the user typed into the enum with
:func:`parse_mode` (each enum's ``parse``). The enums carry pulsar-client's member names and
numbers (``ConsumerType.KeyShared == 3``), so code written for pulsar-client keeps working;
``filepulsar.connector.client.types`` re-exports them under those names.

Spellings
---------
Each member has two spellings: its pulsar-client name (``KeyShared``, ``AutoSplit``,
``RoundRobinDistribution``) and its wire name -- the name Pulsar's broker, Java client,
admin tools and this project's stored files use (``Key_Shared``, ``AUTO_SPLIT``,
``RoundRobinPartition``); :attr:`Mode.wire` gives it. Where the two differ only in case or
underscores, they are the same spelling.

Case rules: matching ignores case, underscores, hyphens and surrounding blanks, so
``Key_Shared``, ``KeyShared``, ``key_shared`` and ``KEYSHARED`` are one value, and
``AUTO_SPLIT``, ``AutoSplit`` and ``auto-split`` another. No two members of one set collide
under these rules (``tests/test_modes.py`` checks it). A member of the enum itself is accepted
as is, and a member of another enum is matched by its name (e.g. a pulsar-client enum).

A value outside the set raises :class:`~filepulsar.storage.errors.InvalidConfiguration` (a
``ValueError``) in one line that names what was given and lists the allowed spellings.

``"AUTO_SPLIT"`` means one thing everywhere: the Key_Shared mode whose hash ranges the
dispatcher assigns. Which selector implements it (consistent hashing, Pulsar's default, or
auto-split hash ranges) is the separate broker setting ``use_consistent_hashing``
(``subscriptionKeySharedUseConsistentHashing``), for a subscription and for
``filepulsar.dispatch.spark.key_shared_assign`` alike.
"""

from __future__ import annotations

import enum
from typing import TypeVar

from filepulsar.dispatch.errors import InvalidConfiguration

__all__ = [
    "BatchingType",
    "CompressionType",
    "ConsumerType",
    "HashingScheme",
    "InitialPosition",
    "KeySharedMode",
    "Mode",
    "PartitionsRoutingMode",
    "ProducerAccessMode",
    "SubscriptionType",
    "allowed_spellings",
    "parse_mode",
]

M = TypeVar("M", bound="Mode")


def _norm(text: str) -> str:
    return text.strip().replace("_", "").replace("-", "").lower()


class Mode(enum.Enum):
    """Base of the closed sets: a wire name beside pulsar-client's member name."""

    @property
    def wire(self) -> str:
        """The member's wire spelling (Pulsar's broker, Java client and stored files)."""
        return _WIRE.get(type(self).__name__, {}).get(self.name, self.name)

    @classmethod
    def parse(cls: type[M], value: object, what: str | None = None) -> M:
        """``value`` as a member of this set (see :func:`parse_mode`)."""
        return parse_mode(cls, value, what)

    @classmethod
    def what(cls) -> str:
        """What the set is called in error messages (``"subscription type"``)."""
        return _WHAT.get(cls.__name__, cls.__name__)


class ConsumerType(Mode):
    """Subscription types (pulsar-client's ``ConsumerType``; wire ``Key_Shared``)."""

    Exclusive = 0
    Shared = 1
    Failover = 2
    KeyShared = 3


#: The set's name in Pulsar's broker and admin API.
SubscriptionType = ConsumerType


class InitialPosition(Mode):
    """Where a new subscription starts (wire ``Latest``/``Earliest``, as Java's
    ``SubscriptionInitialPosition``)."""

    Latest = 0
    Earliest = 1


class CompressionType(Mode):
    """Entry payload codecs, numbered as Pulsar's ``CompressionType`` (wire ``ZLIB`` for
    pulsar-client's ``ZLib``; ``filepulsar.storage.codec.Codec`` has the same numbers)."""

    NONE = 0
    LZ4 = 1
    ZLib = 2
    ZSTD = 3
    SNAPPY = 4


class PartitionsRoutingMode(Mode):
    """How a producer picks the partition of a message without a key (wire names are the
    Java client's ``MessageRoutingMode``: ``RoundRobinPartition``, ``SinglePartition``,
    ``CustomPartition``)."""

    UseSinglePartition = 0
    RoundRobinDistribution = 1
    CustomPartition = 2


class HashingScheme(Mode):
    """Hash of a message key for partition routing (Java client's ``HashingScheme``)."""

    JavaStringHash = 0
    Murmur3_32Hash = 1


class ProducerAccessMode(Mode):
    """Who may produce to a topic alongside this producer.

    ``Shared``: any number of shared producers. ``Exclusive``: the only producer, refused
    while another is connected. ``WaitForExclusive``: waits until it can be the only one.
    ``ExclusiveWithFencing``: becomes the only one at once; every other producer is fenced
    (its next send fails with ProducerFenced).
    """

    Shared = 0
    Exclusive = 1
    WaitForExclusive = 2
    ExclusiveWithFencing = 3


class BatchingType(Mode):
    """``Default`` batches messages in arrival order; ``KeyBased`` keeps one batch per key
    (use it for topics consumed by Key_Shared subscriptions)."""

    Default = 0
    KeyBased = 1


class KeySharedMode(Mode):
    """Key_Shared selector family: hash ranges assigned by the dispatcher (``AUTO_SPLIT``),
    or fixed ranges per consumer (``STICKY``)."""

    AutoSplit = 0
    Sticky = 1


# Wire spellings that differ from the member name by more than case and underscores.
_WIRE: dict[str, dict[str, str]] = {
    "ConsumerType": {"KeyShared": "Key_Shared"},
    "CompressionType": {"ZLib": "ZLIB"},
    "PartitionsRoutingMode": {
        "UseSinglePartition": "SinglePartition",
        "RoundRobinDistribution": "RoundRobinPartition",
    },
    "KeySharedMode": {"AutoSplit": "AUTO_SPLIT", "Sticky": "STICKY"},
}

_WHAT: dict[str, str] = {
    "ConsumerType": "subscription type",
    "InitialPosition": "initial position",
    "CompressionType": "compression type",
    "PartitionsRoutingMode": "message routing mode",
    "HashingScheme": "hashing scheme",
    "ProducerAccessMode": "access mode",
    "BatchingType": "batching type",
    "KeySharedMode": "Key_Shared mode",
}


def allowed_spellings(cls: type[Mode]) -> list[str]:
    """Every accepted spelling of ``cls``: the wire names, then pulsar-client's names that
    differ from them by more than case and underscores (for the routing modes
    ``SinglePartition, RoundRobinPartition, CustomPartition, UseSinglePartition,
    RoundRobinDistribution``)."""
    wire = [m.wire for m in cls]
    return wire + [m.name for m in cls if _norm(m.name) != _norm(m.wire)]


def _lookup(cls: type[M]) -> dict[str, M]:
    table: dict[str, M] = {}
    for m in cls:
        table[_norm(m.name)] = m
        table[_norm(m.wire)] = m
    return table


def parse_mode(cls: type[M], value: object, what: str | None = None) -> M:
    """``value`` as a member of the closed set ``cls``: the one parser of every entry point.

    Parameters
    ----------
    cls
        The set (:class:`ConsumerType`, :class:`KeySharedMode`, ...).
    value
        A member of ``cls``; a member of another enum (matched by its name); or a string in
        either spelling, matched ignoring case, ``_``, ``-`` and surrounding blanks.
    what
        How the caller names the value in its error message (an option, a flag, a
        parameter); default: the set's name.

    Returns
    -------
    Mode
        The member.

    Raises
    ------
    dispatch.errors.InvalidConfiguration
        If ``value`` is none of the set's spellings; the one-line message lists them.
    """
    if isinstance(value, cls):
        return value
    text = value if isinstance(value, str) else getattr(value, "name", None)
    if isinstance(text, str) and not isinstance(value, bool):
        found = _lookup(cls).get(_norm(text))
        if found is not None:
            return found
    raise InvalidConfiguration(
        f"{what or cls.what()} {value!r} is not allowed: use one of "
        f"{', '.join(allowed_spellings(cls))}"
    )
