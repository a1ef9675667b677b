"""Typed values in Spark: a topic's schema as Spark columns and back.

* :mod:`filepulsar.connector.values.types` -- the Avro/JSON/STRING/BYTES schema to Spark and
  Arrow types (source) and a Spark struct to a topic's schema (sink);
* :mod:`filepulsar.connector.values.decode` -- stored values decoded into Arrow columns;
* :mod:`filepulsar.connector.values.encode` -- Arrow columns encoded into stored values.
"""
