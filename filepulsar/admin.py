"""``filepulsar.admin``: the admin API (pulsar-admin's groups in Python); it lives in
:mod:`filepulsar.connector.admin` (the groups in ``connector/admin_*.py``).
``from filepulsar.admin import Admin``."""

from filepulsar.connector.admin import Admin
from filepulsar.connector.admin_namespaces import Namespaces, Tenants
from filepulsar.connector.admin_schemas import Schemas
from filepulsar.connector.admin_topics import Topics
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
