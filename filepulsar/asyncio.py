"""``filepulsar.asyncio``: the asyncio client (pulsar-client's ``pulsar.asyncio``); it lives in
:mod:`filepulsar.connector.client_asyncio` (its parts in ``client_asyncio_*``).
``from filepulsar.asyncio import Client``."""

from filepulsar.connector.client_asyncio import (
    Client,
    Consumer,
    Producer,
    PulsarException,
    Reader,
)
from filepulsar.connector.client_asyncio_errors import _set_future

__all__ = ["Client", "Consumer", "Producer", "PulsarException", "Reader"]
__all__ += ["_set_future"]  # pulsar.asyncio's future helper, for tests of the bridge
