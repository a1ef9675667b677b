"""Top-level module Spark discovers (it imports every ``pyspark_*`` module on the path and
registers its ``DefaultSource``), so ``format("filepulsar")`` works after ``pip install`` with no
``spark.dataSource.register`` call."""

from filepulsar.connector.datasource import FilePulsarDataSource as DefaultSource

__all__ = ["DefaultSource"]
