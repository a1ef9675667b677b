"""The dispatch operators under their first public path, ``filepulsar.dispatch.spark_ops``
(older scripts import them from here); they live in :mod:`filepulsar.dispatch.spark`, whose
``__all__`` is this module's. This is the one module outside ``dispatch/spark/`` that imports
PySpark, and it holds no code."""

from filepulsar.dispatch.spark import *  # noqa: F403
from filepulsar.dispatch.spark import __all__ as __all__
