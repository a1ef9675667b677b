"""``filepulsar.schema``: value schemas, as pulsar-client's ``pulsar.schema`` (records, fields,
``JsonSchema``, ``AvroSchema``, ``StringSchema``, ``BytesSchema``, ``ProtobufNativeSchema``);
they live in :mod:`filepulsar.connector.client.schema`, whose ``__all__`` is this module's.
``from filepulsar.schema import *`` works as ``from pulsar.schema import *`` does."""

from filepulsar.connector.client.schema import *  # noqa: F403
from filepulsar.connector.client.schema import __all__ as __all__
