"""The ways in and out of filepulsar: the Spark data source ``filepulsar`` and the Python client.

Both arrive with their issues (Spark source/sink, Python client); the storage layer they use is
in ``storage``.
"""
