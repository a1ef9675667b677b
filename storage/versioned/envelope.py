"""The envelope every versioned state is stored in (FORMAT.md, "Commit protocol").

A manifest, a subscription state, a compaction state and a maintenance lease are each one JSON
object, framed (line 1 the object as compact JSON, line 2 ``crc32c=<8 hex>`` over line 1,
:func:`frame`), and carry the same five fields beside their own:

========================  =======================================================================
``format``                the state's format number (each kind numbers its own)
``version``               its position on the chain (0 for the state :meth:`VersionedStore.create`
                          writes, then one more per commit)
``updated``               when it was committed (the committing writer's clock, ms)
``commitId``              random per commit (32 hex digits; empty in version 0)
``prevCommitId``          the ``commitId`` of the version it was built on (absent, or empty, in
                          version 0)
========================  =======================================================================

:func:`stamp_first` and :func:`stamp_next` set the last four as the commit protocol needs them
(the store calls them); :func:`encode` and :func:`open_framed` frame and unframe a state's object
and check its format; :func:`check_stamp` checks the four fields' types. Each kind keeps its
own field order, so its bytes stay what its golden file pins.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection
from typing import Any

from filepulsar.storage import jsontext
from filepulsar.storage.errors import IncompatibleFormat
from filepulsar.storage.versioned.protocol import S

#: The framing of every versioned state (and of other metadata files).
frame = jsontext.frame


def stamp_first(state: S, now: int) -> None:
    """Stamp ``state`` as version 0, written at ``now``."""
    state.version = 0
    state.updated_ms = now
    state.prev_commit_id = ""


def stamp_next(
    state: S,
    base: S,
    now: int,
    before_write: Callable[[S], None] | None,
    encode: Callable[[S], bytes] | None = None,
) -> bytes:
    """Stamp ``state`` (changed from ``base``) as the version after it, written at ``now``,
    run ``before_write`` on it, give it a new commit id, and encode it (``encode``, else its
    own ``encode()``)."""
    state.version = base.version + 1
    state.updated_ms = now
    state.prev_commit_id = base.commit_id
    if before_write is not None:
        before_write(state)
    state.commit_id = os.urandom(16).hex()  # (32 random hex digits; no UUID object)
    return state.encode() if encode is None else encode(state)


#: How a delta record's payload starts (FORMAT.md, "Delta records"); a full state's object
#: starts with its ``format`` field.
DELTA_PREFIX = b'{"delta":'


def is_delta(payload: bytes) -> bool:
    """Whether a journal record's ``payload`` is a delta record (else a full state)."""
    return payload.startswith(DELTA_PREFIX)


def prev_field(state: Any) -> dict[str, str]:
    """``{"prevCommitId": ...}``, or nothing for a state built on no other (version 0)."""
    return {"prevCommitId": state.prev_commit_id} if state.prev_commit_id else {}


def encode(fields: dict[str, Any], *, sort_keys: bool = False) -> bytes:
    """A state's object framed: compact JSON in ``fields``' order (or sorted by key), then its
    checksum line. (In order: :func:`~filepulsar.storage.jsontext.dumps_compact`, the same
    text; every acknowledgement commit encodes a whole subscription state.)"""
    if sort_keys:
        return frame(json.dumps(fields, separators=(",", ":"), sort_keys=True).encode())
    return frame(jsontext.dumps_compact(fields).encode())


def check_format(d: dict[str, Any], what: str, where: str, formats: Collection[int]) -> int:
    """``d``'s format, if this code reads it.

    Raises
    ------
    IncompatibleFormat
        Naming ``what`` at ``where``, the format found and the ones this code reads.
    """
    fmt = d.get("format")
    if fmt not in formats:
        raise IncompatibleFormat(
            f"{what} {where} has format {fmt!r}; this code reads {', '.join(map(str, formats))}"
        )
    return fmt  # type: ignore[return-value]  # (one of ``formats``)


def open_framed(
    raw: bytes, what: str, where: str, formats: Collection[int], *, bare_ok: bool = False
) -> dict[str, Any]:
    """The object of a framed state, checksum verified and of a format this code reads.
    ``bare_ok`` also takes the bare JSON object (no checksum line) a kind wrote before it was
    framed.

    Raises
    ------
    CorruptDataError
        If the checksum line is missing (unless ``bare_ok``), malformed or wrong, the checked
        line is not JSON, or it is not an object.
    IncompatibleFormat
        If it has another format (:func:`check_format`).
    """
    label = f"{what} {where}"
    if bare_ok and not jsontext.is_framed(raw):
        d = jsontext.loads(raw)
    else:
        d = jsontext.decode_framed(raw, label)
    if not isinstance(d, dict):
        raise TypeError(f"a {type(d).__name__}, not an object")
    check_format(d, what, where, formats)
    return d


def check_stamp(d: dict[str, Any], *, prev_required: bool = False) -> None:
    """Raise ValueError unless ``version`` (>= 0) and ``updated`` are 64-bit integers and
    ``commitId`` and ``prevCommitId`` are strings where present (``prevCommitId`` must be,
    with ``prev_required``); each kind's decoder says which of them it requires."""
    for k in ("version", "updated"):
        if type(d[k]) is not int or not -_I64 <= d[k] < _I64:
            raise ValueError(f"{k!r} is not a 64-bit integer: {d[k]!r:.80}")
    if d["version"] < 0:
        raise ValueError("'version' must be >= 0")
    prev = d["prevCommitId"] if prev_required else d.get("prevCommitId", "")
    for k, v in (("commitId", d.get("commitId", "")), ("prevCommitId", prev)):
        if type(v) is not str:
            raise ValueError(f"{k!r} is not a string: {v!r:.80}")


#: Stored integers are 64-bit (as Pulsar's ids): anything larger is damage.
_I64 = 1 << 63
