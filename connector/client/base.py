"""What the parts of :class:`~filepulsar.connector.client.Client` share: the
:class:`ClientCore` it owns (the blob store, the clock, the handles it closes), the
:class:`ClientPart` base of the parts that live in their own modules, and the check that refuses
pulsar-client's features filepulsar does not have.

The parts are ``create_producer`` (:mod:`filepulsar.connector.client.producer`), ``subscribe``
(:mod:`filepulsar.connector.client.subscribe`), ``create_reader`` and ``create_table_view``
(:mod:`filepulsar.connector.client.reader`): each keeps pulsar-client's long signature in one
place, and each reaches the client's state only through its core.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from filepulsar.connector.client.types import (
    AlreadyClosed,
    ConsumerCryptoFailureAction,
    CryptoKeyReader,
    OperationNotSupported,
    check_type_or_none,
)
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import FilePulsarError

if TYPE_CHECKING:
    from filepulsar.connector.client.consumer import Consumer
    from filepulsar.connector.client.producer import Producer
    from filepulsar.connector.client.reader import Reader
    from filepulsar.connector.client.tableview import TableView


def check_unsupported(**given: Any) -> None:
    """Refuse a pulsar-client feature filepulsar does not have (OperationNotSupported, as
    pulsar-client refuses one its build lacks), after pulsar-client's own type check of a
    ``crypto_key_reader`` (ValueError unless a :class:`CryptoKeyReader`)."""
    if "crypto_key_reader" in given:
        check_type_or_none(CryptoKeyReader, given["crypto_key_reader"], "crypto_key_reader")
    for name, value in given.items():
        if value not in (None, False) and value is not ConsumerCryptoFailureAction.FAIL:
            raise OperationNotSupported(f"{name} is not supported by filepulsar (got {value!r})")


class ClientCore:
    """What a :class:`~filepulsar.connector.client.Client` owns and its parts build with: the
    blob store under the root, the clock (None: the system's), and the open handles (producers,
    consumers, readers, table views) it closes. Thread-safe."""

    def __init__(self, store: BlobStore, clock: Callable[[], int] | None) -> None:
        self.store = store
        self.clock = clock
        self._handles: list[Producer | Consumer | Reader | TableView] = []
        self._lock = threading.Lock()
        self._closed = False

    def track(self, h: Producer | Consumer | Reader | TableView) -> None:
        """Keep ``h`` to close with the client; close it and raise :class:`AlreadyClosed` if
        the client is closed already."""
        with self._lock:
            if self._closed:
                h.close()
                raise AlreadyClosed("client is closed")
            # Closed handles only: a producer that failed is not connected, yet still holds
            # its registration until close() releases it (which Client.close() must do).
            self._handles = [x for x in self._handles if not x._closed]
            self._handles.append(h)

    def tracked(self) -> list[Producer | Consumer | Reader | TableView]:
        """The handles kept now (a copy)."""
        with self._lock:
            return list(self._handles)

    def close_handles(self) -> list[FilePulsarError]:
        """Mark the client closed (later :meth:`track` calls refuse) and close every handle
        kept, each even if another failed; the errors raised, in order."""
        with self._lock:
            self._closed = True
            handles, self._handles = self._handles, []
        errors: list[FilePulsarError] = []
        for h in handles:
            try:
                h.close()
            except FilePulsarError as e:
                errors.append(e)
        return errors


class ClientPart:
    """Base of the parts of :class:`~filepulsar.connector.client.Client` kept in their own
    modules: each one's methods reach the client's state only through ``_core`` (set by
    ``Client.__init__``)."""

    _core: ClientCore
