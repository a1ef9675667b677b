"""Durations and sizes as pulsar-admin writes them: ``30s``, ``10m``, ``3h``, ``2d``, ``5w``,
``1y``; ``500M``, ``10G``, ``4096``; ``-1`` for unlimited where Pulsar allows it.

Every error is one line naming the option, the value and the accepted forms.
"""

from __future__ import annotations

import re

from filepulsar.storage.errors import InvalidConfiguration

#: Seconds per time unit (pulsar-admin's RelativeTimeUtil: s, m, h, d, w, y).
TIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
#: Bytes per size unit (pulsar-admin's size suffixes, either case: k, m, g, t).
SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

_TIME = re.compile(r"(\d+)([smhdwy]?)")
_SIZE = re.compile(r"(\d+)([kmgt]?)", re.IGNORECASE)


class UnitError(InvalidConfiguration):
    """A duration or size that does not parse; the message names the option and the forms."""


def parse_time(
    value: str | int, what: str, *, default_unit: str = "s", unlimited: bool = False
) -> int:
    """Seconds in ``value`` (``"3d"`` → 259200); a bare number is in ``default_unit``.

    ``-1`` (returned as -1) is allowed only with ``unlimited``. ``what`` names the option in
    errors (e.g. ``"--time"``).

    Raises
    ------
    UnitError
        If the value does not parse or is negative.
    """
    text = str(value).strip()
    if unlimited and text == "-1":
        return -1
    m = _TIME.fullmatch(text)
    if not m:
        allowed = "a number with an optional unit s, m, h, d, w or y (e.g. 30m, 3d)"
        if unlimited:
            allowed += ", or -1 for unlimited"
        raise UnitError(f"{what}: {text!r} is not a duration; give {allowed}")
    return int(m.group(1)) * TIME_UNITS[m.group(2) or default_unit]


def parse_size(value: str | int, what: str, *, unlimited: bool = False) -> int:
    """Bytes in ``value`` (``"10G"`` → 10737418240); a bare number is in bytes.

    Raises
    ------
    UnitError
        If the value does not parse or is negative (``-1`` is allowed with ``unlimited``).
    """
    text = str(value).strip()
    if unlimited and text == "-1":
        return -1
    m = _SIZE.fullmatch(text)
    if not m:
        allowed = "a number of bytes with an optional unit K, M, G or T (e.g. 500M, 10G)"
        if unlimited:
            allowed += ", or -1 for unlimited"
        raise UnitError(f"{what}: {text!r} is not a size; give {allowed}")
    return int(m.group(1)) * SIZE_UNITS[m.group(2).lower()]


def whole(amount: int, unit: int, unit_name: str, what: str, given: str | int) -> int:
    """``amount`` in units of ``unit`` (-1 stays -1), refusing a fraction: policies store
    whole minutes and megabytes."""
    if amount < 0:
        return -1
    if amount % unit:
        raise UnitError(
            f"{what}: {given!r} is not a whole number of {unit_name} (the policy is stored in "
            f"{unit_name})"
        )
    return amount // unit
