"""The client consumer's background threads: housekeeping (writing grouped acknowledgements
when due, lease renewal, ack-timeout ticks, dropping what an inactive Failover consumer
queued, re-listing a pattern's topics) and the message listener.

Part of :class:`~filepulsar.connector.client.consumer.Consumer` (a base class of it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from filepulsar.connector.client.message import Message
from filepulsar.connector.client.topics import _Topics
from filepulsar.connector.client.types import (
    AlreadyClosed,
    Timeout,
)
from filepulsar.dispatch.modes import ConsumerType
from filepulsar.storage.errors import FilePulsarError

log = logging.getLogger("filepulsar.connector.client.consumer")  # the Consumer's logger, as before

_LISTENER_MIN_PAUSE_S = 0.1  # after a failed receive in the listener thread, doubling ...
_LISTENER_MAX_PAUSE_S = 5.0  # ... up to this


class _Background(_Topics):
    """The housekeeping and listener threads."""

    if TYPE_CHECKING:

        def _receive(self, timeout_millis: int | None) -> Message: ...

    # ------------------------------------------------------------------ background threads
    def _housekeeping(self) -> None:
        interval = min(self._lease_ms / 6000, 1.0)
        if self._ack_timeout > 0:
            interval = min(interval, self._tick / 1000)
        interval = max(interval, 0.02)
        while True:
            wait = interval
            due = self._acks.due_in_ms()  # a group of acknowledgements is pending
            if due is not None:
                wait = min(wait, max(due, 1) / 1000)
            self._hk_wake.wait(wait)
            self._hk_wake.clear()
            if self._stop.is_set() or self._closed:
                return
            # Leases first, without the consumer's lock: the application may hold it for a
            # long storage call (a contended acknowledgement, a slow first read), and a lease
            # that lapses meanwhile hands everything the consumer holds to others.
            for part in list(self._parts):
                try:
                    part.sc.renew_if_due()
                except (FilePulsarError, OSError) as e:
                    log.warning("consumer %s lease renewal failed: %s", self._consumer_name, e)
            # Then grouped acknowledgements, also without the consumer's lock (the grouper has
            # its own): an application blocked in receive() must not hold them back. A
            # failure is logged and raised by the next acknowledge().
            self._acks.flush_due()
            if not self._lock.acquire(timeout=interval):
                continue  # busy: the rest can wait for the next round
            try:
                if self._closed:
                    return
                self._housekeep()
            except (FilePulsarError, OSError) as e:
                log.warning("consumer %s housekeeping failed: %s", self._consumer_name, e)
            finally:
                self._lock.release()

    def _housekeep(self) -> None:
        for part in self._parts:
            self._sync_registration(part)
        self._tick_if_due()
        if self._sub_type is ConsumerType.Failover and self._queued:
            inactive = {id(p) for p in self._parts if not p.sc.is_active()}
            if inactive:
                self._drop_queued(lambda e: id(e.part) in inactive)
        if self._pattern is not None and self._waits.monotonic() >= self._next_discovery:
            self._next_discovery = self._waits.monotonic() + self._discovery_s
            self._rediscover()

    def _listen(self) -> None:
        assert self._listener is not None
        pause = _LISTENER_MIN_PAUSE_S
        while not self._stop.is_set():
            if not self._listening.is_set():
                self._listening.wait()
                continue
            try:
                msg = self._receive(100)
            except Timeout:
                continue
            except AlreadyClosed:
                return
            except Exception:  # a storage hiccup must not end delivery for good
                if self._closed:
                    return
                log.exception(
                    "message listener of %s (topic %s, subscription %r): receive failed; "
                    "retrying in %.1f s",
                    self._consumer_name,
                    self._topic_label,
                    self._subscription,
                    pause,
                )
                self._stop.wait(pause)
                pause = min(pause * 2, _LISTENER_MAX_PAUSE_S)
                continue
            pause = _LISTENER_MIN_PAUSE_S
            # Paused while this message was being taken: hold it until the resume, so no
            # listener call starts after pause_message_listener() returned.
            self._listening.wait()
            if self._stop.is_set():
                return  # closing: the message is redelivered as every unacknowledged one
            try:
                self._listener(self, msg)
            except Exception:  # a listener's failure must not stop delivery
                log.exception("message listener of %s raised", self._consumer_name)

    def pause_message_listener(self) -> None:
        """Stop handing messages to the ``message_listener`` until
        :meth:`resume_message_listener`. Messages keep arriving into the receiver queue (up
        to ``receiver_queue_size``) and are delivered after the resume, in order. No listener
        call starts after this returns (one already running finishes). No effect on a
        consumer without a listener."""
        self._listening.clear()

    def resume_message_listener(self) -> None:
        """Deliver messages to the ``message_listener`` again, starting with those that
        arrived while it was paused."""
        self._listening.set()
