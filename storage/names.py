"""Topic names: parsing, defaults and validation.

``{persistent|non-persistent}://tenant/namespace/topic``; a bare ``topic`` means
``persistent://public/default/topic``. A partition of a partitioned topic is the internal topic
``<topic>-partition-<i>``. Every segment is checked against a strict alphabet, so nothing a user
types can name a path outside the storage root.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from filepulsar.storage.errors import InvalidTopicName

DOMAINS = ("persistent", "non-persistent")
DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
PARTITION_SUFFIX = "-partition-"
MAX_SEGMENT_LENGTH = 200

_SEGMENT = re.compile(r"^[A-Za-z0-9_\-=:.%]+$")
_PARTITION = re.compile(r"^(?P<base>.+)-partition-(?P<index>0|[1-9][0-9]{0,5})$")


def validate_segment(value: str, what: str) -> str:
    """Return ``value`` if it is a valid tenant, namespace or topic segment.

    Allowed: 1 to 200 characters from ``A-Z a-z 0-9 _ - = : . %``, not ``.`` or ``..``.

    Raises
    ------
    InvalidTopicName
        Naming ``what`` and the offending value.
    """
    if not isinstance(value, str):
        raise InvalidTopicName(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidTopicName(f"{what} is empty")
    if len(value) > MAX_SEGMENT_LENGTH:
        raise InvalidTopicName(f"{what} {value[:40]!r}... is longer than {MAX_SEGMENT_LENGTH}")
    if value in (".", "..") or not _SEGMENT.match(value):
        raise InvalidTopicName(
            f"{what} {value!r} is not allowed: use 1-{MAX_SEGMENT_LENGTH} characters from "
            "A-Z a-z 0-9 _ - = : . % (and not '.' or '..')"
        )
    return value


@dataclass(frozen=True, order=True)
class TopicName:
    """A validated topic name; ``partition`` is -1 unless this is a partition's internal topic.

    Build it with :meth:`parse`; the constructor validates too.
    """

    domain: str
    tenant: str
    namespace: str
    local_name: str

    def __post_init__(self) -> None:
        if self.domain not in DOMAINS:
            raise InvalidTopicName(
                f"topic domain {self.domain!r} is not allowed: use one of {', '.join(DOMAINS)}"
            )
        validate_segment(self.tenant, "tenant")
        validate_segment(self.namespace, "namespace")
        validate_segment(self.local_name, "topic name")

    @classmethod
    def parse(cls, name: str) -> TopicName:
        """Parse ``name`` (full or bare) into a :class:`TopicName`.

        Raises
        ------
        InvalidTopicName
            If the name is malformed; the message shows the accepted forms.
        """
        if not isinstance(name, str):
            raise InvalidTopicName(f"topic must be a string, got {type(name).__name__}")
        if "://" not in name:
            # Pulsar's short forms: 'topic' and 'tenant/namespace/topic' (persistent).
            short = name.split("/")
            if len(short) == 3:
                return cls("persistent", short[0], short[1], short[2])
            if len(short) != 1:
                raise InvalidTopicName(
                    f"topic {name!r} is malformed: use 'topic', 'tenant/namespace/topic' or "
                    "'{persistent|non-persistent}://tenant/namespace/topic'"
                )
            return cls("persistent", DEFAULT_TENANT, DEFAULT_NAMESPACE, name)
        domain, _, rest = name.partition("://")
        parts = rest.split("/")
        if len(parts) != 3:
            raise InvalidTopicName(
                f"topic {name!r} is malformed: expected "
                "'{persistent|non-persistent}://tenant/namespace/topic'"
            )
        return cls(domain, parts[0], parts[1], parts[2])

    @property
    def persistent(self) -> bool:
        return self.domain == "persistent"

    @property
    def namespace_name(self) -> str:
        """``tenant/namespace``."""
        return f"{self.tenant}/{self.namespace}"

    @property
    def partition_index(self) -> int:
        """The partition index if this is a ``-partition-<i>`` internal topic, else -1."""
        m = _PARTITION.match(self.local_name)
        return int(m.group("index")) if m else -1

    @property
    def base(self) -> TopicName:
        """The partitioned topic this partition belongs to (self if not a partition)."""
        m = _PARTITION.match(self.local_name)
        if not m:
            return self
        return TopicName(self.domain, self.tenant, self.namespace, m.group("base"))

    def partition(self, index: int) -> TopicName:
        """The internal topic of partition ``index``."""
        if index < 0:
            raise InvalidTopicName(f"partition index must be >= 0, got {index}")
        return TopicName(
            self.domain, self.tenant, self.namespace, f"{self.local_name}{PARTITION_SUFFIX}{index}"
        )

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local_name}"
