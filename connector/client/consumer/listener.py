"""The client consumer's message-listener thread (:class:`Listener`): receives one message at a
time and hands it to the application's ``message_listener``, pausing and resuming on request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from filepulsar.connector.client.message import Message
from filepulsar.connector.client.types import AlreadyClosed, Timeout

log = logging.getLogger("filepulsar.connector.client.consumer")  # the Consumer's logger, as before

_LISTENER_MIN_PAUSE_S = 0.1  # after a failed receive in the listener thread, doubling ...
_LISTENER_MAX_PAUSE_S = 5.0  # ... up to this


class Listener:
    """A daemon thread delivering messages to a listener until :meth:`stop`.

    Parameters
    ----------
    receive
        Takes one message, waiting up to the ms given (raises Timeout, AlreadyClosed).
    deliver
        The application's listener, given each message (its exceptions are logged).
    closed
        Whether the consumer is closed (a failed receive then ends the thread).
    name, what
        The consumer's name, and its topics and subscription as the log names them.
    """

    def __init__(
        self,
        *,
        receive: Callable[[int | None], Message],
        deliver: Callable[[Message], None],
        closed: Callable[[], bool],
        name: str,
        what: str,
    ) -> None:
        self._receive = receive
        self._deliver = deliver
        self._closed = closed
        self._name = name
        self._what = what
        self._stop = threading.Event()
        # Set while the listener may deliver; cleared by pause().
        self._listening = threading.Event()
        self._listening.set()
        self.thread = threading.Thread(
            target=self._run, name=f"filepulsar-listener-{name}", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def pause(self) -> None:
        """No listener call starts after this returns (one already running finishes)."""
        self._listening.clear()

    def resume(self) -> None:
        self._listening.set()

    def stop(self) -> None:
        """End the thread, waking it if paused."""
        self._stop.set()
        self._listening.set()  # a paused listener thread wakes and sees the stop

    def join(self, timeout: float) -> None:
        if self.thread is not threading.current_thread() and self.thread.ident is not None:
            self.thread.join(timeout=timeout)

    def _run(self) -> None:
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
                if self._closed():
                    return
                log.exception(
                    "message listener of %s (%s): receive failed; retrying in %.1f s",
                    self._name,
                    self._what,
                    pause,
                )
                self._stop.wait(pause)
                pause = min(pause * 2, _LISTENER_MAX_PAUSE_S)
                continue
            pause = _LISTENER_MIN_PAUSE_S
            # Paused while this message was being taken: hold it until the resume, so no
            # listener call starts after pause() returned.
            self._listening.wait()
            if self._stop.is_set():
                return  # closing: the message is redelivered as every unacknowledged one
            try:
                self._deliver(msg)
            except Exception:  # a listener's failure must not stop delivery
                log.exception("message listener of %s raised", self._name)
