"""``filepulsar.admin``: the admin API (pulsar-admin's groups in Python); it lives in
:mod:`filepulsar.connector.admin`. ``from filepulsar.admin import Admin``."""

from filepulsar.connector.admin import Admin, Namespaces, Schemas, Tenants, Topics
from filepulsar.connector.units import UnitError, parse_size, parse_time

__all__ = [
    "Admin",
    "Namespaces",
    "Schemas",
    "Tenants",
    "Topics",
    "UnitError",
    "parse_size",
    "parse_time",
]
