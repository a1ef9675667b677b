"""The root of filepulsar's exception tree, at the bottom of the house (imports nothing).

Every error filepulsar raises on purpose derives from :class:`FilePulsarError`
(pulsar-client's ``PulsarException``). The tree's other classes live in
:mod:`filepulsar.storage.errors` (the storage layer's conditions) and
:mod:`filepulsar.connector.client.types` (pulsar-client's names that nothing raises); the ones here
are those :mod:`dispatch` itself raises, so that no floor climbs to a higher one to raise (``jobs ->
connector -> storage -> dispatch``, checked by ``tests/test_layers.py``). ``tests/test_errors.py``
pins the tree.
"""

from __future__ import annotations

__all__ = ["ConsumerAssignError", "FilePulsarError", "InvalidConfiguration", "PulsarException"]


class FilePulsarError(Exception):
    """Base of every error filepulsar raises on purpose (pulsar-client's ``PulsarException``).

    Every exception of :mod:`filepulsar.storage.errors` and :mod:`filepulsar.connector.client.types`
    derives from it, so ``except FilePulsarError`` catches everything filepulsar reports.
    """


#: pulsar-client's name for the root of its exception tree.
PulsarException = FilePulsarError


class InvalidConfiguration(FilePulsarError, ValueError):
    """An option, policy or argument has a value outside what is allowed."""


class ConsumerAssignError(FilePulsarError, ValueError):
    """A consumer cannot be added to (or removed from) a sticky-key selector as asked
    (pulsar-client's ``ConsumerAssignError``; Pulsar's broker answers the same situations with
    ``ConsumerAssignException`` and refuses the subscription). The selector is left unchanged.
    """
