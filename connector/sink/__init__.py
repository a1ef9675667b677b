"""The Spark sink, one concept to a module:

* :mod:`filepulsar.connector.sink.writers` -- the batch and stream writers Spark calls, and the
  driver's exactly-once commit and abort;
* :mod:`filepulsar.connector.sink.options` -- the options, parsed and checked once;
* :mod:`filepulsar.connector.sink.task` -- one task's write: routing, batching, chunking and
  sequence ids, staged as blobs.
"""
