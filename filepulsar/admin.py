"""``filepulsar.admin``: the admin API (pulsar-admin's groups in Python); it lives in
:mod:`filepulsar.connector.admin` (the groups in ``connector/admin/``).
``from filepulsar.admin import Admin``."""

from filepulsar.connector.admin import Admin
from filepulsar.connector.admin.namespaces import Namespaces, Tenants
from filepulsar.connector.admin.schemas import Schemas
from filepulsar.connector.admin.topics import Topics
from filepulsar.connector.admin.units import UnitError, parse_size, parse_time

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
