"""The commit engine: versioned states committed atomically (FORMAT.md, "Commit protocol",
"Journal").

What callers import is here: :class:`VersionedStore` (read and commit one state),
:class:`Abort` (a change function giving up without writing), :class:`VersionedState` (what a
state provides) and the protocol's tunables. The modules, by layer:

``store``       :class:`VersionedStore`: latest / create / commit and the cache; picks an engine
``blob``        the engine of version files: put-if-absent of v+1, turns, settling a lost
                reply, garbage collection with its grace
``journaled``   the engine of a local disk's journal, behind the same interface
``envelope``    the fields every state carries (format, version, updated, commitId,
                prevCommitId) and its checksum frame
``journal``     journal segments, byte-range locks, settling dead writers, the fd budget
``record``      a journal's bytes: records, seals, the segment scan
``protocol``    the vocabulary and tunables, the :class:`~.protocol.Engine` interface
``watch``       waking readers when a commit lands (inotify on a local disk)
"""

from filepulsar.storage.versioned.protocol import (
    COMMIT_TIMEOUT_MS,
    GC_EVERY,
    GC_GRACE_MS,
    KEEP_VERSIONS,
    Abort,
    NoBase,
    VersionedState,
)
from filepulsar.storage.versioned.store import VersionedStore

__all__ = [
    "COMMIT_TIMEOUT_MS",
    "GC_EVERY",
    "GC_GRACE_MS",
    "KEEP_VERSIONS",
    "Abort",
    "NoBase",
    "VersionedState",
    "VersionedStore",
]
