"""``filepulsar.asyncio``: the asyncio client (pulsar-client's ``pulsar.asyncio``); it lives in
:mod:`filepulsar.connector.client.asyncio` (its parts in ``connector/client/asyncio/``).
``from filepulsar.asyncio import Client``."""

from filepulsar.connector.client.asyncio import (
    Client,
    Consumer,
    Producer,
    PulsarException,
    Reader,
)
from filepulsar.connector.client.asyncio.errors import _set_future

__all__ = ["Client", "Consumer", "Producer", "PulsarException", "Reader"]
__all__ += ["_set_future"]  # pulsar.asyncio's future helper, for tests of the bridge
