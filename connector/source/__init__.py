"""The Spark source, one concept to a module (the batch reader and :func:`backlog_of` are in
:mod:`filepulsar.connector.source.batch`, whose module docstring maps the rest).

This package's face is the public path: ``from filepulsar.connector.source import backlog_of``
(docs/spark-source.md), and the two reader classes with their parsed options.
"""

from filepulsar.connector.source.batch import (
    FilePulsarBatchReader,
    FilePulsarStreamReader,
    SourceOptions,
    backlog_of,
)

__all__ = ["FilePulsarBatchReader", "FilePulsarStreamReader", "SourceOptions", "backlog_of"]
