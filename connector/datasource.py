"""The Spark data source ``filepulsar`` (PySpark 4.3 Python Data Source API).

Reading lives in :mod:`filepulsar.connector.source.batch`, writing in
:mod:`filepulsar.connector.sink.writers`; this class only hands Spark the right object. Spark
pickles the data source to executors, so it holds nothing but its options.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType


class FilePulsarDataSource(DataSource):
    """``format("filepulsar")``: Pulsar topics stored as ledger files under a root path."""

    @classmethod
    def name(cls) -> str:
        """Called by Spark when the source is registered (``pyspark_filepulsar`` discovery or
        ``spark.dataSource.register``): the format name."""
        return "filepulsar"

    def schema(self) -> StructType:
        """Called on the driver (a planning Python worker) at ``load()`` when no
        ``.schema(...)`` is given: the declared schema. Fails on bad reading options."""
        # Runs at load() when no schema is given (a ``.schema(...)`` given instead is
        # checked by the readers): the columns option's columns, or every column (a typed
        # read's from the topics' latest schema version, fixed here). The reading
        # options are validated now, so a typo or a bad value fails here with the allowed
        # values named, not later when the query starts.
        from filepulsar.connector.source.options import SourceOptions

        return SourceOptions.parse(self.options, streaming=None).declared_schema()

    def reader(self, schema: StructType) -> Any:
        """Called on the driver once per ``spark.read`` DataFrame plan (see
        :class:`~filepulsar.connector.source.batch.FilePulsarBatchReader`)."""
        from filepulsar.connector.source.batch import FilePulsarBatchReader

        return FilePulsarBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> Any:
        """Called on the driver when a ``readStream`` query starts (the planner's reader), and
        in Python workers that only pickle a reader for the tasks' ``read`` (see
        :class:`~filepulsar.connector.source.stream.FilePulsarStreamReader`)."""
        from filepulsar.connector.source.stream import FilePulsarStreamReader

        return FilePulsarStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        """Called on the driver once per ``save()``; the writer is pickled to the tasks and
        to the commit (see :class:`~filepulsar.connector.sink.writers.FilePulsarBatchWriter`)."""
        from filepulsar.connector.sink.writers import FilePulsarBatchWriter

        return FilePulsarBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        """Called on the driver at ``start()``, before each micro-batch and in the Python
        worker of each commit/abort (see
        :class:`~filepulsar.connector.sink.writers.FilePulsarStreamWriter`)."""
        from filepulsar.connector.sink.writers import FilePulsarStreamWriter

        return FilePulsarStreamWriter(self.options, schema, overwrite)
