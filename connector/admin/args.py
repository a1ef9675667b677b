"""Parsing the admin API's arguments: topic names, durations (seconds or pulsar-admin strings
such as ``"3d"``) and booleans, with one-line errors naming the argument."""

from __future__ import annotations

from typing import Any

from filepulsar.connector.admin.units import parse_time
from filepulsar.storage.errors import InvalidConfiguration
from filepulsar.storage.names import TopicName


def as_topic(name: str | TopicName) -> TopicName:
    """``name`` parsed (:meth:`TopicName.parse`, which names a bad one), or as it is."""
    return TopicName.parse(name) if isinstance(name, str) else name


def parse_seconds(value: str | int, what: str, *, unlimited: bool = False) -> int:
    """A duration in seconds: an int is seconds already (-1, unlimited, only with
    ``unlimited``); a string is parsed (bare numbers are seconds, else ``"3d"`` style)."""
    if isinstance(value, bool):
        raise InvalidConfiguration(f"{what} must be a duration, got {value!r}")
    if isinstance(value, int):
        if value < -1 or (value == -1 and not unlimited):
            raise InvalidConfiguration(f"{what} must be >= 0, got {value}")
        return value
    return parse_time(value, what, unlimited=unlimited)


def require_bool(value: Any, what: str) -> bool:
    """``value`` when it is a bool, else InvalidConfiguration naming ``what``."""
    if not isinstance(value, bool):
        raise InvalidConfiguration(f"{what} must be True or False, got {value!r}")
    return value
