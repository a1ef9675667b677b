"""JSON text of options and metadata files.

``json.loads`` raises ``RecursionError`` (not a ``ValueError``) on deeply nested input such as
``[[[[...]]]]``; every parser of text from a user or from storage goes through :func:`loads`
so such input is reported like any other malformed JSON. :func:`encode_framed` and
:func:`decode_framed` give small metadata files the manifest's framing: a JSON line and a
CRC32C line.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

import crc32c
import orjson

from filepulsar.storage.errors import CorruptDataError, FilePulsarError


def loads(text: str | bytes | bytearray) -> Any:
    """``json.loads`` that raises ``ValueError`` (never ``RecursionError``).

    Raises
    ------
    ValueError
        If ``text`` is not JSON, is not UTF-8, or nests arrays/objects too deeply to parse.
    """
    try:
        return json.loads(text)
    except RecursionError as e:
        raise ValueError("JSON nested too deeply (arrays or objects within each other)") from e


# A run of 19 or more digits is where an integer may lie outside [-2**63, 2**64), which
# orjson reads as a float (json as an int): found as 19 zeros once every digit is a zero.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19


def loads_stored(body: bytes) -> Any:
    """:func:`loads` of a stored metadata line, about three times faster on a large one: by
    orjson where it reads the text as ``json`` does (orjson refuses what ``json`` accepts
    beyond the JSON standard, e.g. ``NaN``, and reads an integer outside 64 bits as a float:
    such text, or text with a run of 19 digits, goes to ``json``, which decides). One
    difference is left: orjson reads arrays and objects nested up to 1,024 deep, where
    ``json`` may give up a little earlier (at Python's recursion limit); no stored state
    nests more than a few levels, and a decoder refuses a value of the wrong shape."""
    if body.translate(_DIGITS_AS_ZERO).find(_LONG_RUN) < 0:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return loads(body)


_json_compact = json.JSONEncoder(separators=(",", ":")).encode


def dumps_compact(value: Any) -> str:
    """``json.dumps(value, separators=(",", ":"))``, the text every stored state is written
    in, about five times faster: by orjson where its text is the same. For the values a
    state holds (dicts with string keys, lists, strings, integers of 64 bits, None, booleans)
    orjson writes what ``json`` writes except where ``json`` escapes a character (every one
    above U+007E; orjson writes them as UTF-8): a text holding one, or a value orjson refuses
    (a larger integer, a key that is not a string), goes to ``json``. (Floats are written
    differently by the two, and no stored state holds one: their decoders refuse them.)"""
    try:
        b = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return _json_compact(value)
    if b.isascii() and b.find(b"\x7f") < 0:
        return b.decode("ascii")
    return _json_compact(value)


def frame(body: bytes) -> bytes:
    """``body`` (one line, no newline) followed by its checksum line ``crc32c=<8 hex>``: the
    framing of every metadata file (storage/FORMAT.md)."""
    return body + b"\ncrc32c=%08x\n" % crc32c.crc32c(body)


def _label(what: str, where: str) -> str:
    return f"{what} {where}" if what else where


def unframe(raw: bytes, where: str, what: str = "") -> bytes:
    """The body of a :func:`frame`-d file, verified; ``where`` names the file in errors
    (after ``what``, if given: formatted only for an error).

    Raises
    ------
    CorruptDataError
        If the checksum line is missing, malformed or wrong (a truncated or damaged file).
    """
    body, sep, tail = raw.rstrip(b"\n").rpartition(b"\ncrc32c=")
    if not sep:
        raise CorruptDataError(f"{_label(what, where)} has no checksum line")
    try:
        if len(tail) != 8:
            raise ValueError(tail)
        want = int(tail, 16)
    except ValueError as e:
        raise CorruptDataError(f"{_label(what, where)} has a malformed checksum line") from e
    if crc32c.crc32c(body) != want:
        raise CorruptDataError(f"{_label(what, where)} fails its checksum")
    return body


def encode_framed(value: Any) -> bytes:
    """``value`` as a metadata file: line 1 compact JSON, line 2 ``crc32c=<8 hex>`` over
    line 1 (the manifest's framing, storage/FORMAT.md)."""
    return frame(json.dumps(value, separators=(",", ":"), sort_keys=True).encode())


def is_framed(raw: bytes) -> bool:
    """Whether ``raw`` ends with a ``crc32c=`` line (the framed form, not legacy JSON)."""
    return b"\ncrc32c=" in raw[-20:]


def decode_framed(raw: bytes, where: str) -> Any:
    """The JSON value of a framed metadata file, checksum verified; ``where`` names the file.

    Raises
    ------
    CorruptDataError
        If the checksum line is malformed or does not match, or the checked line is not JSON.
    """
    body = unframe(raw, where)
    try:
        return loads_stored(body)
    except ValueError as e:
        raise CorruptDataError(f"{where} is not valid JSON: {e}") from e


_Decoder = TypeVar("_Decoder", bound=Callable[..., Any])

#: What a decoder of stored metadata raises where a field is missing or of the wrong shape:
#: :func:`malformed` turns it into a :class:`CorruptDataError`.
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError)


def malformed(what: str, where: str, e: BaseException) -> CorruptDataError:
    """The error for stored ``what`` at ``where`` whose checksum passes but whose fields are
    missing or of the wrong shape (``e``, one of :data:`MALFORMED`)."""
    return CorruptDataError(f"{what} {where} is malformed: {type(e).__name__} {e}")


def malformed_is_corrupt(what: str) -> Callable[[_Decoder], _Decoder]:
    """Decorate a metadata decoder ``(cls, raw, where, ...)`` so a file whose checksum passes but
    whose fields are missing or of the wrong shape raises :class:`CorruptDataError` naming
    ``what`` and ``where`` (:func:`malformed`) -- never ``KeyError``, ``TypeError`` or
    ``RecursionError``."""

    def wrap(fn: _Decoder) -> _Decoder:
        @functools.wraps(fn)
        def decode(cls: Any, raw: bytes, where: str, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(cls, raw, where, *args, **kwargs)
            except FilePulsarError:
                raise
            except MALFORMED as e:
                raise malformed(what, where, e) from e

        return decode  # type: ignore[return-value]

    return wrap
