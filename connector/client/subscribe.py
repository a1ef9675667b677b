"""The client's subscribing: :meth:`Client.subscribe` (a base class of
:class:`~filepulsar.connector.client.Client`), which checks pulsar-client's parameters, holds
their defaults and builds the :class:`~filepulsar.connector.client.consumer.Consumer`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from filepulsar.connector.client.ack_grouping import (
    DEFAULT_ACK_GROUPING_MAX_SIZE,
    DEFAULT_ACK_GROUPING_TIME_MS,
    DEFAULT_MARK_DELETE_RATE_LIMIT,
    AckGrouping,
)
from filepulsar.connector.client.base import ClientPart, check_unsupported
from filepulsar.connector.client.consumer import Consumer
from filepulsar.connector.client.message import Message
from filepulsar.connector.client.schema import (
    check_schema_arg,
)
from filepulsar.connector.client.types import (
    ConsumerBatchReceivePolicy,
    ConsumerCryptoFailureAction,
    ConsumerDeadLetterPolicy,
    ConsumerKeySharedPolicy,
    ConsumerType,
    InitialPosition,
    InvalidConfiguration,
    RegexSubscriptionMode,
    check_type,
    check_type_or_none,
)
from filepulsar.dispatch.redelivery import (
    DEFAULT_NEGATIVE_ACK_DELAY_MS,
    MultiplierRedeliveryBackoff,
)
from filepulsar.storage.cursor import DEFAULT_LEASE_MS


class ConsumerFactory(ClientPart):
    """``Client.subscribe``."""

    def subscribe(
        self,
        topic: str | Sequence[str] | re.Pattern[str],
        subscription_name: str,
        consumer_type: ConsumerType | str = ConsumerType.Exclusive,
        schema: Any = None,
        message_listener: Callable[[Consumer, Message], None] | None = None,
        receiver_queue_size: int = 1000,
        max_total_receiver_queue_size_across_partitions: int = 50000,
        consumer_name: str | None = None,
        unacked_messages_timeout_ms: int | None = None,
        broker_consumer_stats_cache_time_ms: int = 30000,
        negative_ack_redelivery_delay_ms: int = DEFAULT_NEGATIVE_ACK_DELAY_MS,
        is_read_compacted: bool = False,
        properties: dict[str, str] | None = None,
        pattern_auto_discovery_period: int = 60,
        initial_position: InitialPosition | str = InitialPosition.Latest,
        crypto_key_reader: Any = None,
        replicate_subscription_state_enabled: bool = False,
        max_pending_chunked_message: int = 10,
        auto_ack_oldest_chunked_message_on_queue_full: bool = False,
        start_message_id_inclusive: bool = False,
        batch_receive_policy: ConsumerBatchReceivePolicy | None = None,
        key_shared_policy: ConsumerKeySharedPolicy | None = None,
        batch_index_ack_enabled: bool = False,
        regex_subscription_mode: RegexSubscriptionMode = RegexSubscriptionMode.PersistentOnly,
        dead_letter_policy: ConsumerDeadLetterPolicy | None = None,
        crypto_failure_action: Any = ConsumerCryptoFailureAction.FAIL,
        is_pattern_topic: bool = False,
        *,
        subscription_properties: dict[str, str] | None = None,
        retry_enable: bool = False,
        negative_ack_redelivery_backoff: MultiplierRedeliveryBackoff | None = None,
        ack_timeout_redelivery_backoff: MultiplierRedeliveryBackoff | None = None,
        tick_duration_ms: int = 1000,
        priority_level: int = 0,
        consumer_lease_ms: int = DEFAULT_LEASE_MS,
        retry_delay_levels: str | Sequence[int] | None = None,
        ack_grouping_time_ms: int = DEFAULT_ACK_GROUPING_TIME_MS,
        ack_grouping_max_size: int = DEFAULT_ACK_GROUPING_MAX_SIZE,
        mark_delete_rate_limit: float = DEFAULT_MARK_DELETE_RATE_LIMIT,
    ) -> Consumer:
        """Subscribe to a topic, a list of topics or a regex pattern of one namespace.

        Parameters are pulsar-client's; the keyword-only ones after ``is_pattern_topic`` are
        filepulsar's. ``consumer_type`` and ``initial_position`` also take either spelling of
        a member as a string (``"Key_Shared"`` or ``"KeyShared"``;
        :mod:`filepulsar.dispatch.modes`).

        Parameters
        ----------
        topic
            ``"t"``, ``["t1", "t2"]`` or ``re.compile("persistent://public/default/t-.*")``
            (re-listed every ``pattern_auto_discovery_period`` seconds; new topics are
            picked up, deleted ones dropped). Missing topics are auto-created.
        consumer_type
            ``ConsumerType.Exclusive`` (default; a second consumer gets ConsumerBusy),
            ``Failover``, ``Shared`` or ``KeyShared``.
        receiver_queue_size
            Messages fetched ahead of ``receive`` (claimed for this consumer on Shared).
        unacked_messages_timeout_ms
            Ack timeout (None/0: off): a message not acknowledged this long after it was
            received is redelivered, between the timeout and timeout + ``tick_duration_ms``.
        negative_ack_redelivery_delay_ms, negative_ack_redelivery_backoff
            Delay of a negatively acknowledged message (fixed, at least 100 ms; or
            ``backoff.next(redelivery_count)``).
        initial_position
            Where a new subscription starts (default Latest, as in Pulsar).
        start_message_id_inclusive
            Whether ``seek(message_id)`` delivers that message again.
        batch_receive_policy
            Limits of ``batch_receive``.
        key_shared_policy
            Selector mode and ranges for KeyShared.
        batch_index_ack_enabled
            Acknowledge single messages of a batch entry in storage (a redelivered batch
            then brings only its unacknowledged messages); off: the batch tracker acks the
            entry when all of it is acknowledged.
        dead_letter_policy
            Dead-letter topic for Shared/KeyShared (max redeliveries) and the limit of
            ``reconsume_later``.
        subscription_properties
            Stored when the subscription is created and fixed from then on. Keys are tags:
            a message whose properties carry tags (keys with value ``"TAGS"``) is delivered
            only if one of them is subscribed; others are acknowledged without delivery;
            messages without tags are always delivered (the vendor guide's tag filter).
        retry_enable
            Enable ``reconsume_later``: the consumer also subscribes to the retry-letter
            topic (``<topic>-<subscription>-RETRY``); max 16 retries without a policy.
        ack_timeout_redelivery_backoff
            Delay of ack-timeout redeliveries (default: at once).
        priority_level
            Failover: consumers of the best (lowest) level are eligible.
        consumer_lease_ms
            Lease this consumer renews; when the other consumers' processes have seen it
            unrenewed for this long on their own monotonic clocks (the process died; wall
            clocks never decide it), they take over its partitions and unacknowledged
            messages. Renewed every third of it, together with this process's other
            consumers of each partition: one commit per partition and process for all of
            them, and none while acknowledgements are stored (each group's commit renews
            them). Renewals that start more than two thirds of the lease late (a saturated
            host) are logged.
        retry_delay_levels
            The delay levels of ``reconsume_later(msg, delay_level=k)`` and of its
            increasing-level mode (the vendor guide's ``MESSAGE_DELAYLEVEL``; default
            ``"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"``), or ms values.
        ack_grouping_time_ms, ack_grouping_max_size
            Acknowledgement grouping, as Pulsar's clients group acknowledgements (C++
            ``setAckGroupingTimeMs`` / ``setAckGroupingMaxSize``; pulsar-client-python does
            not expose them, so these names are the C++ ones in snake case). ``acknowledge``
            records the acknowledgement at once (the message is not delivered to this
            consumer again) and stores it with others of its partition in one commit when
            the oldest is ``ack_grouping_time_ms`` old (default 100) or
            ``ack_grouping_max_size`` are pending (default 1000; 0: no count limit); also
            before ``close()``, ``seek``, a cumulative acknowledgement, a negative
            acknowledgement of an entry with acknowledgements pending (a batch's) and
            ``redeliver_unacknowledged_messages``. What a crash costs:
            acknowledgements not yet stored are lost with the process and their messages
            are delivered again (at-least-once, never a lost message), as in Pulsar.
            ``ack_grouping_time_ms=0`` stores every acknowledgement before ``acknowledge``
            returns. Keep it, and ``1000 / mark_delete_rate_limit`` (a group is held for
            the larger of the two), well under ``consumer_lease_ms``: if the lease lapses
            (the process stalled), messages acknowledged and not yet stored go to other
            consumers too.
        mark_delete_rate_limit
            Commits per second of one subscription partition's grouped acknowledgements in
            this process, at most (default 1.0; 0: no limit): Pulsar's broker setting
            ``managedLedgerDefaultMarkDeleteRateLimit`` (per namespace
            ``managedLedgerMaxMarkDeleteRate``). As a broker applies acknowledgements to the
            cursor in memory and persists the cursor at that rate, this process holds a
            partition's group, due or full, until ``1 / mark_delete_rate_limit`` seconds
            passed since its last commit; the consumers of the process never get those
            messages again meanwhile (whole entries: a message of a batch acknowledged here
            whose entry is handed out again before the group is stored, to another consumer
            of the process, comes with it), and ``close()``, ``seek``, a cumulative acknowledgement,
            a negative acknowledgement of an entry with acknowledgements pending and
            ``redeliver_unacknowledged_messages`` still store the group first. What a
            crash costs grows with it: up to about
            ``max(ack_grouping_time_ms, 1000 / mark_delete_rate_limit)`` ms of
            acknowledgements (1 s by default) are delivered again, never lost, as a broker
            crash redelivers what its cursor had not persisted. No effect with
            ``ack_grouping_time_ms=0``.

        A ``schema`` decodes ``Message.value()`` and must be able to read the topic's schema
        (else :class:`IncompatibleSchema`). Encryption, compaction and replication options are
        refused when set; stats and chunk-queue tuning options are accepted and unused, and so is
        ``properties`` (Pulsar's consumer metadata, shown in broker stats; there is no broker
        here). It is not ``subscription_properties``, which has an effect (tags, above).

        Raises
        ------
        ConsumerBusy
            Exclusive subscription already in use, or a different type while consumers are
            connected.
        InvalidConfiguration
            (a ``ValueError``) For bad arguments or subscription properties that differ from
            the stored ones.
        """
        if not isinstance(topic, str | list | tuple | re.Pattern):
            raise InvalidConfiguration(
                "Argument 'topic' is expected to be of a type between (str, list, re.pattern), "
                f"got {type(topic).__name__}"
            )
        check_type(str, subscription_name, "subscription_name")
        consumer_type = ConsumerType.parse(consumer_type, "consumer_type")
        for name, value in (
            ("receiver_queue_size", receiver_queue_size),
            (
                "max_total_receiver_queue_size_across_partitions",
                max_total_receiver_queue_size_across_partitions,
            ),
            ("broker_consumer_stats_cache_time_ms", broker_consumer_stats_cache_time_ms),
            ("negative_ack_redelivery_delay_ms", negative_ack_redelivery_delay_ms),
            ("pattern_auto_discovery_period", pattern_auto_discovery_period),
            ("max_pending_chunked_message", max_pending_chunked_message),
        ):
            check_type(int, value, name)
        ack_grouping = AckGrouping(
            ack_grouping_time_ms, ack_grouping_max_size, mark_delete_rate_limit
        )
        check_type_or_none(str, consumer_name, "consumer_name")
        check_type_or_none(int, unacked_messages_timeout_ms, "unacked_messages_timeout_ms")
        check_type_or_none(dict, properties, "properties")
        initial_position = InitialPosition.parse(initial_position, "initial_position")
        for name, value in (
            ("is_read_compacted", is_read_compacted),
            (
                "auto_ack_oldest_chunked_message_on_queue_full",
                auto_ack_oldest_chunked_message_on_queue_full,
            ),
            ("start_message_id_inclusive", start_message_id_inclusive),
            ("batch_index_ack_enabled", batch_index_ack_enabled),
        ):
            check_type(bool, value, name)
        check_type_or_none(ConsumerBatchReceivePolicy, batch_receive_policy, "batch_receive_policy")
        check_type_or_none(ConsumerKeySharedPolicy, key_shared_policy, "key_shared_policy")
        check_type(RegexSubscriptionMode, regex_subscription_mode, "regex_subscription_mode")
        check_type_or_none(ConsumerDeadLetterPolicy, dead_letter_policy, "dead_letter_policy")
        value_schema = check_schema_arg(schema, producer=False)
        check_unsupported(
            crypto_key_reader=crypto_key_reader,
            replicate_subscription_state_enabled=replicate_subscription_state_enabled,
            crypto_failure_action=crypto_failure_action,
        )
        c = Consumer(
            self._core.store,
            topic,
            subscription_name,
            consumer_type=consumer_type,
            receiver_queue_size=receiver_queue_size,
            consumer_name=consumer_name,
            unacked_messages_timeout_ms=unacked_messages_timeout_ms,
            tick_duration_ms=tick_duration_ms,
            ack_timeout_redelivery_backoff=ack_timeout_redelivery_backoff,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
            negative_ack_redelivery_backoff=negative_ack_redelivery_backoff,
            pattern_auto_discovery_period=pattern_auto_discovery_period,
            initial_position=initial_position,
            start_message_id_inclusive=start_message_id_inclusive,
            batch_receive_policy=batch_receive_policy,
            key_shared_policy=key_shared_policy,
            batch_index_ack_enabled=batch_index_ack_enabled,
            regex_subscription_mode=regex_subscription_mode,
            dead_letter_policy=dead_letter_policy,
            retry_enable=retry_enable,
            subscription_properties=subscription_properties,
            priority_level=priority_level,
            consumer_lease_ms=consumer_lease_ms,
            retry_delay_levels=retry_delay_levels,
            is_read_compacted=is_read_compacted,
            ack_grouping=ack_grouping,
            message_listener=message_listener,
            is_pattern_topic=is_pattern_topic,
            clock=self._core.clock,
            schema=value_schema,
        )
        self._core.track(c)
        return c
