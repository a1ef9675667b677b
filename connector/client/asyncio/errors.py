"""The asyncio client's errors: :class:`PulsarException` (pulsar-client's
``pulsar.asyncio.PulsarException``) carrying a :class:`~filepulsar.storage.producer.Result`
code, the conversion of the synchronous client's exceptions into it, and completing a future
with a result code from any thread.
"""

from __future__ import annotations

import asyncio
from typing import Any

from filepulsar.storage.errors import FilePulsarError, IncompatibleFormat, ProducerClosed
from filepulsar.storage.producer import Result


class PulsarException(FilePulsarError):
    """An asyncio operation failed (pulsar-client's ``pulsar.asyncio.PulsarException``).

    Parameters
    ----------
    result
        The failure's result code, returned by :meth:`error`.
    msg
        What went wrong, in words (optional).
    """

    def __init__(self, result: Result, msg: str | None = None) -> None:
        super().__init__(result, msg)
        self._result = result
        self._msg = msg

    def error(self) -> Result:
        """The result code of the failure."""
        return self._result

    def __str__(self) -> str:
        head = f"{self._result.value} {self._result.name}"
        return f"{head}: {self._msg}" if self._msg else head


class _PulsarValueError(PulsarException, ValueError):
    """A PulsarException caused by a bad argument: ``except ValueError`` catches it too."""


#: Exceptions of the synchronous client whose name is not a Result member's.
_RESULT_OF: dict[type[BaseException], Result] = {
    ProducerClosed: Result.AlreadyClosed,
    IncompatibleFormat: Result.UnsupportedVersionError,
}


def _result_of(e: BaseException) -> Result:
    for cls in type(e).__mro__:
        if cls in _RESULT_OF:
            return _RESULT_OF[cls]
        found = Result.__members__.get(cls.__name__)
        if found is not None and found is not Result.Ok:
            return found
    return Result.UnknownError


def to_pulsar_exception(e: FilePulsarError) -> PulsarException:
    """The asyncio API's exception for ``e`` (raise it ``from e``)."""
    if isinstance(e, PulsarException):
        return e
    kind = _PulsarValueError if isinstance(e, ValueError) else PulsarException
    return kind(_result_of(e), str(e) or type(e).__name__)


def _set_future(future: asyncio.Future[Any], result: Result, value: Any) -> None:
    """Complete ``future`` from any thread: with ``value`` if ``result`` is ``Ok``, else with
    a PulsarException. A future already done or cancelled is left as it is."""

    def complete() -> None:
        if future.done():
            return
        if result is Result.Ok:
            future.set_result(value)
        else:
            future.set_exception(PulsarException(result))

    future.get_loop().call_soon_threadsafe(complete)
