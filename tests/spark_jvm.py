"""The JVM option of the Spark processes the tests start themselves: jobs run by Python or by
spark-submit, a standalone cluster's daemons and executors.

Such a JVM lives for one test and runs little data, and HotSpot's optimising compiler (C2)
spends much of its CPU compiling code it will not run for long. ``-XX:TieredStopAtLevel=1``
keeps the quick compiler (C1) alone: the log-level job of tests/test_pipelines.py (Python
running ``jobs/orders_pipeline.py``, 20 orders) took 0.62x and 0.66x the CPU time of its
process tree in two A/B pairs (load average ~20). Speed only: no test checks anything that
depends on the compiler. (The session-wide ``spark`` fixture keeps the default: its JVM runs
the whole Spark tier.)
"""

from __future__ import annotations

JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
"""For a Spark JVM a test starts (a driver, an executor, a cluster daemon)."""

DRIVER_FLAGS = ["--driver-java-options", JAVA_OPTIONS]
"""spark-submit's flags for its driver JVM (the process spark-submit runs)."""

EXECUTOR_FLAGS = ["--conf", f"spark.executor.extraJavaOptions={JAVA_OPTIONS}"]
"""spark-submit's flags for the executors a cluster starts for the application."""


def submit_args(*flags: str) -> str:
    """``PYSPARK_SUBMIT_ARGS`` for a Python process that starts its own Spark JVM (a job run
    by Python, the demo, a notebook kernel): spark-submit ``flags``, then the driver's JVM
    option."""
    return " ".join([*flags, *DRIVER_FLAGS, "pyspark-shell"])
