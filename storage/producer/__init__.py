"""The storage producer: pulsar-client's ``Producer`` over the managed ledger.

One facade and the objects it owns, each with its own state:

==================  ==============================================================
``producer.py``     :class:`Producer`, the facade: checks arguments, routes, delegates
``messages.py``     :class:`MessageRecord` (one message, passed whole), ``Result``,
                    ``OutgoingMessage`` (what a custom router sees), column builders
``routing.py``      :class:`Routing`: the partition of a message or of a table's rows
``send_queue.py``   :class:`SendQueue`: open batches, sealing, tickets, pending bytes,
                    the writes and callbacks the I/O thread runs for it
``io_thread.py``    :class:`ProducerIo`: one I/O thread per process serving every
                    producer's queue (timers, writes, callbacks, lease renewals)
``leases.py``       :class:`PartitionLeases`: registration, renewal and removal on each
                    partition's manifest
``bulk.py``         :func:`send_table` over :mod:`filepulsar.storage.batcher`
==================  ==============================================================
"""

from filepulsar.storage.producer.messages import MessageRecord, OutgoingMessage, Result
from filepulsar.storage.producer.producer import Producer

__all__ = ["MessageRecord", "OutgoingMessage", "Producer", "Result"]
