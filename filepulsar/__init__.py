"""filepulsar: Apache Pulsar's messaging model with no broker.

The public entry, with pulsar-client's names: ``from filepulsar import Client, ConsumerType``.
The client's names load on first use, so a Spark worker that imports only the data source does
not pay for them. Subpackages: :mod:`filepulsar.storage` (the managed ledger on a blob store),
:mod:`filepulsar.connector` (the Spark data source and the client), :mod:`filepulsar.dispatch`
(Pulsar's rules, plain and as Spark operators), :mod:`filepulsar.jobs` (things you run).
Modules: :mod:`filepulsar.asyncio` (the asyncio client, as ``pulsar.asyncio``),
:mod:`filepulsar.admin` (the admin API).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from filepulsar.connector.client import *  # noqa: F403

from filepulsar.connector import __all__ as __all__


def __getattr__(name: str) -> Any:
    if name in __all__:
        from filepulsar.connector import client

        return getattr(client, name)
    if name in ("schema", "admin"):  # as ``pulsar.schema`` is reachable from ``import pulsar``
        import importlib

        return importlib.import_module(f"filepulsar.{name}")
    raise AttributeError(f"module 'filepulsar' has no attribute {name!r}")
