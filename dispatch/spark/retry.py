"""``route_retry_dlq``: retry-letter and dead-letter routing as a Spark operator (see
:mod:`filepulsar.dispatch.spark`).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from filepulsar.dispatch.redelivery import (
    DEFAULT_MAX_RECONSUME_TIMES,
    PROPERTY_DELAY_TIME,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIMES,
    MultiplierRedeliveryBackoff,
    dead_letter_topic,
    retry_letter_topic,
)
from filepulsar.dispatch.spark.blocks import (
    require_columns,
)

# ============================================================================================
# Retry letter / dead letter
# ============================================================================================

_RETRY_OUTPUT_COLUMNS = ("value", "key", "orderingKey", "properties", "eventTime")
_RETRY_PROPERTIES = (
    PROPERTY_REAL_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIMES,
    PROPERTY_DELAY_TIME,
)


def _suffix(name_of: Any, subscription: str) -> str:
    """The fixed suffix of a default letter-topic name (checked to be a plain suffix)."""
    suffix = str(name_of("", subscription))
    if name_of("t", subscription) != "t" + suffix:
        raise AssertionError(f"{name_of.__name__} no longer appends a suffix")
    return suffix


def route_retry_dlq(
    df: DataFrame,
    *,
    subscription: str,
    failed_col: str = "failed",
    topic_col: str = "topic",
    delay_ms: int | None = None,
    backoff: MultiplierRedeliveryBackoff | None = None,
    max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
    retry_topic: str | None = None,
    dead_letter_topic_name: str | None = None,
) -> DataFrame:
    """Pulsar's ``reconsumeLater`` for the messages marked failed: retry or dead-letter copies.

    For every row whose ``failed_col`` is true (others are acknowledged and dropped), one copy
    is produced, as ``ConsumerImpl.reconsumeLater`` sends it:

    * properties gain ``REAL_TOPIC`` (the topic) and ``ORIGIN_MESSAGE_ID`` (``messageId``) unless
      present, ``RECONSUMETIMES`` (1 on the first retry, else the previous value + 1; a value
      that is not a number counts as absent) and ``DELAY_TIME`` (the delay in ms);
    * when ``RECONSUMETIMES > max_reconsume_times`` the copy goes to the dead-letter topic with
      no delay (:func:`filepulsar.dispatch.redelivery.retry_goes_to_dead_letter`), else to the retry
      topic with ``deliverAt = batch time + delay``;
    * the delay is ``delay_ms``, or ``backoff.next(n)`` with ``n`` the previous
      ``RECONSUMETIMES`` (0 on the first retry).

    No state is needed: the retry count travels in the message, as in Pulsar. The operator is
    Spark SQL only (no Python worker); ``current_timestamp()`` is the micro-batch's timestamp,
    recorded in the offset log, so a replayed batch computes the same ``deliverAt``.

    Parameters
    ----------
    df
        DataFrame with ``value``, ``messageId``, ``properties``, the topic and failed columns.
    subscription
        Subscription name, for the default topic names ``<topic>-<subscription>-RETRY`` and
        ``-DLQ`` (:func:`filepulsar.dispatch.redelivery.retry_letter_topic`, ``dead_letter_topic``),
        where ``<topic>`` is ``REAL_TOPIC`` when present (a message consumed from the retry topic).
    failed_col
        Boolean column marking failed messages (null counts as not failed).
    topic_col
        Column with the message's topic.
    delay_ms
        Fixed retry delay in ms (Pulsar's ``reconsumeLater(msg, delay, unit)``).
    backoff
        Instead of ``delay_ms``: delay from a :class:`MultiplierRedeliveryBackoff`.
    max_reconsume_times
        The dead-letter policy's ``maxRedeliverCount`` (16 when retry is on without a policy).
    retry_topic, dead_letter_topic_name
        Explicit topic names (``DeadLetterPolicy.retryLetterTopic`` / ``deadLetterTopic``).

    Returns
    -------
    DataFrame
        Columns the filepulsar sink takes: ``value``, ``key``, ``orderingKey``,
        ``properties``, ``eventTime`` (those present in the input), ``deliverAt`` and
        ``topic`` (the target), so it can be written with ``writeStream.format("filepulsar")``.

    Raises
    ------
    ValueError
        If not exactly one of ``delay_ms`` and ``backoff`` is given, a number is negative, or a
        needed column is missing.
    """
    letters = _Letters(
        df,
        subscription=subscription,
        failed_col=failed_col,
        topic_col=topic_col,
        delay_ms=delay_ms,
        backoff=backoff,
        max_reconsume_times=max_reconsume_times,
        retry_topic=retry_topic,
        dead_letter_topic_name=dead_letter_topic_name,
    )
    failed = df.filter(letters.failed)
    return failed.select(
        *[failed[c] for c in _RETRY_OUTPUT_COLUMNS if c in df.columns and c != "properties"],
        letters.properties.alias("properties"),
        letters.deliver_at.alias("deliverAt"),
        letters.topic.alias("topic"),
    )


def route_with_retry(
    df: DataFrame,
    *,
    output_topic: str,
    subscription: str,
    output_properties: Column | None = None,
    failed_col: str = "failed",
    topic_col: str = "topic",
    delay_ms: int | None = None,
    backoff: MultiplierRedeliveryBackoff | None = None,
    max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
    retry_topic: str | None = None,
    dead_letter_topic_name: str | None = None,
) -> DataFrame:
    """Every row routed in one projection: a row whose ``failed_col`` is true becomes its retry
    or dead-letter copy, exactly as :func:`route_retry_dlq` makes it; every other row goes to
    ``output_topic`` with ``output_properties`` (default: its own) and no ``deliverAt``.

    This is the shape to write a pipeline in: a DataFrame used twice (once for the good rows,
    once for :func:`route_retry_dlq`) and unioned makes Spark run everything upstream of it
    twice -- every source scan and every stateful operator -- where this reads it once.

    Parameters
    ----------
    df
        As for :func:`route_retry_dlq`.
    output_topic
        The topic of the rows that did not fail.
    output_properties
        Their properties (a ``map<string,string>`` column over ``df``); None keeps theirs.
    subscription, failed_col, topic_col, delay_ms, backoff, max_reconsume_times, \
    retry_topic, dead_letter_topic_name
        As for :func:`route_retry_dlq`.

    Returns
    -------
    DataFrame
        ``value``, ``key``, ``orderingKey``, ``eventTime`` (those present in the input),
        ``properties``, ``deliverAt`` and ``topic``: what ``writeStream.format("filepulsar")``
        takes.

    Raises
    ------
    ValueError
        As :func:`route_retry_dlq`, or if ``output_topic`` is empty.
    """
    if not output_topic:
        raise ValueError("output_topic must be a non-empty topic name")
    letters = _Letters(
        df,
        subscription=subscription,
        failed_col=failed_col,
        topic_col=topic_col,
        delay_ms=delay_ms,
        backoff=backoff,
        max_reconsume_times=max_reconsume_times,
        retry_topic=retry_topic,
        dead_letter_topic_name=dead_letter_topic_name,
    )
    passed = df["properties"] if output_properties is None else output_properties
    return df.select(
        *[df[c] for c in _RETRY_OUTPUT_COLUMNS if c in df.columns and c != "properties"],
        F.when(letters.failed, letters.properties).otherwise(passed).alias("properties"),
        F.when(letters.failed, letters.deliver_at).alias("deliverAt"),
        F.when(letters.failed, letters.topic).otherwise(F.lit(output_topic)).alias("topic"),
    )


class _Letters:
    """The columns of a row's retry or dead-letter copy (Pulsar's ``reconsumeLater``), as
    :func:`route_retry_dlq` describes them; arguments checked as it says."""

    def __init__(
        self,
        df: DataFrame,
        *,
        subscription: str,
        failed_col: str,
        topic_col: str,
        delay_ms: int | None,
        backoff: MultiplierRedeliveryBackoff | None,
        max_reconsume_times: int,
        retry_topic: str | None,
        dead_letter_topic_name: str | None,
    ) -> None:
        if (delay_ms is None) == (backoff is None):
            raise ValueError("give exactly one of delay_ms= and backoff=")
        if delay_ms is not None and delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms}")
        if max_reconsume_times < 0:
            raise ValueError(f"max_reconsume_times must be >= 0, got {max_reconsume_times}")
        if not subscription:
            raise ValueError("subscription must be a non-empty name")
        require_columns(
            df, ["value", "messageId", "properties", topic_col, failed_col], "route_retry_dlq"
        )
        props = F.coalesce(df["properties"], F.create_map().cast("map<string,string>"))
        previous = props.getItem(PROPERTY_RECONSUME_TIMES).try_cast("long")
        times = F.coalesce(previous + 1, F.lit(1)).cast("long")
        if backoff is not None:
            # backoff.next(n) for every n it distinguishes; above the last it stays at the maximum.
            table = [backoff.next(n) for n in range(backoff.max_multiplier_pow + 2)]
            n = F.least(F.greatest(times - 1, F.lit(0)), F.lit(len(table) - 1)).cast("int")
            delay = F.element_at(F.array(*[F.lit(int(v)) for v in table]), n + 1).cast("long")
        else:
            delay = F.lit(int(delay_ms or 0)).cast("long")
        real_topic = F.coalesce(props.getItem(PROPERTY_REAL_TOPIC), df[topic_col])
        to_dead_letter = times > F.lit(int(max_reconsume_times))
        retry_name = (
            F.lit(retry_topic)
            if retry_topic
            else F.concat(real_topic, F.lit(_suffix(retry_letter_topic, subscription)))
        )
        dead_name = (
            F.lit(dead_letter_topic_name)
            if dead_letter_topic_name
            else F.concat(real_topic, F.lit(_suffix(dead_letter_topic, subscription)))
        )
        kept = F.map_filter(props, lambda k, _: ~k.isin(*_RETRY_PROPERTIES))
        added = F.create_map(
            F.lit(PROPERTY_REAL_TOPIC),
            real_topic,
            F.lit(PROPERTY_ORIGIN_MESSAGE_ID),
            F.coalesce(props.getItem(PROPERTY_ORIGIN_MESSAGE_ID), df["messageId"]),
            F.lit(PROPERTY_RECONSUME_TIMES),
            times.cast("string"),
            F.lit(PROPERTY_DELAY_TIME),
            delay.cast("string"),
        )
        deliver_at = F.when(
            ~to_dead_letter,
            F.timestamp_millis(F.unix_millis(F.current_timestamp()) + delay),
        )
        self.failed = F.coalesce(df[failed_col].cast("boolean"), F.lit(False))
        self.properties = F.map_concat(kept, added)
        self.deliver_at = deliver_at
        self.topic = F.when(to_dead_letter, dead_name).otherwise(retry_name)
