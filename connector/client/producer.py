"""The client's producers: :meth:`Client.create_producer` (a base class of
:class:`~filepulsar.connector.client.Client`) and the :class:`Producer` it returns, a thin
wrapper around :class:`~filepulsar.storage.producer.Producer` adding the schema.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from filepulsar.connector.client.base import ClientPart, check_unsupported
from filepulsar.connector.client.schema import check_schema_arg, register_for_producer
from filepulsar.connector.client.schema.codecs import Schema
from filepulsar.connector.client.types import (
    BatchingType,
    CompressionType,
    HashingScheme,
    InvalidConfiguration,
    PartitionsRoutingMode,
    ProducerAccessMode,
    check_type,
    check_type_or_none,
)
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.producer import Producer as StorageProducer


class Producer:
    """A producer (pulsar-client's ``Producer``) around
    :class:`filepulsar.storage.producer.Producer`.

    ``send``, ``send_async``, ``flush`` and ``send_table`` are the storage producer's own
    bound methods, so the client adds nothing to the hot path. ``send_async``'s callback is
    called ``callback(result, message_id)`` from the producer's I/O thread once the message is
    durable. ``send_table`` (filepulsar's bulk path) publishes an Arrow table at once.
    """

    def __init__(self, inner: StorageProducer, schema: Schema | None = None) -> None:
        self._inner = inner
        self._closed = False
        self._schema = schema
        self.send: Callable[..., MessageId] = inner.send
        self.send_async: Callable[..., None] = inner.send_async
        self.flush: Callable[[], None] = inner.flush
        self.send_table: Callable[..., pa.Table] = inner.send_table
        if schema is not None:
            encode = schema.encode
            send, send_async = inner.send, inner.send_async

            # None is a null value (a tombstone), sent as it is.
            def send_with_schema(content: Any, *args: Any, **kwargs: Any) -> MessageId:
                return send(None if content is None else encode(content), *args, **kwargs)

            def send_async_with_schema(content: Any, *args: Any, **kwargs: Any) -> None:
                send_async(None if content is None else encode(content), *args, **kwargs)

            self.send = send_with_schema
            self.send_async = send_async_with_schema

    def schema(self) -> Schema | None:
        """The producer's value schema (None: bytes)."""
        return self._schema

    def topic(self) -> str:
        return str(self._inner.topic)

    def producer_name(self) -> str:
        return self._inner.producer_name

    def last_sequence_id(self) -> int:
        """The highest sequence id stored by this producer (-1 if none), explicit
        ``sequence_id=`` values included."""
        return self._inner.last_sequence_id

    def is_connected(self) -> bool:
        return self._inner.is_connected()

    def close(self) -> None:
        """Flush what is pending and release the producer's registration."""
        try:
            self._inner.close()
        finally:
            self._closed = True  # the storage producer is closed even if its flush failed

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProducerFactory(ClientPart):
    """``Client.create_producer``."""

    def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        schema: Any = None,
        initial_sequence_id: int | None = None,
        send_timeout_millis: int = 30000,
        compression_type: CompressionType | str = CompressionType.NONE,
        max_pending_messages: int = 1000,
        max_pending_messages_across_partitions: int = 50000,
        block_if_queue_full: bool = False,
        batching_enabled: bool = False,
        batching_max_messages: int = 1000,
        batching_max_allowed_size_in_bytes: int = 128 * 1024,
        batching_max_publish_delay_ms: int = 10,
        chunking_enabled: bool = False,
        message_routing_mode: PartitionsRoutingMode
        | str = PartitionsRoutingMode.RoundRobinDistribution,
        lazy_start_partitioned_producers: bool = False,
        properties: dict[str, str] | None = None,
        batching_type: BatchingType | str = BatchingType.Default,
        encryption_key: str | None = None,
        crypto_key_reader: Any = None,
        access_mode: ProducerAccessMode | str = ProducerAccessMode.Shared,
        message_router: Callable[[Any, int], int] | None = None,
        hashing_scheme: HashingScheme | str = HashingScheme.JavaStringHash,
        max_pending_bytes: int = 64 * 1024 * 1024,
    ) -> Producer:
        """Create a producer on ``topic`` (auto-created per the namespace policies).

        Parameters and defaults are pulsar-client's (batching and ``block_if_queue_full``
        off; ``batching_max_publish_delay_ms`` 10). With batching off every message is its
        own entry, written as soon as the producer's I/O thread is free; turn batching on for
        throughput. The queue is bounded by ``max_pending_bytes`` (filepulsar's), so
        ``max_pending_messages*`` and ``send_timeout_millis`` are accepted and unused, as is
        ``lazy_start_partitioned_producers``. A ``message_router(msg, num_partitions)``
        decides the partition of every message of a partitioned topic, whatever
        ``message_routing_mode`` says (as in pulsar-client); ``msg`` has ``data()``,
        ``value()``, ``properties()``, ``partition_key()`` .... ``hashing_scheme`` (Java
        client's option) hashes keys for routing. The closed sets (``compression_type``,
        ``message_routing_mode``, ``batching_type``, ``access_mode``, ``hashing_scheme``) also
        take either spelling of a member as a string (``"RoundRobinPartition"`` or
        ``"RoundRobinDistribution"``; :mod:`filepulsar.dispatch.modes`). ``chunking_enabled`` needs
        batching off.
        The max message size counts the payload, properties and keys. A ``schema``
        (:mod:`filepulsar.schema`) encodes what ``send`` is given and is registered in the
        topic's schema registry (``BytesSchema()`` registers the ``BYTES`` type; ``None``, the
        default, writes plain bytes and registers nothing).

        Raises
        ------
        ProducerBusy, ProducerFenced
            Per ``access_mode`` (see :class:`filepulsar.storage.producer.Producer`).
        TopicNotFound
            If the topic does not exist and may not be auto-created.
        InvalidConfiguration
            (a ``ValueError``) For bad or unsupported arguments (a schema that is not a
            :mod:`filepulsar.schema` schema, encryption, a producer name over 65,514 bytes,
            batching with chunking).
        IncompatibleSchema
            If the topic's schema registry refuses the schema (compatibility strategy,
            ``is_allow_auto_update_schema``, ``schema_validation_enforced``).
        """
        check_type(str, topic, "topic")
        check_type_or_none(str, producer_name, "producer_name")
        check_type_or_none(int, initial_sequence_id, "initial_sequence_id")
        for name, value in (
            ("send_timeout_millis", send_timeout_millis),
            ("max_pending_messages", max_pending_messages),
            ("max_pending_messages_across_partitions", max_pending_messages_across_partitions),
            ("batching_max_messages", batching_max_messages),
            ("batching_max_allowed_size_in_bytes", batching_max_allowed_size_in_bytes),
            ("batching_max_publish_delay_ms", batching_max_publish_delay_ms),
        ):
            check_type(int, value, name)
        for name, value in (
            ("block_if_queue_full", block_if_queue_full),
            ("batching_enabled", batching_enabled),
            ("chunking_enabled", chunking_enabled),
            ("lazy_start_partitioned_producers", lazy_start_partitioned_producers),
        ):
            check_type(bool, value, name)
        # The closed sets: a member, or either spelling of one (dispatch.modes).
        compression_type = CompressionType.parse(compression_type, "compression_type")
        batching_type = BatchingType.parse(batching_type, "batching_type")
        access_mode = ProducerAccessMode.parse(access_mode, "access_mode")
        message_routing_mode = PartitionsRoutingMode.parse(
            message_routing_mode, "message_routing_mode"
        )
        hashing_scheme = HashingScheme.parse(hashing_scheme, "hashing_scheme")
        check_type_or_none(dict, properties, "properties")
        if message_router is not None and not callable(message_router):
            raise InvalidConfiguration(
                f"Argument message_router is expected to be callable, got {message_router!r}"
            )
        if batching_enabled and chunking_enabled:
            raise InvalidConfiguration(
                "Batching and chunking of messages can't be enabled together: "
                "set batching_enabled=False to use chunking_enabled=True"
            )
        value_schema = check_schema_arg(schema, producer=True)
        check_unsupported(encryption_key=encryption_key, crypto_key_reader=crypto_key_reader)
        inner = StorageProducer(
            self._core.store,
            topic,
            producer_name=producer_name,
            access_mode=access_mode,
            batching_enabled=batching_enabled,
            batching_max_messages=batching_max_messages,
            batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms=batching_max_publish_delay_ms,
            batching_type=batching_type,
            compression_type=compression_type,
            chunking_enabled=chunking_enabled,
            message_routing_mode=message_routing_mode,
            hashing_scheme=hashing_scheme,
            message_router=message_router,
            initial_sequence_id=initial_sequence_id,
            max_pending_bytes=max_pending_bytes,
            block_if_queue_full=block_if_queue_full,
            properties=properties,
            clock=self._core.clock,
        )
        try:
            inner.schema_version, value_schema = register_for_producer(
                self._core.store, inner.topic, value_schema, inner.policies
            )
        except BaseException:
            inner.close()
            raise
        p = Producer(inner, value_schema)
        self._core.track(p)
        return p
