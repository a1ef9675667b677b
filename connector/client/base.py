"""What the parts of :class:`~filepulsar.connector.client.Client` share: its state (the blob
store, the clock, the handles it closes), handle tracking, and the check that refuses
pulsar-client's features filepulsar does not have.
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


class _ClientState:
    """The state the parts of :class:`~filepulsar.connector.client.Client` share (set by
    ``Client.__init__``; declared here for the type checker), and handle tracking."""

    _store: BlobStore
    _clock: Callable[[], int] | None
    _handles: list[Producer | Consumer | Reader | TableView]
    _lock: threading.Lock
    _closed: bool

    def _track(self, h: Producer | Consumer | Reader | TableView) -> None:
        with self._lock:
            if self._closed:
                h.close()
                raise AlreadyClosed("client is closed")
            # Closed handles only: a producer that failed is not connected, yet still holds
            # its registration until close() releases it (which Client.close() must do).
            self._handles = [x for x in self._handles if not x._closed]
            self._handles.append(h)
